"""The bytes of an archived message as its producer published them, whatever its content_encoding (py-amqp hands
the walk a body decoded with it)."""

from __future__ import annotations

import contextlib

import amqp
import pytest

from celery_event_operator.adapters.archive.operations import _body


@pytest.mark.parametrize(
    ("published", "encoding"),
    [
        pytest.param(b'{"a": 1}', None, id="no-encoding"),
        pytest.param('{"a": "é"}'.encode(), "utf-8", id="utf-8"),
        # re-encoded as UTF-8, a replay published other bytes than the producer's under its encoding
        pytest.param('{"a": "é"}'.encode("utf-16"), "utf-16", id="utf-16"),
        # decoded to a lone surrogate: UnicodeEncodeError stopped every list, replay and purge at the message
        pytest.param(b"\\ud800", "unicode_escape", id="decoded-to-a-lone-surrogate"),
        pytest.param(b"\xff\xfe", "no-such-codec", id="unknown-encoding"),
    ],
)
def test_the_body_is_the_published_bytes(published: bytes, encoding: str | None) -> None:
    message = amqp.Message(published, **({"content_encoding": encoding} if encoding else {}))
    if encoding:
        with contextlib.suppress(LookupError):  # what py-amqp's channel does on delivery (auto_decode)
            message.body = published.decode(encoding)
    assert _body(message) == published


def test_a_body_its_codec_cannot_encode_back_is_read_all_the_same() -> None:
    message = amqp.Message(b"m\x1b\x9f", content_encoding="iso2022_jp_1")
    message.body = b"m\x1b\x9f".decode("iso2022_jp_1")  # decodes; encoding it back raises UnicodeEncodeError
    assert _body(message) == "m\x1b\x9f".encode()
