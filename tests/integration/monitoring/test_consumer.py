"""The events consumer (its own AMQP framing) against the real RabbitMQ: exact counts, garbage and
oversized bodies, recovery when the broker cancels it or drops its connection, refused logins, TLS."""

from __future__ import annotations

import logging
import pathlib
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator import certs, naming
from celery_event_operator.broker import urls
from celery_event_operator.monitoring import consumer
from celery_event_operator.monitoring.state import MAX_EVENT_BYTES, ServiceMetrics
from tests.support import rabbitmq
from tests.support.private_broker import PrivateRabbit
from tests.support.waiting import eventually

SERVICE = "billing"
QUEUE = naming.monitor_queue_name(SERVICE)


class Running:
    """consumer.consume in a thread, as the operator's daemon runs it; its log records kept."""

    def __init__(self, url: str) -> None:
        self.address = urls.parse(url, failover_strategy="round-robin", vhost_override=None)
        self.metrics = ServiceMetrics("default", SERVICE)
        self.stop = threading.Event()
        self.records: list[logging.LogRecord] = []
        logger = logging.getLogger(f"test-consumer-{id(self)}")
        logger.addHandler(_Keep(self.records))
        logger.propagate = False
        self.thread = threading.Thread(target=consumer.consume,
                                       args=(self.address, SERVICE, self.metrics, self.stop, logger), daemon=True)
        self.thread.start()

    def log(self) -> str:
        return "\n".join(record.getMessage() for record in self.records)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(consumer.POLL_SECONDS + 3)
        assert not self.thread.is_alive(), "the consumer did not stop"

    def received(self) -> int:
        return sum(count for (kind, *_), count in self.metrics.counters.items() if kind == "received")


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


def consumers(url: str) -> int:
    with Connection(url) as connection:
        try:
            count: int = connection.channel().queue_declare(QUEUE, passive=True).consumer_count
        except amqp.exceptions.NotFound:
            return 0
        return count


def publish(url: str, *bodies: bytes) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for body in bodies:
            channel.basic_publish(amqp.Message(body, content_type="application/json"),
                                  naming.event_exchange_name(SERVICE), "task.received")


def received_event(number: int) -> bytes:
    return (b'{"type": "task-received", "hostname": "celery@billing-worker-a", "name": "orders.created", '
            b'"uuid": "u%d"}' % number)


def test_events_garbage_and_oversized_bodies_are_counted_exactly(running: Running, test_vhost_url: str) -> None:
    garbage = [b"{", b"[1, ", b"\xff\xfe", b"", b'{"no": "type"}', b'{"type": "task-received"}']
    oversized = b'{"type": "task-received", "pad": "' + b"x" * (2 * MAX_EVENT_BYTES + 200_000) + b'"}'
    publish(test_vhost_url, *(received_event(n) for n in range(50)), *garbage, oversized,
            *(received_event(n) for n in range(50, 60)))
    eventually(lambda: running.metrics.malformed == len(garbage) + 1 and running.received() == 60, timeout=10,
               message=f"not counted exactly: {running.metrics.malformed} malformed, {running.received()} received")
    assert running.metrics.events_consumed == 60


def test_consumer_comes_back_when_its_queue_is_deleted(running: Running, test_vhost_url: str,
                                                       rabbitmq_management: rabbitmq.Management,
                                                       test_vhost: str) -> None:
    rabbitmq_management.request("DELETE", f"/queues/{rabbitmq_management.vhost_path(test_vhost)}/"
                                f"{urllib.parse.quote(QUEUE, safe='')}")
    eventually(lambda: "cancelled the consumer" in running.log(), timeout=5)
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10, message="the consumer did not come back")
    publish(test_vhost_url, received_event(1))
    eventually(lambda: running.received() == 1, timeout=5)


def test_consumer_comes_back_when_the_broker_drops_its_connection(running: Running, test_vhost_url: str,
                                                                  rabbitmq_management: rabbitmq.Management,
                                                                  test_vhost: str) -> None:
    def listed() -> list[dict[str, object]]:
        connections = rabbitmq_management.request(
            "GET", f"/vhosts/{rabbitmq_management.vhost_path(test_vhost)}/connections")
        return [c for c in connections if "events" in c.get("client_properties", {}).get("connection_name", "")]

    def ours() -> list[str]:
        return [str(c["name"]) for c in listed()]

    [first] = eventually(ours, timeout=10)
    # A consumer without acks sends nothing: heartbeats are what tell the broker it lives.
    assert [c["timeout"] for c in listed()] == [consumer.HEARTBEAT_SECONDS]
    rabbitmq_management.request("DELETE", f"/connections/{urllib.parse.quote(first, safe='')}")
    eventually(lambda: "closed the connection" in running.log(), timeout=5)
    eventually(lambda: ours() not in ([], [first]), timeout=10, message="no new connection")
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10)
    publish(test_vhost_url, received_event(2))
    eventually(lambda: running.received() == 1, timeout=5)


def test_refused_login_is_retried_and_never_shows_the_password(test_vhost_url: str) -> None:
    parts = urllib.parse.urlsplit(test_vhost_url)
    sentinel = "sentinel-Pa55-w0rd"
    wrong = urllib.parse.urlunsplit(parts._replace(netloc=f"guest:{sentinel}@{parts.hostname}:{parts.port or 5672}"))
    subject = Running(wrong)
    try:
        eventually(lambda: subject.log().count("ACCESS_REFUSED") >= 2, timeout=10,
                   message="the refused login was not reported and retried")
        assert sentinel not in subject.log()
        assert subject.thread.is_alive()
    finally:
        subject.finish()


def test_a_stopped_consumer_leaves_no_connection(test_vhost_url: str, rabbitmq_management: rabbitmq.Management,
                                                 test_vhost: str) -> None:
    subject = Running(test_vhost_url)
    eventually(lambda: consumers(test_vhost_url) == 1, timeout=10)
    subject.finish()
    eventually(lambda: rabbitmq_management.request(
        "GET", f"/vhosts/{rabbitmq_management.vhost_path(test_vhost)}/connections") == [], timeout=10)


@pytest.fixture
def tls_rabbit(tmp_path: pathlib.Path) -> Iterator[PrivateRabbit]:
    """A private node with an amqps:// listener whose certificate no system CA has signed."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))  # the rabbitmq user must reach it
    rabbit = PrivateRabbit(base, tls=certs.self_signed(tmp_path / "tls", ["127.0.0.1"]))
    try:
        yield rabbit.start()
    finally:
        rabbit.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_amqps_consumes_only_from_a_broker_whose_certificate_is_trusted(
        tls_rabbit: PrivateRabbit, monkeypatch: pytest.MonkeyPatch) -> None:
    assert tls_rabbit.tls is not None
    untrusted = Running(tls_rabbit.tls_url)
    try:
        eventually(lambda: "CERTIFICATE_VERIFY_FAILED" in untrusted.log(), timeout=30,
                   message="an unknown certificate was not refused")
    finally:
        untrusted.finish()
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_rabbit.tls[0]))  # OpenSSL's default trust store, now ours
    trusted = Running(tls_rabbit.tls_url)
    try:
        eventually(lambda: consumers(tls_rabbit.url) == 1, timeout=30, message="no consumer over TLS")
        publish(tls_rabbit.url, received_event(3))
        eventually(lambda: trusted.received() == 1, timeout=5)
    finally:
        trusted.finish()
