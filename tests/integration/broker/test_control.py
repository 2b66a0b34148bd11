"""The control connection of a broker: failover lists, backoff after failures, recovery of a stale one,
channels that do not leak, TLS with host-name verification; brokers shared per login and closed when unused."""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import socket
import tempfile
import threading
import urllib.parse
from typing import Any

import kubernetes
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters import certs
from celery_event_operator.adapters.broker.brokers import Brokers
from celery_event_operator.adapters.broker.control import ControlConnection
from celery_event_operator.adapters.broker.secrets import SecretReader
from celery_event_operator.adapters.broker.tls import TlsFiles
from celery_event_operator.adapters.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.settings import BrokerSettings, TlsMaterial
from celery_event_operator.core.errors import BrokerUnavailableError, UnsupportedOperationError
from celery_event_operator.core.topology.plan import Queue, Topology
from tests.support import rabbitmq
from tests.support.operator_process import free_port
from tests.support.private_broker import PrivateRabbit
from tests.support.waiting import eventually

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dead_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"guest:guest@127.0.0.1:{free_port()}"))


def server_properties(connection: Connection) -> str:
    """A round trip to the broker, and what it says it is."""
    channel = connection.channel()
    channel.exchange_declare("amq.direct", "direct", passive=True)
    channel.close()
    return str(connection.connection.server_properties.get("product"))


def test_failover_list_reaches_the_live_broker(test_vhost_url: str) -> None:
    address = broker_address.parse(f"{dead_url(test_vhost_url)};{test_vhost_url}")
    assert ControlConnection(address).run(server_properties) == "RabbitMQ"


def test_failure_backs_off_without_reconnecting_each_time(test_vhost_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    control = ControlConnection(broker_address.parse(dead_url(test_vhost_url)), clock=clock)
    attempts: list[str] = []
    connect_to = control._connect_to
    monkeypatch.setattr(control, "_connect_to", lambda endpoint: attempts.append(endpoint.host) or connect_to(endpoint))
    with pytest.raises(BrokerUnavailableError, match=r"cannot reach the broker at 127\.0\.0\.1") as first:
        control.run(server_properties)
    with pytest.raises(BrokerUnavailableError) as within_backoff:
        control.run(server_properties)
    assert len(attempts) == 1, "within the backoff: no connection attempt at all"
    # One Event per failure: the message does not change while the failure stays the same.
    assert str(within_backoff.value) == str(first.value)
    assert "next attempt" not in str(first.value)
    clock.now += 1.5
    with pytest.raises(BrokerUnavailableError):
        control.run(server_properties)
    assert len(attempts) == 2
    clock.now += 1.5  # the delay doubled (2 s, plus up to 10 % jitter)
    with pytest.raises(BrokerUnavailableError):
        control.run(server_properties)
    assert len(attempts) == 2


def test_stale_connection_is_replaced_once(test_vhost_url: str) -> None:
    control = ControlConnection(broker_address.parse(test_vhost_url))
    first = control.run(lambda connection: connection.connection)
    first.transport.sock.shutdown(socket.SHUT_RDWR)  # the socket dies under the kept connection
    assert control.run(server_properties) == "RabbitMQ"
    assert control.run(lambda connection: connection.connection) is not first


def test_refused_declares_leak_no_channels(
    test_vhost_url: str, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    """Issue #11: py-amqp revives a channel the broker closed; replacing it leaked one channel per refusal
    (1,761 open channels after 1,000 services)."""
    control = ControlConnection(broker_address.parse(test_vhost_url))
    missing = Topology("ghost", (), tuple(Queue(f"ghost.q{n}", "events", {}) for n in range(20)), ())
    for _ in range(5):
        states = control.run(lambda connection: apply.inspect(connection, missing))
        assert not any(state.present for state in states)

    def our_channels() -> list[int]:
        listed = rabbitmq_management.connections(test_vhost, with_statistics=True)
        return [int(connection["channels"]) for connection in listed]

    eventually(lambda: our_channels() == [0], timeout=15, message="channels left open")
    control.close()


def test_brokers_are_shared_per_login_and_closed_when_no_service_uses_them(test_vhost_url: str) -> None:
    async def scenario() -> None:
        kube = AsyncKubeApi(KubeApi(kubernetes.client.ApiClient()))  # the Secrets are not read here
        brokers = Brokers(SecretReader(kube))
        address = broker_address.parse(test_vhost_url)
        settings = BrokerSettings(address, TlsMaterial(), address.management_url())
        other = BrokerSettings(
            broker_address.parse(test_vhost_url, failover_strategy="shuffle"), TlsMaterial(), address.management_url()
        )
        first, second = brokers.acquire(settings), brokers.acquire(settings)
        assert first is second
        assert brokers.acquire(other) is not first
        assert len(brokers) == 2
        await brokers.release(first.key)
        assert len(brokers) == 2, "still used once"
        await brokers.release(second.key)
        assert len(brokers) == 1
        await brokers.close_all()
        kube.close()

    asyncio.run(scenario())


@pytest.fixture
def tls_rabbit(tmp_path: pathlib.Path) -> Any:
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))  # the rabbitmq user must reach it
    rabbit = PrivateRabbit(base, tls=certs.self_signed(tmp_path / "tls", ["localhost"])).start()
    try:
        yield rabbit
    finally:
        rabbit.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_control_connection_verifies_the_host_name(tls_rabbit: PrivateRabbit) -> None:
    """Issue #12: the topology connection checked the chain, not the host name."""
    assert tls_rabbit.tls is not None
    with pytest.raises(BrokerUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):  # no CA given: untrusted
        ControlConnection(broker_address.parse(tls_rabbit.tls_url)).run(server_properties)
    tls = TlsFiles(TlsMaterial(ca=tls_rabbit.tls[0].read_text()))  # the Secret's ca.crt
    try:
        by_ip = ControlConnection(broker_address.parse(tls_rabbit.tls_url), tls)  # 127.0.0.1: not in the certificate
        with pytest.raises(BrokerUnavailableError, match="mismatch"):
            by_ip.run(server_properties)
        by_name = ControlConnection(broker_address.parse(tls_rabbit.tls_url.replace("127.0.0.1", "localhost")), tls)
        assert by_name.run(server_properties) == "RabbitMQ"
        by_name.close()
        # kombu's query forms of TLS (issue 26): TLS too, and verified whatever the query says of verifying.
        kombu_form = ControlConnection(
            broker_address.parse(f"amqp://guest:guest@localhost:{tls_rabbit.tls_port}//?ssl=1"), tls
        )
        assert kombu_form.run(server_properties) == "RabbitMQ"
        kombu_form.close()
        unverified = f"amqp://guest:guest@localhost:{tls_rabbit.tls_port}//?ssl_cert_reqs=none"
        with pytest.raises(BrokerUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):  # no CA given: untrusted
            ControlConnection(broker_address.parse(unverified)).run(server_properties)
    finally:
        tls.remove()


def test_an_operation_the_broker_does_not_implement_is_unsupported_not_unreachable(test_vhost_url: str) -> None:
    """Issue #13: `if-empty` on a quorum queue closed the connection (540) and read as "cannot reach the broker"."""
    control = ControlConnection(broker_address.parse(test_vhost_url))

    def delete_if_empty(connection: Connection) -> None:
        channel = connection.channel()
        channel.queue_declare("q", durable=True, auto_delete=False, arguments={"x-queue-type": "quorum"})
        channel.queue_delete("q", if_empty=True)

    with pytest.raises(UnsupportedOperationError, match="NOT_IMPLEMENTED"):
        control.run(delete_if_empty)
    assert control.run(lambda connection: connection.channel().queue_declare("q", passive=True).queue) == "q", (
        "no backoff: the next operation runs at once"
    )


def test_queued_work_spreads_over_a_few_lines_that_close_when_idle(
    test_vhost_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 43: a fleet's first declares waited on one connection (about 30 ms of RabbitMQ 4's time each)."""
    monkeypatch.setattr("celery_event_operator.adapters.broker.control.LINE_IDLE_SECONDS", 0.5)
    control = ControlConnection(broker_address.parse(test_vhost_url), lines=3)

    def held(connection: Connection) -> int:
        server_properties(connection)  # a round trip on the line's own connection
        release.wait(timeout=10)
        return id(connection)

    async def scenario() -> None:
        assert await control.run_async(id), "the first line connects alone"
        assert control.connections == 1, "one at a time: no second line"
        works = [asyncio.ensure_future(control.run_async(held)) for _ in range(6)]
        await asyncio.sleep(0.5)
        assert control.connections == 3, "lent out while the first was busy, up to `lines`"
        release.set()
        assert len(set(await asyncio.gather(*works))) == 3, "each line its own connection"
        await asyncio.sleep(1.0)
        assert control.connections == 1, "the extra lines closed when idle"

    release = threading.Event()
    asyncio.run(scenario())
    control.close()


def test_a_broker_that_is_down_gets_one_attempt_however_much_work_queues(
    test_vhost_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    control = ControlConnection(broker_address.parse(dead_url(test_vhost_url)), lines=4)
    attempts: list[str] = []
    connect_to = control._connect_to
    monkeypatch.setattr(control, "_connect_to", lambda endpoint: attempts.append(endpoint.host) or connect_to(endpoint))

    async def scenario() -> list[BaseException | str]:
        works = [control.run_async(server_properties) for _ in range(8)]
        return await asyncio.gather(*works, return_exceptions=True)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(outcome, BrokerUnavailableError) for outcome in outcomes)
    assert len(attempts) == 1
    assert control.connections == 1


def test_a_connection_limit_keeps_the_work_on_the_first_line(
    test_vhost_url: str, test_vhost: str, rabbitmq_management: rabbitmq.Management, caplog: pytest.LogCaptureFixture
) -> None:
    """A vhost (or user) limited to one connection: a further line is refused; its work is done on the first,
    the broker is not reported unreachable, and no further line is tried for a while."""
    rabbitmq_management.request(
        "PUT", f"/vhost-limits/{rabbitmq_management.vhost_path(test_vhost)}/max-connections", {"value": 1}
    )
    control = ControlConnection(broker_address.parse(test_vhost_url), lines=3)

    async def scenario() -> list[str]:
        await control.run_async(server_properties)  # the first line connects
        works = [control.run_async(server_properties) for _ in range(6)]
        done = await asyncio.gather(*works)
        await asyncio.gather(*(control.run_async(server_properties) for _ in range(6)))  # within the pause
        return done

    assert asyncio.run(scenario()) == ["RabbitMQ"] * 6, "every work done, none reported unreachable"
    assert control.connections == 1, "the refused line is gone and no other was opened"
    refusals = [record for record in caplog.records if "a further connection" in record.getMessage()]
    assert 1 <= len(refusals) <= 2, "each further line opened in the burst tried once, then none for the pause"
    control.close()


def test_work_after_close_opens_no_connection(
    test_vhost_url: str, test_vhost: str, rabbitmq_management: rabbitmq.Management
) -> None:
    """A work that comes after the broker was let go (its services gone) must not open a connection nobody closes."""
    control = ControlConnection(broker_address.parse(test_vhost_url), lines=2)

    async def scenario() -> None:
        assert await control.run_async(server_properties) == "RabbitMQ"
        control.close()
        with pytest.raises(BrokerUnavailableError, match="closed"):
            await control.run_async(server_properties)

    asyncio.run(scenario())
    eventually(
        lambda: rabbitmq_management.connections(test_vhost) == [],
        timeout=rabbitmq.STATS_LAG_SECONDS + 10,
        message="a connection outlived close()",
    )
