from __future__ import annotations

import pytest

from celery_event_operator.broker import urls


@pytest.mark.parametrize(("raw", "override", "expected_urls", "vhost"), [
    pytest.param("amqp://u:p@h:5672/", None, ("amqp://u:p@h:5672/%2F",), "/", id="default-vhost"),
    pytest.param("amqp://u:p@h/shop", None, ("amqp://u:p@h/shop",), "shop", id="url-vhost"),
    pytest.param("amqp://u:p@h/%2Fshop", None, ("amqp://u:p@h/%2Fshop",), "/shop", id="encoded-vhost"),
    pytest.param("amqp://u:p@h1/a; amqp://u:p@h2/a", None, ("amqp://u:p@h1/a", "amqp://u:p@h2/a"), "a",
                 id="failover-list"),
    pytest.param("amqp://u:p@h1/a;amqp://u:p@h2/b", "c", ("amqp://u:p@h1/c", "amqp://u:p@h2/c"), "c",
                 id="override-unifies-vhosts"),
])
def test_parse(raw: str, override: str | None, expected_urls: tuple[str, ...], vhost: str) -> None:
    address = urls.parse(raw, failover_strategy="round-robin", vhost_override=override)
    assert address.urls == expected_urls
    assert address.vhost == vhost


@pytest.mark.parametrize(("raw", "problem"), [
    pytest.param("", "no URL", id="empty"),
    pytest.param("redis://u:secret@h/0", "not an amqp", id="wrong-scheme"),
    pytest.param("amqp://u:secret@h1/a;amqp://u:secret@h2/b", "different vhosts", id="ambiguous-vhost"),
])
def test_parse_rejects_without_echoing_secrets(raw: str, problem: str) -> None:
    with pytest.raises(urls.BrokerUrlError, match=problem) as error:
        urls.parse(raw, failover_strategy="shuffle", vhost_override=None)
    assert "secret" not in str(error.value)


def test_display_key_and_redaction_keep_credentials_out() -> None:
    address = urls.parse("amqp://user:s3cr%40t@h1:5673/a;amqps://user:s3cr%40t@h2/a",
                         failover_strategy="round-robin", vhost_override=None)
    assert address.display == "h1:5673, h2:5671 vhost 'a'"
    assert "s3cr" not in address.key
    text = f"failed: {address.urls[0]} said s3cr@t and s3cr%40t"
    assert "s3cr" not in urls.redact(text, address)
    other = urls.parse("amqp://user:other@h1:5673/a", failover_strategy="round-robin", vhost_override=None)
    assert other.key != address.key
