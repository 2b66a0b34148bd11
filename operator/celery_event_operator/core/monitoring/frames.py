"""AMQP 0-9-1 framing for the events consumer (pure: bytes in, bytes out, no I/O).

The consumer reads its deliveries frame by frame instead of through py-amqp, whose per-message
work (a Message object, properties decoded, a callback chain) costs more than the metrics
themselves. Method arguments are encoded and decoded with py-amqp's serialization; only the frame
layer, the part paid per event, is ours.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from amqp import serialization
from amqp.exceptions import AMQPError

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_MAX = 131_072  # ours (RabbitMQ's default), header and end included; bounds the bytes held for one frame
FRAME_MIN = 4096  # AMQP's frame-min-size: no peer may agree on less
FRAME_OVERHEAD = 8  # a frame's header (7 bytes) and end octet

METHOD, HEADER, BODY, HEARTBEAT = 1, 2, 3, 8
FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
_METHOD_ID = struct.Struct(">HH")
_BODY_SIZE = struct.Struct(">Q")  # after the content header's class id and weight

MethodId = tuple[int, int]
CONNECTION_START, CONNECTION_START_OK = (10, 10), (10, 11)
CONNECTION_TUNE, CONNECTION_TUNE_OK = (10, 30), (10, 31)
CONNECTION_OPEN, CONNECTION_OPEN_OK = (10, 40), (10, 41)
CONNECTION_CLOSE, CONNECTION_CLOSE_OK = (10, 50), (10, 51)
CONNECTION_BLOCKED, CONNECTION_UNBLOCKED = (10, 60), (10, 61)
CHANNEL_OPEN, CHANNEL_OPEN_OK = (20, 10), (20, 11)
CHANNEL_CLOSE, CHANNEL_CLOSE_OK = (20, 40), (20, 41)
EXCHANGE_DECLARE, EXCHANGE_DECLARE_OK = (40, 10), (40, 11)
QUEUE_DECLARE, QUEUE_DECLARE_OK = (50, 10), (50, 11)
QUEUE_BIND, QUEUE_BIND_OK = (50, 20), (50, 21)
BASIC_QOS, BASIC_QOS_OK = (60, 10), (60, 11)
BASIC_CONSUME, BASIC_CONSUME_OK = (60, 20), (60, 21)
BASIC_CANCEL, BASIC_CANCEL_OK = (60, 30), (60, 31)
BASIC_DELIVER = (60, 60)
_DELIVER_PREFIX = _METHOD_ID.pack(*BASIC_DELIVER)

# Argument signatures (py-amqp's serialization letters) of the methods we receive and read.
RECEIVED_SIGNATURES: dict[MethodId, str] = {
    CONNECTION_START: "ooFSS",
    CONNECTION_TUNE: "BlB",
    CONNECTION_CLOSE: "BsBB",
    CHANNEL_CLOSE: "BsBB",
    QUEUE_DECLARE_OK: "sll",
    BASIC_CONSUME_OK: "s",
    BASIC_CANCEL: "sb",
}


class FramingError(Exception):
    """The byte stream is not AMQP 0-9-1 framing: the connection cannot be trusted any further."""


def negotiated(ours: int, theirs: int) -> int:
    """A limit of connection.tune (frame_max, channel_max) as both peers agree on it: the lower, 0 meaning none."""
    return min(ours, theirs) if ours and theirs else ours or theirs


def agreed_limits(channel_max: int, frame_max: int, *, channels: int) -> tuple[int, int]:
    """(channel_max, frame_max) to answer the broker's connection.tune with, wanting `channels` channels and frames of
    FRAME_MAX bytes: a broker whose limits are below ours refuses a tune-ok above them (it closes the connection)."""
    agreed = negotiated(FRAME_MAX, frame_max)
    if agreed < FRAME_MIN:
        raise FramingError(f"the broker's frame_max ({agreed}) is below AMQP's minimum ({FRAME_MIN})")
    return negotiated(channels, channel_max), agreed


def method_frame(channel: int, method: MethodId, signature: str = "", arguments: Sequence[Any] = ()) -> bytes:
    payload = _METHOD_ID.pack(*method) + (serialization.dumps(signature, list(arguments)) if signature else b"")
    return _FRAME_HEAD.pack(METHOD, channel, len(payload)) + payload + bytes((FRAME_END,))


def heartbeat_frame() -> bytes:
    return _FRAME_HEAD.pack(HEARTBEAT, 0, 0) + bytes((FRAME_END,))


def method_arguments(method: MethodId, payload: bytes) -> list[Any]:
    """The arguments of a received method whose signature we know (after the 4-byte method id)."""
    try:
        values, _ = serialization.loads(RECEIVED_SIGNATURES[method], payload, 4)
    # TypeError: a bit past the end. A table's timestamp beyond year 9999 raises ValueError, OverflowError or OSError
    # (datetime), one nested some 900 levels deep RecursionError (py-amqp decodes tables by recursion).
    except (struct.error, IndexError, ValueError, TypeError, OverflowError, OSError, RecursionError, AMQPError) as exc:
        raise FramingError(f"method {method} with arguments that do not decode") from exc
    return list(values)


class Route(Protocol):
    """Where the deliveries of one consumer tag go."""

    def on_body(self, body: bytes) -> None: ...

    def on_oversized(self, head: bytes, tail: bytes, size: int) -> None: ...


class _Discard:
    """Deliveries of a consumer tag no longer (or not yet) routed: read past, dropped."""

    def on_body(self, body: bytes) -> None:
        pass

    def on_oversized(self, head: bytes, tail: bytes, size: int) -> None:
        pass


_DISCARD = _Discard()


class DeliveryReader:
    """Turns the bytes a consuming connection receives into message bodies and other methods.

    Frames are at most `frame_max` bytes (the negotiated one, once the broker's tune was answered).
    Deliveries (basic.deliver, content header, body frames) go to the Route of their consumer tag in
    `routes` (a mapping the caller keeps current; unknown tags are read past and dropped): the body as
    bytes to `on_body`; a body larger than `max_body_bytes` is not assembled — only its first and last
    `kept_bytes` are kept, for `on_oversized`, so memory stays bounded. Every other method goes to
    `on_method` with its channel, id and payload. Deliveries of one channel never interleave (AMQP), and
    a consuming connection receives content on one channel only.
    """

    def __init__(
        self,
        routes: Mapping[bytes, Route],
        on_method: Callable[[int, MethodId, bytes], object],
        max_body_bytes: int,
        kept_bytes: int = 32 * 1024,
    ) -> None:
        self._routes = routes
        self._on_method = on_method
        self._max_body_bytes = max_body_bytes
        self.frame_max = FRAME_MAX
        self._kept_bytes = kept_bytes
        self._pending = b""
        self._route: Route = _DISCARD  # the current delivery's
        self._on_body: Callable[[bytes], None] = _DISCARD.on_body
        self._body_size = 0
        self._body_left = 0  # bytes of the current message's body still to come
        self._parts: list[bytes] = []  # a body split over several frames
        self._skipping = False  # the current body is oversized: only its head and tail are kept
        self._head = b""
        self._tail = b""

    def feed(self, data: bytes) -> None:
        buffer = self._pending + data if self._pending else data
        end, position = len(buffer), 0
        read_head = _FRAME_HEAD.unpack_from
        while end - position >= 7:
            kind, channel, size = read_head(buffer, position)
            if size > self.frame_max - FRAME_OVERHEAD:
                raise FramingError(
                    f"a frame of {size + FRAME_OVERHEAD} bytes announced; the negotiated maximum is {self.frame_max}"
                )
            start = position + 7
            frame_end = start + size
            if frame_end >= end:
                break  # the frame is not complete yet
            if buffer[frame_end] != FRAME_END:
                raise FramingError("a frame does not end with the frame-end octet")
            if kind == BODY:
                if size and size == self._body_left and not self._parts and not self._skipping:
                    self._body_left = 0
                    self._on_body(buffer[start:frame_end])  # the usual case: the whole body in one frame
                else:
                    self._body_part(buffer[start:frame_end])
            elif kind == METHOD:
                if size < 4:
                    raise FramingError("a method frame too short for its class and method ids")
                if buffer[start : start + 4] == _DELIVER_PREFIX:
                    # basic.deliver: consumer-tag (a short string) first.
                    if size < 5 or size < 5 + buffer[start + 4]:
                        raise FramingError("a basic.deliver too short for its consumer tag")
                    self._route = self._routes.get(buffer[start + 5 : start + 5 + buffer[start + 4]], _DISCARD)
                    self._on_body = self._route.on_body
                else:
                    self._on_method(channel, _METHOD_ID.unpack_from(buffer, start), buffer[start:frame_end])
            elif kind == HEADER:
                if size < 12:
                    raise FramingError("a content header too short for its body size")
                self._content_header(_BODY_SIZE.unpack_from(buffer, start + 4)[0])
            elif kind != HEARTBEAT:
                raise FramingError(f"unknown frame type {kind}")
            position = frame_end + 1
        self._pending = buffer[position:]

    def _content_header(self, body_size: int) -> None:
        self._parts = []
        self._skipping = body_size > self._max_body_bytes
        self._body_size = self._body_left = body_size
        self._head = self._tail = b""
        if body_size == 0:
            self._on_body(b"")

    def _body_part(self, part: bytes) -> None:
        if len(part) > self._body_left or not self._body_left:  # an empty one too, once the body is complete
            raise FramingError("a body frame runs past the size its content header announced")
        self._body_left -= len(part)
        if self._skipping:
            kept = self._kept_bytes
            if len(self._head) < kept:
                self._head += part[: kept - len(self._head)]
            self._tail = (self._tail + part)[-kept:]
        else:
            self._parts.append(part)
        if self._body_left == 0:
            if self._skipping:
                self._route.on_oversized(self._head, self._tail, self._body_size)
            else:
                self._on_body(b"".join(self._parts))
            self._parts, self._skipping, self._head, self._tail = [], False, b"", b""
