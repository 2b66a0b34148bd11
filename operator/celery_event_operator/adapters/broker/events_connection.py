"""One consuming AMQP connection per broker for the Celery events of every monitored service on it.

Event-loop I/O: an asyncio protocol feeds the pure frame reader (frames.py). Each service is one consumer
tag on the connection's one consuming channel, and its deliveries are routed by tag to its metrics, so a
thousand services cost one connection and two channels (one consuming, one declaring), not a thread or a
socket each. Events are taken without acknowledgement (metrics tolerate losing the in-flight ones when the
operator dies; acks would halve the throughput).

What one service does never stops another: a body that does not decode is counted as malformed (and
logged, rate-limited); a queue that was deleted makes the broker cancel that one consumer, which is set up
again after its own backoff; a declare the broker refuses closes only the declaring channel. A failure of
the connection itself (broker down, login refused) affects the services that share that login, and the
connection comes back with backoff. Every subscription says whether it is consuming (`connected`, mirrored
into its metrics' readiness) and, if not, why (`problem`, safe to show).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from celery_event_operator.adapters.broker.tls import TlsFiles, client_context
from celery_event_operator.core.broker.address import BrokerAddress, Endpoint
from celery_event_operator.core.broker.backoff import Backoff
from celery_event_operator.core.monitoring import frames
from celery_event_operator.core.monitoring.consumer import CONNECTING, EventsSubscription
from celery_event_operator.core.monitoring.state import MAX_EVENT_BYTES, ServiceMetrics
from celery_event_operator.core.topology.plan import MONITOR_QUEUE_ARGUMENTS

CONNECT_TIMEOUT_SECONDS = 5.0
RPC_TIMEOUT_SECONDS = 10.0
HEARTBEAT_SECONDS = 30  # asked of the broker; a silent broker is given up after two of them
CONSUME_CHANNEL, DECLARE_CHANNEL = 1, 2  # a broker that allows one channel (its channel_max) gets both on the first
CLIENT_CAPABILITIES = {"consumer_cancel_notify": True, "authentication_failure_close": True, "connection.blocked": True}
ACCESS_REFUSED = 403
MALFORMED_LOG_SECONDS = 60.0  # at most one log line per service and minute about bodies that fail

# What ends a session: the connection is gone or closed by the broker (BrokerClosedError is a
# ConnectionError), or the broker spoke something else than we can follow.
SESSION_ERRORS: tuple[type[Exception], ...] = (OSError, TimeoutError, frames.FramingError)


class BrokerClosedError(ConnectionError):
    """The broker closed the connection, with its reply code and text (never credentials)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"the broker closed the connection: {code} {text}")
        self.code = code


class ChannelClosedError(Exception):
    """The broker closed a channel (a refused declare or consume); the connection lives on."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"{code} {text}")
        self.code = code


class _MetricsRoute:
    """Deliveries of one consumer tag into its service's metrics; whatever a body does, nothing escapes."""

    __slots__ = ("_ingest", "_last_logged", "_logger", "_metrics", "_name", "_unlogged")

    def __init__(self, name: str, metrics: ServiceMetrics, logger: logging.Logger) -> None:
        self._name = name
        self._metrics = metrics
        self._ingest = metrics.ingest_message
        self._logger = logger
        self._last_logged = -MALFORMED_LOG_SECONDS
        self._unlogged = 0

    def on_body(self, body: bytes) -> None:
        try:
            self._ingest(body, time.monotonic())
        except Exception as exc:  # noqa: BLE001  (any body, however hostile, only counts as malformed)
            self._failed(exc)

    def on_oversized(self, head: bytes, tail: bytes, size: int) -> None:
        try:
            self._metrics.ingest_oversized(head, tail, size, time.monotonic())
        except Exception as exc:  # noqa: BLE001
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        self._metrics.count_malformed()
        now = time.monotonic()
        if now - self._last_logged < MALFORMED_LOG_SECONDS:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last report)" if self._unlogged else ""
        self._logger.warning(
            "events of %s: a message could not be accounted: %s%s", self._name, type(exc).__name__, more
        )
        self._last_logged, self._unlogged = now, 0


class Subscription:
    """One service's events on an EventsConnection."""

    def __init__(self, name: str, queue: str, exchange: str, metrics: ServiceMetrics, tag: bytes) -> None:
        self.name = name  # namespace/service, for logs
        self.queue = queue
        self.exchange = exchange
        self.metrics = metrics
        self.tag = tag
        self.problem: str | None = CONNECTING
        self.backoff = Backoff()
        self.needs_setup = True

    @property
    def connected(self) -> bool:
        return self.problem is None

    def _set(self, problem: str | None) -> None:
        self.problem = problem
        self.metrics.consumer_connected = problem is None


class _Session(asyncio.Protocol):
    """One live connection: frames in through the reader, replies matched to the calls awaiting them."""

    def __init__(self, routes: dict[bytes, frames.Route], on_cancel: Callable[[bytes], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self.reader = frames.DeliveryReader(routes, self._on_method, MAX_EVENT_BYTES)
        self._on_cancel = on_cancel
        self.transport: asyncio.Transport | None = None
        self._waiting: dict[int, collections.deque[asyncio.Future[tuple[frames.MethodId, bytes]]]] = (
            collections.defaultdict(collections.deque)
        )
        self.closed: asyncio.Future[BaseException] = self._loop.create_future()
        self.open_channels: set[int] = set()
        self.declare_channel = DECLARE_CHANNEL  # CONSUME_CHANNEL when the broker allows one channel
        self.last_received = self.last_sent = time.monotonic()

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_received = time.monotonic()
        try:
            self.reader.feed(data)
        except frames.FramingError as exc:
            self.fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(exc or ConnectionError("the broker closed the connection"))

    # --- calls and replies --------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)
        for waiting in self._waiting.values():
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def send(self, channel: int, method: frames.MethodId, signature: str = "", arguments: tuple[Any, ...] = ()) -> None:
        self.write(frames.method_frame(channel, method, signature, arguments))

    def write(self, data: bytes) -> None:
        if self.closed.done() or self.transport is None:
            raise ConnectionError("the connection is closed")
        self.transport.write(data)
        self.last_sent = time.monotonic()

    async def call(
        self,
        channel: int,
        method: frames.MethodId,
        signature: str,
        arguments: tuple[Any, ...],
        reply: frames.MethodId,
        *,
        timeout: float = RPC_TIMEOUT_SECONDS,
    ) -> bytes:
        """Send a synchronous method and wait for its reply (replies on a channel come in order)."""
        future: asyncio.Future[tuple[frames.MethodId, bytes]] = self._loop.create_future()
        self._waiting[channel].append(future)
        self.send(channel, method, signature, arguments)
        try:
            async with asyncio.timeout(timeout):
                got, payload = await future
        except TimeoutError:
            raise TimeoutError(f"no answer from the broker to method {method} within {timeout:.0f}s") from None
        if got != reply:
            raise frames.FramingError(f"expected method {reply}, got {got}")
        return payload

    def expect(self, channel: int, reply: frames.MethodId) -> asyncio.Future[tuple[frames.MethodId, bytes]]:
        """A reply that comes without a request of ours (connection.start, after the protocol header)."""
        future: asyncio.Future[tuple[frames.MethodId, bytes]] = self._loop.create_future()
        self._waiting[channel].append(future)
        return future

    def _on_method(self, channel: int, method: frames.MethodId, payload: bytes) -> None:
        if method == frames.CONNECTION_CLOSE:
            code, text, *_ = frames.method_arguments(method, payload)
            with contextlib.suppress(ConnectionError):
                self.send(0, frames.CONNECTION_CLOSE_OK)
            self.fail(BrokerClosedError(code, text))
        elif method == frames.CHANNEL_CLOSE:
            code, text, *_ = frames.method_arguments(method, payload)
            with contextlib.suppress(ConnectionError):
                self.send(channel, frames.CHANNEL_CLOSE_OK)
            self.open_channels.discard(channel)
            waiting = self._waiting[channel]
            while waiting:
                future = waiting.popleft()
                if not future.done():
                    future.set_exception(ChannelClosedError(code, text))
        elif method == frames.BASIC_CANCEL:
            tag, _ = frames.method_arguments(method, payload)
            self._on_cancel(tag.encode() if isinstance(tag, str) else bytes(tag))
        elif method in (frames.CONNECTION_BLOCKED, frames.CONNECTION_UNBLOCKED):
            pass  # we publish nothing: a blocked connection changes nothing for a consumer
        else:
            waiting = self._waiting[channel]
            if not waiting:
                self.fail(frames.FramingError(f"method {method} on channel {channel} answers nothing we asked"))
                return
            future = waiting.popleft()
            if not future.done():
                future.set_result((method, payload))

    async def open_channel(self, channel: int) -> None:
        if channel not in self.open_channels:
            await self.call(channel, frames.CHANNEL_OPEN, "s", ("",), frames.CHANNEL_OPEN_OK)
            self.open_channels.add(channel)


class EventsConnection:
    """The events of every subscribed service of one broker login, on one connection (see the module doc)."""

    def __init__(
        self, address: BrokerAddress, tls: TlsFiles | None, logger: logging.Logger, *, name: str = "events"
    ) -> None:
        self.address = address
        self._tls = tls
        self._logger = logger
        self._connection_name = f"celery-event-operator {name}"
        self.routes: dict[bytes, frames.Route] = {}
        self.subscriptions: dict[bytes, Subscription] = {}
        self._tags = itertools.count(1)
        self._changed = asyncio.Event()
        self._session: _Session | None = None
        self._task: asyncio.Task[None] | None = None
        self.backoff = Backoff()
        self.problem: str | None = None  # why the connection is down, when it is
        self.login_refused = False

    # --- what services do ---------------------------------------------------------------------

    def subscribe(self, name: str, queue: str, exchange: str, metrics: ServiceMetrics) -> Subscription:
        tag = f"ceo-{next(self._tags)}".encode()
        subscription = Subscription(name, queue, exchange, metrics, tag)
        metrics.consumer_connected = False
        self.subscriptions[tag] = subscription
        self.routes[tag] = _MetricsRoute(name, metrics, self._logger)
        if self.problem is not None:
            subscription._set(self.problem)
        self._changed.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"events connection {self.address.display}")
        return subscription

    def unsubscribe(self, subscription: EventsSubscription) -> None:
        """Stop the consumer of `subscription` (one of this connection's: found by its tag)."""
        found = self.subscriptions.pop(subscription.tag, None)
        self.routes.pop(subscription.tag, None)
        if found is None:
            return
        found.metrics.consumer_connected = False
        session = self._session
        if session is not None and found.connected and CONSUME_CHANNEL in session.open_channels:
            with contextlib.suppress(ConnectionError):  # no-wait: the broker answers nothing
                session.send(CONSUME_CHANNEL, frames.BASIC_CANCEL, "sb", (found.tag.decode(), True))
        self._changed.set()

    @property
    def idle(self) -> bool:
        return not self.subscriptions

    @property
    def connected(self) -> bool:
        """An AMQP connection to the broker is open now (heartbeats tell within seconds when it is lost)."""
        return self._session is not None

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Waited for without taking its CancelledError: a cancel of the caller itself still goes through.
            await asyncio.wait({task})

    # --- the connection's life ----------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                if not self.subscriptions:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                wait = self.backoff.waiting(time.monotonic())
                if wait:
                    await asyncio.sleep(wait)
                    continue
                try:
                    session, heartbeat = await self._open()
                except SESSION_ERRORS as exc:
                    self._connection_failed(exc)
                    continue
                except Exception as exc:  # a bug of ours must not end consumption for good: logged, retried
                    self._logger.exception("events connection to %s failed unexpectedly", self.address.display)
                    self._connection_failed(exc)
                    continue
                self._session = session
                self.backoff.succeeded()
                self.problem, self.login_refused = None, False
                self._logger.info("consuming Celery events from %s", self.address.display)
                try:
                    await self._serve(session, heartbeat)
                except SESSION_ERRORS as exc:
                    self._connection_failed(exc)
                except Exception as exc:  # as above
                    self._logger.exception("events connection to %s failed unexpectedly", self.address.display)
                    self._connection_failed(exc)
                finally:
                    self._session = None
                    session.fail(ConnectionError("closed by the operator"))
        finally:
            self._close_session()

    def _close_session(self) -> None:
        session = self._session
        if session is not None and session.transport is not None and not session.closed.done():
            with contextlib.suppress(ConnectionError):
                session.send(0, frames.CONNECTION_CLOSE, "BsBB", (200, "operator stopping", 0, 0))
            session.fail(ConnectionError("closed by the operator"))
        self._session = None

    def _connection_failed(self, exc: BaseException) -> None:
        delay = self.backoff.failed(time.monotonic())
        self.login_refused = isinstance(exc, BrokerClosedError) and exc.code == ACCESS_REFUSED
        reason = self.address.redact(f"{type(exc).__name__}: {exc}")
        self.problem = f"cannot consume from the broker at {self.address.display}: {reason}"
        for subscription in self.subscriptions.values():
            subscription._set(self.problem)
            subscription.needs_setup = True
        self._logger.warning("%s; next attempt in %.0fs", self.problem, delay)

    async def _open(self) -> tuple[_Session, int]:
        """Connect to one endpoint after the other (one pass over the failover list); log in; open channels."""
        endpoints = list(self.address.endpoints)
        if self.address.failover_strategy == "shuffle":
            random.shuffle(endpoints)
        for endpoint in endpoints[:-1]:
            with contextlib.suppress(*SESSION_ERRORS):
                return await self._open_endpoint(endpoint)
        return await self._open_endpoint(endpoints[-1])

    async def _open_endpoint(self, endpoint: Endpoint) -> tuple[_Session, int]:
        loop = asyncio.get_running_loop()
        ssl_context = None
        if endpoint.tls:  # the chain and the host name are verified (the system's CAs without ca.crt)
            ssl_context = client_context(self._tls)
        async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
            _, session = await loop.create_connection(
                lambda: _Session(self.routes, self._cancelled_by_broker),
                endpoint.host,
                endpoint.port,
                ssl=ssl_context,
                server_hostname=endpoint.host if ssl_context is not None else None,
            )
        try:
            # (asyncio sets TCP_NODELAY on its TCP transports itself.)
            started = session.expect(0, frames.CONNECTION_START)
            session.write(frames.PROTOCOL_HEADER)
            async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS):
                await started
            properties = {
                "product": "celery-event-operator",
                "capabilities": CLIENT_CAPABILITIES,
                "connection_name": self._connection_name,
            }
            login = f"\0{endpoint.user}\0{endpoint.password}".encode()
            tune = await session.call(
                0,
                frames.CONNECTION_START_OK,
                "FsSs",
                (properties, "PLAIN", login, "en_US"),
                frames.CONNECTION_TUNE,
                timeout=CONNECT_TIMEOUT_SECONDS,
            )
            broker_channels, broker_frame_max, broker_heartbeat = frames.method_arguments(frames.CONNECTION_TUNE, tune)
            heartbeat = min(broker_heartbeat, HEARTBEAT_SECONDS) or HEARTBEAT_SECONDS
            channels, frame_max = frames.agreed_limits(broker_channels, broker_frame_max, channels=DECLARE_CHANNEL)
            session.reader.frame_max = frame_max
            session.declare_channel = DECLARE_CHANNEL if channels >= DECLARE_CHANNEL else CONSUME_CHANNEL
            session.send(0, frames.CONNECTION_TUNE_OK, "BlB", (channels, frame_max, heartbeat))
            await session.call(
                0, frames.CONNECTION_OPEN, "ssb", (self.address.vhost, "", False), frames.CONNECTION_OPEN_OK
            )
            await session.open_channel(CONSUME_CHANNEL)
            await session.open_channel(session.declare_channel)
        except asyncio.CancelledError:
            # Never turned into the broker's closing (even one that came in the same step): the connection is
            # being closed, and a cancel read as a refused login would retry it with nobody waiting.
            session.fail(ConnectionError("cancelled"))
            raise
        except BaseException as exc:
            session.fail(exc if isinstance(exc, Exception) else ConnectionError("cancelled"))
            if session.closed.done() and isinstance(session.closed.result(), BrokerClosedError):
                raise session.closed.result() from None  # e.g. 403 ACCESS_REFUSED: say so, not "closed"
            raise
        return session, heartbeat

    async def _serve(self, session: _Session, heartbeat: int) -> None:
        for subscription in self.subscriptions.values():
            subscription.needs_setup = True
        while not session.closed.done():
            retry_in_seconds = await self._set_up_due(session, heartbeat / 2)
            if session.closed.done():
                break
            now = time.monotonic()
            if now - session.last_received > 2 * heartbeat:
                raise TimeoutError(f"nothing from the broker for {2 * heartbeat}s, not even a heartbeat")
            if now - session.last_sent >= heartbeat / 2:  # a consumer without acks sends nothing else
                session.write(frames.heartbeat_frame())
            if retry_in_seconds == 0:
                continue  # more to set up at once
            self._changed.clear()
            changed: asyncio.Future[Any] = asyncio.ensure_future(self._changed.wait())
            closed: asyncio.Future[Any] = session.closed
            try:
                await asyncio.wait({changed, closed}, timeout=retry_in_seconds, return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
        raise session.closed.result()

    async def _set_up_due(self, session: _Session, longest: float) -> float:
        """Set up every subscription whose turn it is; returns how long until the next one is due."""
        now = time.monotonic()
        retry_in = longest
        for subscription in list(self.subscriptions.values()):
            if not subscription.needs_setup or session.closed.done():
                continue
            wait = subscription.backoff.waiting(now)
            if wait:
                retry_in = min(retry_in, wait)
                continue
            await self._set_up(session, subscription)
        now = time.monotonic()
        if any(s.needs_setup and not s.backoff.waiting(now) for s in self.subscriptions.values()):
            return 0.0
        return max(retry_in, 0.05)

    async def _set_up(self, session: _Session, subscription: Subscription) -> None:
        """Declare the service's events exchange and queue (as planned), bind them, consume."""
        exchange, queue, declaring = subscription.exchange, subscription.queue, session.declare_channel
        try:
            await session.open_channel(declaring)
            # Celery declares its event exchange the same way (a durable topic exchange).
            await session.call(
                declaring,
                frames.EXCHANGE_DECLARE,
                "BssbbbbbF",
                (0, exchange, "topic", False, True, False, False, False, {}),
                frames.EXCHANGE_DECLARE_OK,
            )
            await session.call(
                declaring,
                frames.QUEUE_DECLARE,
                "BsbbbbbF",
                (0, queue, False, True, False, False, False, dict(MONITOR_QUEUE_ARGUMENTS)),
                frames.QUEUE_DECLARE_OK,
            )
            await session.call(
                declaring, frames.QUEUE_BIND, "BsssbF", (0, queue, exchange, "#", False, {}), frames.QUEUE_BIND_OK
            )
        except ChannelClosedError as exc:
            if declaring == CONSUME_CHANNEL:
                self._consumers_lost(subscription)
            self._subscription_failed(subscription, f"cannot declare {queue!r}: {exc}")
            return
        if subscription.tag not in self.subscriptions:
            return  # unsubscribed meanwhile
        try:
            await session.open_channel(CONSUME_CHANNEL)
            await session.call(
                CONSUME_CHANNEL,
                frames.BASIC_CONSUME,
                "BssbbbbF",
                (0, queue, subscription.tag.decode(), False, True, False, False, {}),
                frames.BASIC_CONSUME_OK,
            )
        except ChannelClosedError as exc:
            self._consumers_lost(subscription)
            self._subscription_failed(subscription, f"cannot consume from {queue!r}: {exc}")
            return
        subscription.needs_setup = False
        subscription.backoff.succeeded()
        if subscription.problem is not None:
            self._logger.info("consuming the Celery events of %s from %s", subscription.name, queue)
        subscription._set(None)

    def _consumers_lost(self, failed: Subscription) -> None:
        """The consuming channel is gone with every consumer on it: the others are set up again at once."""
        for other in self.subscriptions.values():
            if other is not failed and other.connected:
                other.needs_setup = True

    def _subscription_failed(self, subscription: Subscription, problem: str) -> None:
        delay = subscription.backoff.failed(time.monotonic())
        subscription.needs_setup = True
        if problem != subscription.problem:
            self._logger.warning("events of %s: %s; next attempt in %.0fs", subscription.name, problem, delay)
        subscription._set(problem)

    def _cancelled_by_broker(self, tag: bytes) -> None:
        subscription = self.subscriptions.get(tag)
        if subscription is not None:
            self._subscription_failed(
                subscription, f"the broker cancelled the consumer of {subscription.queue!r} (was the queue deleted?)"
            )
            self._changed.set()
