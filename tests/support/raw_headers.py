"""A producer of header values py-amqp's encoder cannot write: a timestamp ('T') beyond Python's datetime, a table
nested deeper than py-amqp's decoder recurses.

py-amqp writes a 'T' only from a datetime (at most year 9999), but any AMQP client can send one of any 64-bit value,
and RabbitMQ routes it as it came (and a table nested 3,000 deep: measured on 4.3). So the content header is framed
here, the table's other entries by py-amqp.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

from amqp import serialization
from kombu.connection import Connection

from celery_event_operator.core.monitoring import frames

BASIC_PUBLISH = (60, 40)
# Python's datetime ends with year 9999: 253402300799 is its last second; py-amqp's decoder raises beyond it.
LAST_DATETIME_SECOND = 253_402_300_799
OUT_OF_RANGE = {
    "int64-max": 2**63 - 1,  # OSError (EOVERFLOW) from datetime.fromtimestamp on Linux
    "uint64-max": 2**64 - 1,  # OverflowError
    "year-10000": LAST_DATETIME_SECOND + 1,  # ValueError
}


def timestamp_item(key: str, seconds: int) -> bytes:
    """One table entry: `key` holding a 'T' of `seconds`."""
    name = key.encode()
    return bytes([len(name)]) + name + b"T" + struct.pack(">Q", seconds)


def nested_item(key: str, depth: int) -> bytes:
    """One table entry: `key` holding a table that holds a table ... `depth` tables in all, the innermost empty."""
    value = b"F" + struct.pack(">I", 0)
    for _ in range(depth - 1):
        value = b"F" + struct.pack(">I", 1 + len(value)) + b"\x00" + value  # an entry of an empty key
    name = key.encode()
    return bytes([len(name)]) + name + value


def headers_table(headers: Mapping[str, Any], timestamps: Mapping[str, int] | None = None, raw: bytes = b"") -> bytes:
    """An AMQP field table (its length first): `headers` as py-amqp writes them, then the raw timestamps, then `raw`
    entries."""
    written = serialization.dumps("F", [dict(headers)])[4:]
    items = written + b"".join(timestamp_item(key, seconds) for key, seconds in (timestamps or {}).items()) + raw
    return struct.pack(">I", len(items)) + items


def content_header(
    body_size: int, table: bytes, content_type: str = "application/json", content_encoding: str = "utf-8"
) -> bytes:
    """basic's content header: content type, encoding, the headers table and persistent delivery."""
    flags = 0x8000 | 0x4000 | 0x2000 | 0x1000
    properties = (
        bytes([len(content_type)])
        + content_type.encode()
        + bytes([len(content_encoding)])
        + content_encoding.encode()
        + table
        + b"\x02"
    )
    return struct.pack(">HHQH", 60, 0, body_size, flags) + properties


def publish(
    url: str,
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: Mapping[str, Any],
    timestamps: Mapping[str, int] | None = None,
    raw: bytes = b"",
    content_type: str = "application/json",
) -> None:
    """Publish one message with these headers, raw timestamps and raw entries, and wait for the broker's confirm."""
    with Connection(url) as connection:
        client = connection.connection  # py-amqp's
        channel = client.channel()
        channel.confirm_select()
        confirmed: list[bool] = []
        channel.events["basic_ack"].add(lambda *_: confirmed.append(True))
        channel.events["basic_nack"].add(lambda *_: confirmed.append(False))
        header = content_header(len(body), headers_table(headers, timestamps, raw), content_type)
        client.transport.write(
            frames.method_frame(channel.channel_id, BASIC_PUBLISH, "Bssbb", (0, exchange, routing_key, False, False))
            + struct.pack(">BHI", frames.HEADER, channel.channel_id, len(header))
            + header
            + b"\xce"
            + struct.pack(">BHI", frames.BODY, channel.channel_id, len(body))
            + body
            + b"\xce"
        )
        while not confirmed:
            client.drain_events(timeout=10)
        assert confirmed == [True], "the broker refused the message (negative confirm)"


def task_message(task: str, task_id: str, args: list[Any]) -> tuple[bytes, dict[str, Any]]:
    """A Celery protocol-2 task message (body, headers) as any Celery producer sends it."""
    headers = {
        "lang": "py",
        "task": task,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "retries": 0,
        "argsrepr": repr(tuple(args)),
        "kwargsrepr": "{}",
    }
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([args, {}, embed]).encode(), headers
