"""The events connection (its own AMQP framing, on an event loop) against the real RabbitMQ: exact counts,
garbage, hostile and oversized bodies, many services on one connection, recovery when the broker cancels a
consumer or drops the connection, refused logins, TLS with host-name verification and client certificates."""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import amqp
import pytest
from celery.events.event import Event
from kombu.connection import Connection

from celery_event_operator.adapters import certs
from celery_event_operator.adapters.broker import events_connection
from celery_event_operator.adapters.broker.events_connection import EventsConnection, Subscription
from celery_event_operator.adapters.broker.tls import TlsFiles
from celery_event_operator.core import naming
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.settings import TlsMaterial
from celery_event_operator.core.monitoring.state import MAX_EVENT_BYTES, ServiceMetrics
from tests.support import pki, rabbitmq
from tests.support.private_broker import PrivateRabbit
from tests.support.waiting import eventually

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

SERVICE = "billing"
QUEUE = naming.monitor_queue_name(SERVICE)


class Running:
    """An EventsConnection on an event loop of its own (a thread), as the operator runs it; its log kept."""

    def __init__(self, url: str, tls: TlsMaterial | None = None, services: tuple[str, ...] = (SERVICE,)) -> None:
        self.address = broker_address.parse(url)
        self.tls = TlsFiles(tls) if tls is not None else None
        self.records: list[logging.LogRecord] = []
        self.logger = logging.getLogger(f"test-events-{id(self)}")
        self.logger.addHandler(_Keep(self.records))
        self.logger.propagate = False
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.connection: EventsConnection = self.call(self._connect)
        self.metrics: dict[str, ServiceMetrics] = {}
        self.subscriptions: dict[str, Subscription] = {}
        for service in services:
            self.subscribe(service)

    async def _connect(self) -> EventsConnection:
        return EventsConnection(self.address, self.tls, self.logger)

    def call(self, function: Any, *args: Any) -> Any:
        """Run a coroutine function (or a plain one) on the connection's loop, wait for its result."""

        async def run() -> Any:
            result = function(*args)
            return await result if asyncio.iscoroutine(result) else result

        future: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self.loop)
        return future.result(30)

    def subscribe(self, service: str) -> None:
        metrics = self.metrics[service] = ServiceMetrics("default", service)
        self.subscriptions[service] = self.call(
            self.connection.subscribe,
            f"default/{service}",
            naming.monitor_queue_name(service),
            naming.event_exchange_name(service),
            metrics,
        )

    def unsubscribe(self, service: str) -> None:
        self.call(self.connection.unsubscribe, self.subscriptions.pop(service))

    def log(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)

    def finish(self) -> None:
        self.call(self.connection.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if self.tls is not None:
            self.tls.remove()

    def received(self, service: str = SERVICE) -> int:
        return sum(count for (kind, *_), count in self.metrics[service].counters.items() if kind == "received")


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def running(test_vhost_url: str) -> Iterator[Running]:
    subject = Running(test_vhost_url)
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10, message="the consumer never started")
    yield subject
    subject.finish()


def consumers(url: str, queue: str = QUEUE) -> int:
    with Connection(url) as connection:
        try:
            count: int = connection.channel().queue_declare(queue, passive=True).consumer_count
        except amqp.exceptions.NotFound:
            return 0
        return count


def publish(url: str, *bodies: bytes, service: str = SERVICE) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish(
                amqp.Message(body, content_type="application/json"),
                naming.event_exchange_name(service),
                "task.received",
            )


def received_event(number: int) -> bytes:
    return (
        b'{"type": "task-received", "hostname": "celery@billing-worker-a", "name": "orders.created", '
        b'"uuid": "u%d"}' % number
    )


def test_events_garbage_and_oversized_bodies_are_counted_exactly(running: Running, test_vhost_url: str) -> None:
    garbage = [b"{", b"[1, ", b"\xff\xfe", b"", b'{"no": "type"}', b'{"type": "task-received"}']
    oversized = b'{"type": "task-received", "pad": "' + b"x" * (2 * MAX_EVENT_BYTES + 200_000) + b'"}'
    publish(
        test_vhost_url,
        *(received_event(n) for n in range(50)),
        *garbage,
        oversized,
        *(received_event(n) for n in range(50, 60)),
        failed_with_long_traceback("u3"),
    )
    metrics = running.metrics[SERVICE]
    eventually(
        lambda: metrics.malformed == len(garbage) + 1 and running.received() == 60 and metrics.events_consumed == 61,
        timeout=10,
        message=f"not counted exactly: {metrics.malformed} malformed, {metrics.events_consumed} consumed",
    )
    # Issue #12, finding 6: a legitimate failure with a traceback over the size limit is a failure.
    assert metrics.counters[("failed", "orders.created", "", "celery", "ValueError")] == 1


def failed_with_long_traceback(uuid: str) -> bytes:
    """A task-failed as Celery's dispatcher sends it, its traceback several times the size limit."""
    traceback = "Traceback (most recent call last):\n" + '  File "app.py", line 1, in "x"\n' * 20_000
    event = Event(
        "task-failed",
        uuid=uuid,
        exception="ValueError('card declined')",
        traceback=traceback,
        hostname="celery@billing-worker-a",
        utcoffset=0,
        pid=7,
        clock=12,
    )
    assert len(json.dumps(event)) > 4 * MAX_EVENT_BYTES
    return json.dumps(event).encode()


def test_hostile_bodies_never_stop_the_consumer(running: Running, test_vhost_url: str) -> None:
    """Issue #12, finding 3: each of these switched a service's metrics off for good."""
    hostile = [
        b"[" * 30000 + b"]" * 30000,  # RecursionError in json.loads
        b'{"type": "task-received", "hostname": "celery@w1", "uuid": ["a"], "name": "t"}',  # TypeError
        b'{"type": "task-succeeded", "hostname": "celery@w1", "uuid": "x", "runtime": {"a": 1}}',  # counted, not timed
        b'{"type": ["task-received"], "hostname": {"h": 1}}',
    ]
    publish(test_vhost_url, *(body for n in range(10) for body in (received_event(n), *hostile)))
    eventually(lambda: running.received() == 10, timeout=10, message=f"good events lost: {running.received()}")
    assert running.subscriptions[SERVICE].connected
    eventually(lambda: running.metrics[SERVICE].malformed == 10 * 3, timeout=5, message="hostile bodies not counted")
    publish(test_vhost_url, received_event(99))
    eventually(lambda: running.received() == 11, timeout=5, message="the consumer stopped after hostile bodies")


def test_many_services_share_one_connection_and_a_deleted_queue_stops_no_other(
    test_vhost_url: str, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    services = tuple(f"svc{n}" for n in range(30))
    subject = Running(test_vhost_url, services=services)
    try:
        for service in services:
            eventually(lambda s=service: consumers(test_vhost_url, naming.monitor_queue_name(s)) == 1, timeout=15)
        # The management API lists connections from its statistics: a few seconds late.
        eventually(lambda: len(rabbitmq_management.connections(test_vhost, with_statistics=True)) == 1, timeout=15)
        doomed = "svc7"
        rabbitmq_management.request(
            "DELETE",
            f"/queues/{rabbitmq_management.vhost_path(test_vhost)}/"
            f"{urllib.parse.quote(naming.monitor_queue_name(doomed), safe='')}",
        )
        for index, service in enumerate(services):
            publish(test_vhost_url, *(received_event(n) for n in range(index + 1)), service=service)
        for index, service in enumerate(services):
            if service != doomed:
                eventually(lambda s=service, i=index: subject.received(s) == i + 1, timeout=10, message=service)
        eventually(lambda: "cancelled the consumer" in subject.log(), timeout=5)
        eventually(lambda: subject.subscriptions[doomed].connected, timeout=15, message="the deleted queue's consumer")
        publish(test_vhost_url, received_event(1), service=doomed)
        eventually(lambda: subject.received(doomed) == 1, timeout=5)

        # The management API lists a closed connection (the test's publishers') for a moment after it closed.
        def the_one_connection() -> list[dict[str, Any]]:
            listed = rabbitmq_management.connections(test_vhost, with_statistics=True)
            return listed if len(listed) == 1 else []

        [connection] = eventually(
            the_one_connection,
            timeout=rabbitmq.STATS_LAG_SECONDS + 10,
            message="not the one events connection",
        )
        assert connection["channels"] <= 2, "one consuming and one declaring channel, whatever the number of services"
    finally:
        subject.finish()


def test_an_unsubscribed_service_stops_consuming_and_the_last_one_closes_the_connection(
    test_vhost_url: str, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    subject = Running(test_vhost_url, services=("one", "two"))
    try:
        eventually(lambda: consumers(test_vhost_url, naming.monitor_queue_name("two")) == 1, timeout=10)
        subject.unsubscribe("two")
        eventually(lambda: consumers(test_vhost_url, naming.monitor_queue_name("two")) == 0, timeout=10)
        assert consumers(test_vhost_url, naming.monitor_queue_name("one")) == 1
    finally:
        subject.finish()
    eventually(lambda: rabbitmq_management.connections(test_vhost) == [], timeout=10)


def connection_tasks() -> list[asyncio.Task[Any]]:
    return [task for task in asyncio.all_tasks() if task.get_name().startswith("events connection")]


def with_password(url: str, password: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"guest:{password}@{parts.hostname}:{parts.port or 5672}"))


@pytest.mark.parametrize(
    ("password", "replies"),
    [*((None, replies) for replies in range(1, 7)), ("wrong", 2)],
    ids=[*(f"answer-{replies}" for replies in range(1, 7)), "login-refused"],
)
def test_a_close_in_the_step_a_broker_reply_lands_ends_the_connection(
    password: str | None,
    replies: int,
    monkeypatch: pytest.MonkeyPatch,
    test_vhost_url: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
) -> None:
    """close() cancels the connection's task. A cancel made in the step a broker reply finished the awaited future
    was lost (Python 3.11's wait_for returned the reply instead): the connection consumed on and its close() never
    returned — a deletion waited 30 s behind it, once in twenty. Nor may a cancel that lands with the broker's
    refusal of the login (its connection.close, the 2nd answer) be read as that refusal and retried. A close() from
    another task lands in that step only by chance; here the cancel is made from data_received itself, after the
    `replies`-th answer (connection start, tune, open, the channels, the declare)."""
    original = events_connection._Session.data_received
    seen = 0

    def cancelling(session: Any, data: bytes) -> None:
        nonlocal seen
        original(session, data)
        seen += 1
        if seen == replies:
            for task in connection_tasks():
                task.cancel()

    monkeypatch.setattr(events_connection._Session, "data_received", cancelling)
    subject = Running(test_vhost_url if password is None else with_password(test_vhost_url, password))
    try:
        eventually(lambda: seen >= replies, timeout=10, message="the broker answered less than that")
        eventually(lambda: subject.call(connection_tasks) == [], timeout=10, message="the cancelled connection ran on")
        assert subject.connection.connected is False
    finally:
        subject.finish()
    assert consumers(test_vhost_url) == 0
    eventually(lambda: rabbitmq_management.connections(test_vhost) == [], timeout=10)


def test_consumer_comes_back_when_the_broker_drops_its_connection(
    running: Running, test_vhost_url: str, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    def ours() -> list[str]:
        return [str(c["name"]) for c in rabbitmq_management.connections(test_vhost)]

    [first] = eventually(ours, timeout=30)  # the management API lists connections a statistics interval late
    # A consumer without acks sends nothing: heartbeats are what tell the broker it lives.
    assert [c["timeout"] for c in rabbitmq_management.connections(test_vhost)] == [events_connection.HEARTBEAT_SECONDS]
    rabbitmq_management.request("DELETE", f"/connections/{urllib.parse.quote(first, safe='')}")
    eventually(lambda: "closed the connection" in running.log(), timeout=5)
    eventually(lambda: ours() not in ([], [first]), timeout=30, message="no new connection")
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10)
    publish(test_vhost_url, received_event(2))
    eventually(lambda: running.received() == 1, timeout=5)


def test_refused_login_is_retried_and_never_shows_the_password(test_vhost_url: str) -> None:
    sentinel = "sentinel-Pa55-w0rd"
    subject = Running(with_password(test_vhost_url, sentinel))
    try:
        eventually(
            lambda: subject.log().count("ACCESS_REFUSED") >= 2,
            timeout=10,
            message="the refused login was not reported and retried",
        )
        assert sentinel not in subject.log()
        assert subject.connection.login_refused
        assert "ACCESS_REFUSED" in (subject.subscriptions[SERVICE].problem or "")
        assert sentinel not in (subject.subscriptions[SERVICE].problem or "")
    finally:
        subject.finish()


def test_a_stopped_consumer_leaves_no_connection(
    test_vhost_url: str, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    subject = Running(test_vhost_url)
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10)
    subject.finish()
    eventually(lambda: rabbitmq_management.connections(test_vhost) == [], timeout=10)


def private_tls_rabbit(tls_dir: pathlib.Path, hosts: list[str], client_ca: pathlib.Path | None = None) -> PrivateRabbit:
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))  # the rabbitmq user must reach it
    return PrivateRabbit(base, tls=certs.self_signed(tls_dir, hosts), client_ca=client_ca).start()


@pytest.fixture
def tls_rabbit(tmp_path: pathlib.Path) -> Iterator[PrivateRabbit]:
    """A private node with an amqps:// listener whose certificate (for 127.0.0.1) no system CA has signed."""
    rabbit = private_tls_rabbit(tmp_path / "tls", ["127.0.0.1"])
    try:
        yield rabbit
    finally:
        rabbit.stop()
        shutil.rmtree(rabbit.base, ignore_errors=True)


def test_amqps_consumes_only_from_a_broker_whose_certificate_is_trusted(tls_rabbit: PrivateRabbit) -> None:
    assert tls_rabbit.tls is not None
    untrusted = Running(tls_rabbit.tls_url)
    try:
        eventually(
            lambda: "CERTIFICATE_VERIFY_FAILED" in untrusted.log(),
            timeout=30,
            message="an unknown certificate was not refused",
        )
    finally:
        untrusted.finish()
    # The Secret's ca.crt is what makes it trusted.
    trusted = Running(tls_rabbit.tls_url, tls=TlsMaterial(ca=tls_rabbit.tls[0].read_text()))
    try:
        eventually(lambda: consumers(tls_rabbit.url) == 1, timeout=30, message="no consumer over TLS")
        publish(tls_rabbit.url, received_event(3))
        eventually(lambda: trusted.received() == 1, timeout=5)
    finally:
        trusted.finish()


def test_amqps_refuses_a_certificate_for_another_host_name(tmp_path: pathlib.Path) -> None:
    """Issue #12, finding 6: the chain was checked, the host name was not."""
    rabbit = private_tls_rabbit(tmp_path / "tls", ["broker.example"])
    try:
        assert rabbit.tls is not None
        ca = TlsMaterial(ca=rabbit.tls[0].read_text())
        wrong_host = Running(rabbit.tls_url, tls=ca)  # 127.0.0.1, not broker.example
        try:
            eventually(
                lambda: "mismatch" in wrong_host.log(),
                timeout=30,
                message=f"a certificate for another host was accepted: {wrong_host.log()}",
            )
            assert consumers(rabbit.url) == 0
        finally:
            wrong_host.finish()
    finally:
        rabbit.stop()
        shutil.rmtree(rabbit.base, ignore_errors=True)


def test_amqps_presents_the_client_certificate_of_the_secret(tmp_path: pathlib.Path) -> None:
    client_ca, client_cert, client_key = pki.client_certificate(tmp_path / "client", "celery-event-operator")
    rabbit = private_tls_rabbit(tmp_path / "tls", ["127.0.0.1"], client_ca=client_ca)
    try:
        assert rabbit.tls is not None
        ca = rabbit.tls[0].read_text()
        anonymous = Running(rabbit.tls_url, tls=TlsMaterial(ca=ca))
        try:
            eventually(lambda: "cannot consume" in anonymous.log(), timeout=30, message="no client certificate, yet in")
            assert consumers(rabbit.url) == 0
        finally:
            anonymous.finish()
        with_certificate = Running(
            rabbit.tls_url, tls=TlsMaterial(ca=ca, cert=client_cert.read_text(), key=client_key.read_text())
        )
        try:
            eventually(lambda: consumers(rabbit.url) == 1, timeout=30, message="the client certificate was refused")
        finally:
            with_certificate.finish()
    finally:
        rabbit.stop()
        shutil.rmtree(rabbit.base, ignore_errors=True)


def test_a_broker_of_small_frames_and_one_channel_is_consumed_from() -> None:
    """The reader answered the broker's tune with frame_max 131072 and 2 channels whatever the broker allowed: a broker
    configured below those closed the connection, and refused the events consumer for ever (issue 40, finding 6). Here
    the events come in frames of 8 KiB (the least RabbitMQ 4 accepts: it tunes a configured 4 KiB, then closes every
    connection "lower than the minimum allowed value (8192)"), and the declares share the consuming channel."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))  # the rabbitmq user must reach it
    rabbit = PrivateRabbit(base, config="frame_max = 8192\nchannel_max = 1\n")
    try:
        rabbit.start()
        subject = Running(rabbit.url, services=(SERVICE, "shipping"))
        try:
            try:
                eventually(
                    lambda: all(subscription.connected for subscription in subject.subscriptions.values()), timeout=20
                )
            except AssertionError as failure:
                raise AssertionError(f"not consuming: {subject.log()}") from failure
            padded = b'{"type": "task-received", "hostname": "celery@w", "uuid": "big", "pad": "%s"}' % (b"x" * 20_000)
            publish(rabbit.url, *(received_event(n) for n in range(5)), padded, failed_with_long_traceback("u3"))
            publish(rabbit.url, received_event(7), service="shipping")
            metrics = subject.metrics[SERVICE]
            eventually(
                lambda: subject.received() == 6 and metrics.malformed == 0 and subject.received("shipping") == 1,
                timeout=10,
                message=f"not counted: {subject.received()} received, {metrics.malformed} malformed",
            )
            assert metrics.counters[("failed", "orders.created", "", "celery", "ValueError")] == 1
        finally:
            subject.finish()
    finally:
        rabbit.stop()
        shutil.rmtree(base, ignore_errors=True)
