"""A publisher faster than the consumers it feeds, for the benchmarks: every publish pre-framed, written to a
py-amqp connection's socket in large chunks (a py-amqp publisher spends more time per message than the
operator's consumer, so a benchmark fed by one measures the publisher)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterable
from typing import Any

from kombu.connection import Connection

from celery_event_operator.core.monitoring import frames

BASIC_PUBLISH = (60, 40)
CONTENT_TYPE = b"application/json"
CHUNK_MESSAGES = 500


def publish_frames(channel: int, exchange: str, body: bytes, routing_key: str = "task.event") -> bytes:
    """basic.publish, its content header (content type only) and the body, ready for the socket."""
    header = struct.pack(">HHQH", 60, 0, len(body), 0x8000) + bytes([len(CONTENT_TYPE)]) + CONTENT_TYPE
    return (
        frames.method_frame(channel, BASIC_PUBLISH, "Bssbb", (0, exchange, routing_key, False, False))
        + struct.pack(">BHI", frames.HEADER, channel, len(header))
        + header
        + b"\xce"
        + struct.pack(">BHI", frames.BODY, channel, len(body))
        + body
        + b"\xce"
    )


def publish_all(
    url: str, messages: Iterable[tuple[str, bytes]], ready: Any = None, routing_key: str = "task.event"
) -> None:
    """Publish (exchange, body) pairs at full speed: all framed first, then written once `ready` is set."""
    with Connection(url) as connection:
        client = connection.connection  # py-amqp's: logs in and opens the channel
        channel = client.channel()
        framed = [publish_frames(channel.channel_id, exchange, body, routing_key) for exchange, body in messages]
        chunks = [b"".join(framed[i : i + CHUNK_MESSAGES]) for i in range(0, len(framed), CHUNK_MESSAGES)]
        # RabbitMQ's flow control may hold a fast publisher's socket for a while: wait, never time out (py-amqp's
        # TCP_USER_TIMEOUT of 1 s would make the kernel drop the connection while the broker does not read).
        client.transport.sock.settimeout(None)
        client.transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 0)
        if ready is not None:
            ready.wait()
        for chunk in chunks:
            client.transport.write(chunk)
    # Closing waits for the broker's close-ok, which comes after every publish before it.
