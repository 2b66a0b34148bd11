"""One AMQP connection per broker, shared by every service on it, with backoff after failures.

kombu and py-amqp are not thread-safe: each broker's connection is used under its lock, by the
kopf handler threads one at a time. A failed connection is dropped, and the next attempt waits
for an exponential backoff, so a hundred services on a broker that is down cost one connection
attempt per backoff period, not a hundred connect timeouts per resync.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import amqp
import kombu.exceptions
from kombu.connection import Connection

from celery_event_operator.broker.urls import BrokerAddress, redact

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 5.0
OPERATION_TIMEOUT_SECONDS = 10.0
BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0
CONNECTION_NAME = "celery-event-operator"

# What a lost or refused connection raises (channel-level errors are the caller's business).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError, socket.timeout, amqp.exceptions.ConnectionError, amqp.exceptions.RecoverableConnectionError,
    kombu.exceptions.OperationalError,
)


class BrokerUnavailableError(Exception):
    """The broker cannot be reached now; the message is safe to show (no credentials)."""


class Broker:
    def __init__(self, address: BrokerAddress, clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address
        self._clock = clock
        self._lock = threading.Lock()
        self._connection: Connection | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""

    def _connect(self) -> Connection:
        connection = Connection(
            ";".join(self.address.urls),
            failover_strategy=self.address.failover_strategy,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            heartbeat=0,  # used in bursts by one thread: a dead connection shows on next use
            transport_options={"client_properties": {"connection_name": CONNECTION_NAME},
                               "read_timeout": OPERATION_TIMEOUT_SECONDS,
                               "write_timeout": OPERATION_TIMEOUT_SECONDS},
        )
        # One pass over the failover list per attempt (kombu moves to the next URL on each retry);
        # the backoff spaces the attempts.
        connection.ensure_connection(max_retries=len(self.address.urls) - 1, interval_start=0, interval_step=0)
        return connection

    def _drop(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):  # it is gone either way
                self._connection.release()
            self._connection = None

    def run(self, work: Callable[[Connection], T]) -> T:
        """Run `work` with the broker's connection; reconnect once if a kept connection went stale."""
        with self._lock:
            now = self._clock()
            if now < self._retry_at:
                raise BrokerUnavailableError(
                    f"{self._last_error}; next attempt in {self._retry_at - now:.0f}s")
            for attempt in (1, 2):
                fresh = self._connection is None
                try:
                    if self._connection is None:
                        try:
                            self._connection = self._connect()
                        except amqp.exceptions.AMQPError as exc:  # e.g. login refused, vhost not found
                            raise amqp.exceptions.ConnectionError(str(exc)) from exc
                    result = work(self._connection)
                except CONNECTION_ERRORS as exc:
                    self._drop()
                    if fresh or attempt == 2:
                        self._fail(exc)
                        raise BrokerUnavailableError(self._last_error) from None
                    continue  # the kept connection died since last use: one fresh try
                self._failures = 0
                self._retry_at = 0.0
                return result
            raise AssertionError("unreachable: the loop returns or raises")

    def _fail(self, exc: BaseException) -> None:
        self._failures += 1
        delay = min(BACKOFF_INITIAL_SECONDS * 2 ** (self._failures - 1), BACKOFF_MAX_SECONDS)
        self._retry_at = self._clock() + delay
        reason = redact(f"{type(exc).__name__}: {exc}", self.address)
        self._last_error = f"cannot reach the broker at {self.address.display}: {reason}"

    def close(self) -> None:
        with self._lock:
            self._drop()


class BrokerRegistry:
    """Brokers by address: services that share a broker share its connection."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._brokers: dict[str, Broker] = {}

    def get(self, address: BrokerAddress) -> Broker:
        with self._lock:
            broker = self._brokers.get(address.key)
            if broker is None:
                broker = self._brokers[address.key] = Broker(address)
            return broker

    def close_all(self) -> None:
        with self._lock:
            brokers, self._brokers = list(self._brokers.values()), {}
        for broker in brokers:
            broker.close()
