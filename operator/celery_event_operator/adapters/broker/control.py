"""The control connection of one broker: declaring, repairing and inspecting topology (kombu / py-amqp).

kombu and py-amqp block and are not thread-safe, so each broker's control connection has a thread of its own (a
single-thread executor, not a shared pool): every service on that broker queues its work there (or on one of its
few extra lines, below) and the event loop never waits on a socket. A broker that hangs holds up only its own
services. A failed connection is dropped and the next attempt waits for an exponential backoff, so a hundred
services on a broker that is down cost one connection attempt per backoff period, not a hundred connect
timeouts.

While work queues up (a fleet's first declares: about 30 ms of RabbitMQ 4's time each, much of it waiting on
its metadata store), a connection may open a few more lines — a connection and a thread each, up to `lines` —
and the work goes to the least busy; a line that gets no work for LINE_IDLE_SECONDS closes. Only a connected
first line lends work to others, and an extra line that cannot connect (a user's or vhost's connection limit, a
broker going down) hands its work back to the first and stops the lending for LEND_PAUSE_SECONDS: the first
line alone decides the backoff, so a broker that is down still costs one attempt per backoff period.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import amqp
import kombu.exceptions
from kombu.connection import Connection

from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.adapters.broker.tls import TlsFiles, kombu_options
from celery_event_operator.core.broker.address import BrokerAddress, Endpoint
from celery_event_operator.core.broker.backoff import Backoff
from celery_event_operator.core.errors import BrokerUnavailableError, UnsupportedOperationError

T = TypeVar("T")

CONNECT_TIMEOUT_SECONDS = 5.0
OPERATION_TIMEOUT_SECONDS = 10.0
CONNECTION_NAME = "celery-event-operator"
LINE_IDLE_SECONDS = 10.0  # an extra line closes once no work came to it for this long
LEND_PAUSE_SECONDS = 60.0  # after an extra line failed to connect, none is opened for this long

# What a lost or refused connection raises (channel-level errors are the caller's business).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    socket.timeout,
    amqp.exceptions.ConnectionError,
    amqp.exceptions.RecoverableConnectionError,
    kombu.exceptions.OperationalError,
)

logger = logging.getLogger(__name__)

amqp_tables.install()  # the broker's server properties (connection.start) are a table too


class _Line:
    """One AMQP connection of a broker's control and the one thread that uses it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()  # `run` may also be called from other threads (the command line)
        self.connection: Connection | None = None
        self.queued = 0  # works handed to its thread and not finished (counted on the event loop)
        self.handed = 0  # works ever handed to it: an idle line is retired only if none came since
        self.refused = False  # an extra line whose connection failed: its work went to the first line
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        return self._executor

    def drop(self) -> None:
        if self.connection is not None:
            with contextlib.suppress(*CONNECTION_ERRORS):  # it is gone either way
                self.connection.release()
            self.connection = None

    def _drop_held(self) -> None:
        with self.lock:
            self.drop()

    def close(self) -> None:
        """Dropped on its own thread once the work in flight is done: the event loop never waits on the broker."""
        if self._executor is None:
            self._drop_held()  # never used from the event loop (the command line's `run`)
            return
        self._executor.submit(self._drop_held)
        self._executor.shutdown(wait=False)
        self._executor = None


class ControlConnection:
    def __init__(
        self,
        address: BrokerAddress,
        tls: TlsFiles | None = None,
        clock: Callable[[], float] = time.monotonic,
        heartbeat: float = 0,
        lines: int = 1,
    ) -> None:
        self.address = address
        self._tls = tls
        self._clock = clock
        self._heartbeat = heartbeat  # for work that keeps the connection busy (a replay): the broker sees it die
        self._most_lines = lines
        self._first = _Line(f"broker {address.display}")
        self._lines = [self._first]
        self._failure = threading.Lock()  # the backoff and the lending pause are shared by the lines' threads
        self._lend_after = 0.0  # no further line before this time: one failed to connect (a connection limit?)
        self._closed = False
        self._backoff = Backoff()
        self._last_error = ""
        self.server_version: str | None = None  # as the broker said when last connected

    @property
    def connections(self) -> int:
        """Lines open now (each one AMQP connection once used)."""
        return len(self._lines)

    async def run_async(self, work: Callable[[Connection], T]) -> T:
        """`run` on one of this broker's own threads: the first line's, or another while every line is busy."""
        line = self._line_for_next()
        line.queued += 1
        line.handed += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                line.executor, functools.partial(self._run_on, line, work)
            )
        finally:
            line.queued -= 1
            if line is not self._first and line.queued == 0:
                asyncio.get_running_loop().call_later(LINE_IDLE_SECONDS, self._retire_if_idle, line, line.handed)

    def _line_for_next(self) -> _Line:
        for refused in [line for line in self._lines if line.refused]:
            self._lines.remove(refused)
            refused.close()
        first = self._first
        with self._failure:
            pausing = self._clock() < self._lend_after
        if first.connection is None or pausing:
            # Not connected (or the broker is down): one line tries, so a broker that is down costs one
            # connection attempt per backoff period, not one per line.
            return first
        least = min(self._lines, key=lambda line: line.queued)
        if least.queued == 0 or len(self._lines) >= self._most_lines:
            return least
        line = _Line(f"broker {self.address.display} ({len(self._lines) + 1})")
        self._lines.append(line)
        return line

    def _retire_if_idle(self, line: _Line, handed: int) -> None:
        """An extra line closes once no work came to it for LINE_IDLE_SECONDS (bursts end; connections too)."""
        if line.handed == handed and line.queued == 0 and line in self._lines:
            self._lines.remove(line)
            line.close()

    def run(self, work: Callable[[Connection], T]) -> T:
        """Run `work` with the first line's connection (on the caller's thread)."""
        return self._run_on(self._first, work)

    def _run_on(self, line: _Line, work: Callable[[Connection], T]) -> T:
        """Run `work` with the line's connection; reconnect once if a kept connection went stale."""
        with line.lock:
            with self._failure:
                if self._backoff.waiting(self._clock()):
                    raise BrokerUnavailableError(self._last_error)  # no attempt within the backoff
                pausing = self._clock() < self._lend_after
            if self._closed:  # a work that came after close() must not open a connection nobody closes
                raise BrokerUnavailableError(f"the connection to the broker at {self.address.display} was closed")
            if line is not self._first and line.connection is None and (line.refused or pausing):
                line.refused = True  # never connected: retired at the next hand-out, not kept as an empty line
                return self._run_on(self._first, work)  # a further line failed to connect meanwhile: not tried again
            for attempt in (1, 2):
                fresh = line.connection is None
                try:
                    if line.connection is None:
                        line.connection = self._connect()
                    result = work(line.connection)
                except amqp.exceptions.AMQPNotImplementedError as exc:
                    # The broker cannot do it (and closed the connection): no retry, no backoff, its own reason.
                    line.drop()
                    raise UnsupportedOperationError(
                        f"the broker does not support an operation: {exc.reply_text}"
                    ) from None
                except CONNECTION_ERRORS as exc:
                    line.drop()
                    if not fresh and attempt == 1:
                        continue  # the kept connection died since last use: one fresh try
                    if line is not self._first:
                        self._stop_lending(line, exc)
                        break  # the first line judges: it backs off, or does the work
                    self._fail(exc)
                    raise BrokerUnavailableError(self._last_error) from None
                with self._failure:
                    self._backoff.succeeded()
                return result
        return self._run_on(self._first, work)

    def _stop_lending(self, line: _Line, exc: BaseException) -> None:
        """An extra line failed to connect: a connection limit of the user or vhost, or the broker going down.
        Its work goes to the first line, which alone decides the backoff; no further line for a while."""
        line.refused = True
        with self._failure:
            self._lend_after = self._clock() + LEND_PAUSE_SECONDS
        reason = self.address.redact(f"{type(exc).__name__}: {exc}")
        logger.warning(
            "a further connection to the broker at %s failed (%s): its declares go through the first one, "
            "no further connection for %.0fs",
            self.address.display,
            reason,
            LEND_PAUSE_SECONDS,
        )

    def _connect(self) -> Connection:
        """One pass over the failover list (shuffled with `shuffle`); the last endpoint's failure is raised."""
        endpoints = list(self.address.endpoints)
        if self.address.failover_strategy == "shuffle":
            random.shuffle(endpoints)
        for endpoint in endpoints[:-1]:
            with contextlib.suppress(*CONNECTION_ERRORS, amqp.exceptions.AMQPError):
                return self._connect_to(endpoint)
        try:
            return self._connect_to(endpoints[-1])
        except amqp.exceptions.AMQPError as exc:  # e.g. login refused, vhost not found
            raise amqp.exceptions.ConnectionError(str(exc)) from exc

    def _connect_to(self, endpoint: Endpoint) -> Connection:
        tls_options: bool | dict[str, object] = False
        if endpoint.tls:  # the chain and the host name are verified (the system's CAs without ca.crt)
            tls_options = kombu_options(self._tls, endpoint.host)
        connection = Connection(
            self.address.urls[self.address.endpoints.index(endpoint)],
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            heartbeat=self._heartbeat,  # 0 by default: used in bursts by one thread, a dead one shows on next use
            ssl=tls_options,
            transport_options={
                "client_properties": {"connection_name": CONNECTION_NAME},
                "read_timeout": OPERATION_TIMEOUT_SECONDS,
                "write_timeout": OPERATION_TIMEOUT_SECONDS,
            },
        )
        try:
            connection.connect()
        except BaseException:
            with contextlib.suppress(*CONNECTION_ERRORS):
                connection.release()
            raise
        version = (connection.connection.server_properties or {}).get("version")
        self.server_version = version.decode() if isinstance(version, bytes) else version
        return connection

    def _fail(self, exc: BaseException) -> None:
        reason = self.address.redact(f"{type(exc).__name__}: {exc}")
        with self._failure:
            delay = self._backoff.failed(self._clock())
            # The message stays the same while the failure does (one Event per failure); the countdown is logged.
            self._last_error = f"cannot reach the broker at {self.address.display}: {reason}"
        logger.warning("%s; next attempt in %.0fs", self._last_error, delay)

    def close(self) -> None:
        self._closed = True
        for line in self._lines:
            line.close()
