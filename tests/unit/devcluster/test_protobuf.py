"""Decoding kubectl's protobuf bodies (the kubectl path itself: tests/integration/devcluster/test_emulator.py)."""

from __future__ import annotations

import pytest

from celery_event_devcluster import protobuf


def field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def entry(key: str, value: bytes) -> bytes:
    return field(1, key.encode()) + field(2, value)


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version.encode()) + field(2, kind.encode())
    return protobuf.MAGIC + field(1, type_meta) + field(2, raw)


def test_a_configmap_with_labels_and_binary_data() -> None:
    meta = field(1, b"c1") + field(11, entry("app", b"billing")) + field(8, b"")
    raw = field(1, meta) + field(2, entry("k", b"v")) + field(3, entry("b", b"\xff\x00"))
    assert protobuf.decode(envelope("v1", "ConfigMap", raw)) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c1", "labels": {"app": "billing"}},
        "data": {"k": "v"},
        "binaryData": {"b": "/wA="},
    }


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"kind": "Secret"}', "no Kubernetes protobuf envelope"),
        (envelope("v1", "ServiceAccount", b""), "v1/ServiceAccount is not decoded here"),
        (envelope("v1", "Secret", field(1, field(13, b""))), "field 13 of ObjectMeta"),
        (envelope("v1", "Secret", b"\x0a\x05ab"), "truncated field"),
        (envelope("v1", "Secret", b"\x0d\x00\x00\x00\x00"), "wire type 5"),
    ],
)
def test_anything_else_is_refused(body: bytes, why: str) -> None:
    with pytest.raises(protobuf.UnknownProtobufError, match=why):
        protobuf.decode(body)
