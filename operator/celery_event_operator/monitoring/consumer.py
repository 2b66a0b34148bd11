"""The consumer of one service's Celery events (I/O, a thread per service).

Its queue is the operator's own and part of the service's plan (topology/plan.py), bounded so that a
stopped operator leaves nothing growing on the broker. Events are taken without acknowledgement (metrics
tolerate losing the in-flight ones when the operator dies; acks would halve the throughput). The
connection speaks AMQP over its own socket (frames.py): the event path is the hot path.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import socket
import ssl
import threading
import time
import urllib.parse
from typing import Any

from celery_event_operator import naming
from celery_event_operator.broker.connections import CONNECT_TIMEOUT_SECONDS
from celery_event_operator.broker.urls import BrokerAddress, redact
from celery_event_operator.monitoring import frames
from celery_event_operator.monitoring.state import MAX_EVENT_BYTES, ServiceMetrics
from celery_event_operator.topology import plan

PREFETCH = 5000
BACKOFF_MAX_SECONDS = 60.0
HEARTBEAT_SECONDS = 30  # asked of the broker; a silent broker is given up after two of them
POLL_SECONDS = 1.0  # how soon a stop request is seen
RECEIVE_BYTES = 256 * 1024
CHANNEL = 1
CLIENT_CAPABILITIES = {"consumer_cancel_notify": True, "authentication_failure_close": True,
                       "connection.blocked": True}


class BrokerClosedError(Exception):
    """The broker closed the connection or channel, or cancelled the consumer (its reason, never credentials)."""


class _Session:
    """One consuming connection: the socket, the reader of its frames and the methods it received."""

    def __init__(self, sock: socket.socket, metrics: ServiceMetrics) -> None:
        self.sock = sock
        self.methods: collections.deque[tuple[frames.MethodId, bytes]] = collections.deque()
        ingest, clock = metrics.ingest_message, time.monotonic
        self.reader = frames.DeliveryReader(on_body=lambda body: ingest(body, clock()),
                                            on_method=lambda _channel, method, payload:
                                            self.methods.append((method, payload)),
                                            on_oversized=metrics.count_malformed, max_body_bytes=MAX_EVENT_BYTES)

    def send(self, method: frames.MethodId, signature: str = "", arguments: tuple[Any, ...] = (),
             channel: int = CHANNEL) -> None:
        self.sock.sendall(frames.method_frame(channel, method, signature, arguments))

    def receive(self) -> bool:
        """Read what has arrived (False when nothing came within the socket's timeout)."""
        try:
            data = self.sock.recv(RECEIVE_BYTES)
        except TimeoutError:
            return False
        if not data:
            raise ConnectionError("the broker closed the connection")
        self.reader.feed(data)
        return True

    def expect(self, wanted: frames.MethodId) -> bytes:
        """The payload of the next method, which must be `wanted` (during set-up, before any delivery)."""
        while not self.methods:
            if not self.receive():
                raise TimeoutError(f"no answer from the broker to method {wanted} within {CONNECT_TIMEOUT_SECONDS}s")
        method, payload = self.methods.popleft()
        self.raise_if_closing(method, payload)
        if method != wanted:
            raise frames.FramingError(f"expected method {wanted}, got {method}")
        return payload

    def raise_if_closing(self, method: frames.MethodId, payload: bytes) -> None:
        if method in (frames.CONNECTION_CLOSE, frames.CHANNEL_CLOSE):
            code, text, *_ = frames.method_arguments(method, payload)
            if method == frames.CONNECTION_CLOSE:
                with contextlib.suppress(OSError):  # polite, not needed: the connection is over either way
                    self.send(frames.CONNECTION_CLOSE_OK, channel=0)
            raise BrokerClosedError(f"the broker closed the {'connection' if method[0] == 10 else 'channel'}: "
                                    f"{code} {text}")
        if method == frames.BASIC_CANCEL:
            raise BrokerClosedError("the broker cancelled the consumer (its queue was deleted?)")


def _tls_context() -> ssl.SSLContext:
    # As kombu/py-amqp do for amqps:// (the topology applier's connection): the certificate chain is
    # verified against the system's CAs, the host name is not.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    return context


def _connect(url: str, vhost: str, service: str, metrics: ServiceMetrics) -> tuple[_Session, int]:
    """Log in, open the channel; returns the session and the heartbeat agreed with the broker."""
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme == "amqps"
    host = parts.hostname or "localhost"
    sock = socket.create_connection((host, parts.port or (5671 if tls else 5672)), timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls:
            sock = _tls_context().wrap_socket(sock, server_hostname=host)
        session = _Session(sock, metrics)
        sock.sendall(frames.PROTOCOL_HEADER)
        session.expect(frames.CONNECTION_START)
        user = urllib.parse.unquote(parts.username) if parts.username is not None else "guest"
        password = urllib.parse.unquote(parts.password) if parts.password is not None else "guest"
        properties = {"product": "celery-event-operator", "capabilities": CLIENT_CAPABILITIES,
                      "connection_name": f"celery-event-operator {service} events"}
        session.send(frames.CONNECTION_START_OK, "FsSs",
                     (properties, "PLAIN", f"\0{user}\0{password}".encode(), "en_US"), channel=0)
        _, _, broker_heartbeat = frames.method_arguments(frames.CONNECTION_TUNE, session.expect(frames.CONNECTION_TUNE))
        heartbeat = min(broker_heartbeat, HEARTBEAT_SECONDS) or HEARTBEAT_SECONDS
        session.send(frames.CONNECTION_TUNE_OK, "BlB", (CHANNEL, frames.FRAME_MAX, heartbeat), channel=0)
        session.send(frames.CONNECTION_OPEN, "ssb", (vhost, "", False), channel=0)
        session.expect(frames.CONNECTION_OPEN_OK)
        session.send(frames.CHANNEL_OPEN, "s", ("",))
        session.expect(frames.CHANNEL_OPEN_OK)
    except BaseException:
        sock.close()
        raise
    return session, heartbeat


def _declare_and_consume(session: _Session, service: str) -> None:
    exchange, queue = naming.event_exchange_name(service), naming.monitor_queue_name(service)
    # Celery declares its event exchange the same way (a durable topic exchange).
    session.send(frames.EXCHANGE_DECLARE, "BssbbbbbF", (0, exchange, "topic", False, True, False, False, False, {}))
    session.expect(frames.EXCHANGE_DECLARE_OK)
    # As planned (topology/plan.py), so that the applier and the consumer agree on the arguments.
    session.send(frames.QUEUE_DECLARE, "BsbbbbbF",
                 (0, queue, False, True, False, False, False, dict(plan.MONITOR_QUEUE_ARGUMENTS)))
    session.expect(frames.QUEUE_DECLARE_OK)
    session.send(frames.QUEUE_BIND, "BsssbF", (0, queue, exchange, "#", False, {}))
    session.expect(frames.QUEUE_BIND_OK)
    session.send(frames.BASIC_QOS, "lBb", (0, PREFETCH, False))
    session.expect(frames.BASIC_QOS_OK)
    session.send(frames.BASIC_CONSUME, "BssbbbbF", (0, queue, "", False, True, False, False, {}))
    session.expect(frames.BASIC_CONSUME_OK)


def _connect_any(address: BrokerAddress, service: str, metrics: ServiceMetrics) -> tuple[_Session, int]:
    """One pass over the failover list; the last URL's failure is the one raised."""
    candidates = list(address.urls)
    if address.failover_strategy == "shuffle":
        random.shuffle(candidates)
    for url in candidates[:-1]:
        with contextlib.suppress(OSError, frames.FramingError, BrokerClosedError):
            return _connect(url, address.vhost, service, metrics)
    return _connect(candidates[-1], address.vhost, service, metrics)


def _consume_once(address: BrokerAddress, service: str, metrics: ServiceMetrics, stop: threading.Event,
                  on_ready: Any) -> None:
    session, heartbeat = _connect_any(address, service, metrics)
    try:
        _declare_and_consume(session, service)
        on_ready()
        session.sock.settimeout(POLL_SECONDS)
        last_received = last_sent = time.monotonic()
        while not stop.is_set():
            received = session.receive()
            now = time.monotonic()
            if received:
                last_received = now
            elif now - last_received > 2 * heartbeat:
                raise TimeoutError(f"nothing from the broker for {2 * heartbeat}s, not even a heartbeat")
            while session.methods:  # anything but deliveries: the broker closing, cancelling, blocking
                session.raise_if_closing(*session.methods.popleft())
            if now - last_sent >= heartbeat / 2:  # a consumer without acks sends nothing else
                session.sock.sendall(frames.heartbeat_frame())
                last_sent = now
    finally:
        with contextlib.suppress(OSError):
            session.send(frames.CONNECTION_CLOSE, "BsBB", (200, "operator stopping", 0, 0), channel=0)
        session.sock.close()


def consume(address: BrokerAddress, service: str, metrics: ServiceMetrics, stop: threading.Event,
            logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Consume until `stop` is set, reconnecting with exponential backoff after failures."""
    backoff = 1.0

    def ready() -> None:
        nonlocal backoff
        backoff = 1.0
        logger.info("consuming the Celery events of %r from %s", service, address.display)

    while not stop.is_set():
        try:
            _consume_once(address, service, metrics, stop, ready)
        except (OSError, frames.FramingError, BrokerClosedError) as exc:
            logger.warning("events of %r: %s; reconnecting in %.0fs", service,
                           redact(f"{type(exc).__name__}: {exc}", address), backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
