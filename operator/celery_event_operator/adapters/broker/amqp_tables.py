"""py-amqp's decoding of AMQP field tables, made total for what any producer can put in a message's headers.

py-amqp (5.4) decodes a table's timestamp ('T') with `datetime.fromtimestamp`, which raises for any value after
9999-12-31 (ValueError up to the platform's time_t, OSError or OverflowError beyond), and decodes nested tables and
arrays by recursion, which raises RecursionError for a header nested deeper than Python's recursion limit (about
1,000 levels of 6 bytes). Any AMQP client can send either, and RabbitMQ routes them as they came (measured: 2**63 - 1,
and 3,000 levels). The exception comes out of py-amqp's frame handler, mid-delivery, so no caller can pass over the
message: measured on RabbitMQ 4.3 with a timestamp of 2**63 - 1, a Celery worker took it for a lost connection and
reconnected about five times a second, the message delivered first again each time — for ever on a classic queue (no
message behind it ran; one prefork worker exited after 17 s, RESOURCE_LOCKED on its own pidbox queue as it
reconnected), until the delivery limit dead-lettered it into the archive on a quorum queue; and every archive list
and replay stopped at it ("cannot reach the broker"), a replay leaving a copy of what came before it replayed and
still archived.

`install()` wraps two functions of `amqp.serialization`, which py-amqp looks up by name on every call (`loads`
decodes each table entry through `_read_item`, which recurses through itself; `_write_table` and `_write_array`
encode through `_write_item`), so the wrappers reach every table py-amqp reads or writes — message headers,
x-death records, server properties — and nothing else:

- a timestamp beyond datetime's range decodes as an OutOfRangeTimestamp (an int: its seconds as sent) and encodes
  back as the same timestamp, so a retried, archived or replayed copy carries the header's bytes unchanged;
- a table or an array nested deeper than MAX_NESTING decodes as a NestedTooDeep (bytes: the value's encoding as
  sent), and encodes back as those bytes.

Every other value goes to py-amqp's own functions, unchanged. The runtime and the operator install it where they
decode with py-amqp (the worker's app, the archive walk, the control connection); tests/unit/broker/test_amqp_tables.py
checks py-amqp's own functions on the raw bytes, so an upgrade that fixes or changes them shows.

Why a patch: the values are decoded inside py-amqp's frame handler, before kombu, Celery or our code sees the
message, and the worker's connection is Celery's, made by kombu — no hook or argument reaches the decoder. A fix in
py-amqp cannot be shipped from here; a fork or a vendored copy of py-amqp would replace the whole client for two
branches of one function; a transport of our own would be all of kombu's connection handling to keep. Wrapping two
module-level functions, delegating everything else, is the narrowest change that makes decoding total.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

from amqp import serialization

TIMESTAMP, TABLE, ARRAY = ord("T"), ord("F"), ord("A")
# Deeper than RabbitMQ's own records (headers > x-death array > its tables) and than any header a library writes;
# far from the recursion limit, also for what Celery and kombu do with the headers afterwards.
MAX_NESTING = 32
_SECONDS = struct.Struct(">Q")
_SIZE = struct.Struct(">I")

ReadItem = Callable[[Any, int], tuple[Any, int]]
WriteItem = Callable[[Any, Callable[[bytes], Any], Any], None]

# py-amqp's own functions, as imported (before any install).
PY_AMQP_READ_ITEM: ReadItem = serialization._read_item
PY_AMQP_WRITE_ITEM: WriteItem = serialization._write_item


class OutOfRangeTimestamp(int):
    """An AMQP timestamp after 9999-12-31, which Python's datetime cannot hold: its seconds since the epoch."""

    def __new__(cls, seconds: int) -> OutOfRangeTimestamp:
        if not 0 <= seconds < 2**64:
            raise ValueError(f"an AMQP timestamp is an unsigned 64-bit number, not {seconds}")
        return super().__new__(cls, seconds)

    def __repr__(self) -> str:
        return f"OutOfRangeTimestamp({int(self)})"


class NestedTooDeep(bytes):
    """A table or an array nested deeper than MAX_NESTING: its encoding as sent (type, size and content)."""

    def __repr__(self) -> str:
        return f"NestedTooDeep(<{len(self)} bytes>)"


_nesting = threading.local()  # py-amqp decodes on several threads (a connection each); a decoding never yields


def read_item(buf: Any, offset: int) -> tuple[Any, int]:
    """py-amqp's `_read_item`, which never raises for a timestamp's value or for a value's nesting."""
    kind = buf[offset]
    if kind == TIMESTAMP:
        try:
            return PY_AMQP_READ_ITEM(buf, offset)
        except (ValueError, OverflowError, OSError):  # struct.error (a cut frame) is none of them: it goes on
            (seconds,) = _SECONDS.unpack_from(buf, offset + 1)
            return OutOfRangeTimestamp(seconds), offset + 1 + _SECONDS.size
    if kind not in (TABLE, ARRAY):
        return PY_AMQP_READ_ITEM(buf, offset)
    depth: int = getattr(_nesting, "depth", 0)
    if depth >= MAX_NESTING:
        (size,) = _SIZE.unpack_from(buf, offset + 1)
        end = offset + 1 + _SIZE.size + size
        if end > len(buf):
            raise struct.error(f"a nested value of {size} bytes runs past the end of its frame")
        return NestedTooDeep(bytes(buf[offset:end])), end
    _nesting.depth = depth + 1
    try:
        return PY_AMQP_READ_ITEM(buf, offset)
    finally:
        _nesting.depth = depth


def write_item(value: Any, write: Callable[[bytes], Any], bits: Any) -> None:
    """py-amqp's `_write_item`, which writes back what `read_item` read as it was sent."""
    if isinstance(value, OutOfRangeTimestamp):
        write(b"T" + _SECONDS.pack(value))
    elif isinstance(value, NestedTooDeep):
        write(value)
    else:
        PY_AMQP_WRITE_ITEM(value, write, bits)


def install() -> None:
    """Make py-amqp's table decoding total in this process (idempotent)."""
    serialization._read_item = read_item
    serialization._write_item = write_item


def installed() -> bool:
    return serialization._read_item is read_item and serialization._write_item is write_item
