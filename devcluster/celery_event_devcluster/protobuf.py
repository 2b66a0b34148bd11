"""Kubernetes protobuf request bodies of the built-in types kubectl creates in dev mode (pure).

kubectl 1.32 sends built-in types as protobuf and does not fall back to JSON when refused, so
`kubectl create secret …` and `kubectl create configmap …` need these decoded. Only Secret and ConfigMap
are known (field numbers from k8s.io/api's generated.proto); anything else is UnknownProtobufError,
which the emulated API answers with 415 as a JSON-only server does.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"

# field number → (JSON name, kind); kind is a scalar kind, a map kind, or the name of a message below.
Schema = dict[int, tuple[str, str]]
OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    11: ("labels", "map[string]string"),
    12: ("annotations", "map[string]string"),
    14: ("finalizers", "[]string"),
}
# Fields a client sends empty or that the server sets anyway: selfLink, uid, resourceVersion, generation,
# creationTimestamp.
SERVER_SET_META = frozenset({4, 5, 6, 7, 8})
MESSAGES: dict[str, Schema] = {
    "ObjectMeta": OBJECT_META,
    "Secret": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map[string]bytes"),
        3: ("type", "string"),
        4: ("stringData", "map[string]string"),
        5: ("immutable", "bool"),
    },
    "ConfigMap": {
        1: ("metadata", "ObjectMeta"),
        2: ("data", "map[string]string"),
        3: ("binaryData", "map[string]bytes"),
        4: ("immutable", "bool"),
    },
}
KINDS = {("v1", "Secret"), ("v1", "ConfigMap")}


class UnknownProtobufError(ValueError):
    pass


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data):
            raise UnknownProtobufError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints, bytes for length-delimited fields."""
    position = 0
    while position < len(data):
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, position = _varint(data, position)
            yield number, value
        elif wire_type == 2:
            length, position = _varint(data, position)
            if position + length > len(data):
                raise UnknownProtobufError("truncated field")
            yield number, data[position : position + length]
            position += length
        else:
            raise UnknownProtobufError(f"wire type {wire_type} of field {number} is not used by these types")


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise UnknownProtobufError("a length-delimited field was expected")
    return value


def _text(value: int | bytes) -> str:
    try:
        return _bytes(value).decode()
    except UnicodeDecodeError:
        raise UnknownProtobufError("a string field is not UTF-8") from None


def _map_entry(value: int | bytes, value_kind: str) -> tuple[str, str]:
    entry = {number: item for number, item in _fields(_bytes(value))}
    raw = _bytes(entry.get(2, b""))
    shown = base64.b64encode(raw).decode() if value_kind == "bytes" else _text(raw)
    return _text(entry.get(1, b"")), shown


def message(data: bytes, name: str) -> dict[str, Any]:
    """One message as the JSON the API would have been sent."""
    schema = MESSAGES[name]
    decoded: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            if name == "ObjectMeta" and number in SERVER_SET_META:
                continue
            raise UnknownProtobufError(f"field {number} of {name} is not known here")
        key, kind = schema[number]
        if kind == "string":
            decoded[key] = _text(value)
        elif kind == "bool":
            decoded[key] = bool(value)
        elif kind == "[]string":
            decoded.setdefault(key, []).append(_text(value))
        elif kind.startswith("map[string]"):
            entry_key, entry_value = _map_entry(value, kind.removeprefix("map[string]"))
            decoded.setdefault(key, {})[entry_key] = entry_value
        else:
            decoded[key] = message(_bytes(value), kind)
    return decoded


def decode(body: bytes) -> dict[str, Any]:
    """A request body (`k8s\\0` + runtime.Unknown) as a JSON object; UnknownProtobufError otherwise."""
    if not body.startswith(MAGIC):
        raise UnknownProtobufError("no Kubernetes protobuf envelope")
    unknown = {number: value for number, value in _fields(body[len(MAGIC) :])}
    type_meta = {number: _text(value) for number, value in _fields(_bytes(unknown.get(1, b"")))}
    api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
    if (api_version, kind) not in KINDS:
        raise UnknownProtobufError(f"{api_version}/{kind} is not decoded here")
    if unknown.get(3) or unknown.get(4, b"application/vnd.kubernetes.protobuf") not in (
        b"",
        b"application/vnd.kubernetes.protobuf",
    ):
        raise UnknownProtobufError("an encoded or nested content type")
    return {"apiVersion": api_version, "kind": kind, **message(_bytes(unknown.get(2, b"")), kind)}
