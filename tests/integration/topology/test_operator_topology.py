"""The real operator declares, repairs and reports each service's topology (emulated API, real broker)."""

from __future__ import annotations

import copy
import pathlib
import urllib.parse
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.topology import plan
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, condition, events, eventually, gone
from tests.support.operator_process import OperatorProcess

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
RESYNC = 1.0


def sample() -> dict[str, Any]:
    body: dict[str, Any] = billing_sample()
    return body


def _gone(api: EmulatedApi) -> bool:
    return gone(api.client, f"{CES}/billing")


@pytest.fixture
def running(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    create_broker_secret(kube_api, test_vhost_url)
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC).start()
    yield process
    process.stop()


@pytest.fixture
def channel(test_vhost_url: str) -> Iterator[Any]:
    with Connection(test_vhost_url, connect_timeout=5) as connection:
        opened = connection.channel()
        yield opened


def test_sample_gets_exactly_its_planned_topology(
    kube_api: EmulatedApi, running: OperatorProcess, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing.yaml"))
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True", message="never Ready")
    topology = plan.plan("billing", parse_spec(sample()["spec"]))
    held = rabbitmq.snapshot(rabbitmq_management, test_vhost)
    assert held["queues"] == {q.name: dict(q.arguments) for q in topology.queues}
    claim = {"billing:owner": "fanout"}  # the service name's one owner here (docs/user-guide/ownership.md)
    assert held["exchanges"] == {e.name: e.type for e in topology.exchanges} | claim
    assert held["bindings"] == {(b.exchange, b.queue, b.routing_key) for b in topology.bindings}

    body = kube_api.client.get(f"{CES}/billing")
    assert body["status"]["queueLength"] == 0
    assert body["status"]["consumers"] == 0
    assert condition(kube_api, "BrokerReachable")["status"] == "True"
    assert condition(kube_api, "TopologyReady")["reason"] == "Declared"
    assert "wide" not in kube_api.kubectl("get", "ces", "billing").stdout  # the plain table renders
    assert kube_api.kubectl("get", "ces", "billing").stdout.split("\n")[1].split()[:4] == ["billing", "True", "0", "0"]


def _binding_there(channel: Any) -> bool:
    # Bound again: a message published with the key lands in the queue (nothing else publishes in this vhost).
    channel.basic_publish(amqp.Message("probe"), exchange="events", routing_key="orders.order.created")
    return channel.basic_get("billing.orders.order.created", no_ack=True) is not None


def _exchange_there(channel: Any) -> bool:
    try:
        channel.exchange_declare("billing:recover", "topic", passive=True)
    except amqp.exceptions.NotFound:
        return False
    return True


def _queue_there(channel: Any) -> bool:
    try:
        channel.queue_declare("billing.orders.order.created", passive=True)
    except amqp.exceptions.NotFound:
        return False
    return True


@pytest.mark.parametrize(
    ("remove", "there"),
    [
        (lambda channel: channel.queue_delete("billing.orders.order.created"), _queue_there),
        (
            lambda channel: channel.queue_unbind("billing.orders.order.created", "events", "orders.order.created"),
            _binding_there,
        ),
        (lambda channel: channel.exchange_delete("billing:recover"), _exchange_there),
    ],
    ids=["queue", "binding", "exchange"],
)
def test_what_is_deleted_by_hand_is_back_within_a_resync(
    kube_api: EmulatedApi, running: OperatorProcess, channel: Any, remove: Any, there: Any
) -> None:
    """A resync declares what the broker's listing does not show as planned (docs/user-guide/topology.md: Resync)."""
    kube_api.client.create(CES, sample())
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    assert there(channel)
    remove(channel)
    assert not there(channel)
    # A resync, and a listing no older than one (about two resyncs); a loaded machine: later.
    eventually(lambda: there(channel), timeout=RESYNC * 5 + 15, message="it did not come back")


def test_counters_follow_the_queues(kube_api: EmulatedApi, running: OperatorProcess, channel: Any) -> None:
    body = sample()
    body["spec"]["statusIntervalSeconds"] = 1
    kube_api.client.create(CES, body)
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    for key in ("orders.order.created", "orders.order.cancelled", "orders.order.created"):
        channel.basic_publish(amqp.Message("e"), exchange="events", routing_key=key)
    channel.basic_publish(amqp.Message("e"), exchange="billing:archived", routing_key="x")
    channel.basic_publish(amqp.Message("e"), exchange="billing:retry.9", routing_key="orders.order.created")

    def counters() -> tuple[Any, ...]:
        status = kube_api.client.get(f"{CES}/billing")["status"]
        return status.get("queueLength"), status.get("retrying"), status.get("archived")

    eventually(
        lambda: counters() == (3, 1, 1),
        timeout=RESYNC * 5 + rabbitmq.STATS_LAG_SECONDS + 10,
        message="counters did not follow",
    )


def test_archive_length_change_recreates_empty_and_reports_full(
    kube_api: EmulatedApi, running: OperatorProcess, channel: Any
) -> None:
    kube_api.client.create(CES, sample())
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    kube_api.client.merge_patch(f"{CES}/billing", {"spec": {"archive": {"maxLength": 20000}}})
    eventually(lambda: events(kube_api, "Recreated"), message="no Recreated event")
    assert "billing:archived" in events(kube_api, "Recreated")[0]["message"]
    assert condition(kube_api, "TopologyReady")["status"] == "True"

    channel.basic_publish(amqp.Message("keep me"), exchange="billing:archived", routing_key="")
    kube_api.client.merge_patch(f"{CES}/billing", {"spec": {"archive": {"maxLength": 30000}}})
    topology_ready = eventually(
        lambda: condition(kube_api, "TopologyReady").get("status") == "False" and condition(kube_api, "TopologyReady"),
        message="mismatch not reported",
    )
    assert topology_ready["reason"] == "ArgumentMismatch"
    assert "billing:archived" in topology_ready["message"]
    assert "x-max-length" in topology_ready["message"]
    assert condition(kube_api, "Ready")["status"] == "False"
    eventually(lambda: [e["type"] for e in events(kube_api, "ArgumentMismatch")] == ["Warning"], timeout=5)
    assert channel.queue_declare("billing:archived", passive=True).message_count == 1

    channel.basic_get("billing:archived", no_ack=True)  # drained: now it can be recreated
    eventually(lambda: condition(kube_api, "TopologyReady").get("status") == "True", timeout=RESYNC * 5 + 15)
    assert len(events(kube_api, "ArgumentMismatch")) == 1, "one Event per failure, not one per resync"


def test_deletion_policy_delete_removes_the_service_entities(
    kube_api: EmulatedApi, running: OperatorProcess, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    body = sample()
    body["spec"]["deletionPolicy"] = "delete"
    kube_api.client.create(CES, body)
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    assert kube_api.client.get(f"{CES}/billing")["metadata"]["finalizers"] == ["celeryevents.io/finalizer"]
    kube_api.client.delete(f"{CES}/billing")
    eventually(lambda: _gone(kube_api), message="the resource was not released")
    held = rabbitmq.snapshot(rabbitmq_management, test_vhost)
    assert held["queues"] == {}
    assert set(held["exchanges"]) == {"events"}, "the shared exchange stays"


def test_retain_policy_leaves_the_broker_alone(
    kube_api: EmulatedApi, running: OperatorProcess, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    kube_api.client.create(CES, sample())
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    before = rabbitmq.snapshot(rabbitmq_management, test_vhost)
    kube_api.client.delete(f"{CES}/billing")
    eventually(lambda: _gone(kube_api), message="the resource was not released")
    del before["exchanges"]["billing:owner"]  # its claim on the service name goes: another resource may take it
    assert rabbitmq.snapshot(rabbitmq_management, test_vhost) == before


def test_lowered_retries_and_dropped_handler_are_cleaned_up(
    kube_api: EmulatedApi, running: OperatorProcess, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    kube_api.client.create(CES, sample())
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True")
    smaller = copy.deepcopy(sample()["spec"])
    smaller["retry"] = {"maxRetries": 2}
    smaller["events"]["handlers"] = [{"name": "orders.order.created"}]
    kube_api.client.merge_patch(f"{CES}/billing", {"spec": smaller})
    topology = plan.plan("billing", parse_spec(smaller))
    eventually(
        lambda: set(rabbitmq.snapshot(rabbitmq_management, test_vhost)["queues"]) == {q.name for q in topology.queues},
        message="obsolete entities stayed",
    )
    eventually(lambda: events(kube_api, "Removed"), timeout=5, message="no Removed Event")


def test_broker_credentials_never_leak(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], amqp_url: str, tmp_path: pathlib.Path
) -> None:
    secret_password = "Tr0ub4dor-and-3"
    wrong = amqp_url.replace("guest:guest@", f"guest:{secret_password}@")
    create_broker_secret(kube_api, wrong)
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC).start()
    try:
        kube_api.client.create(CES, sample())
        reachable = eventually(
            lambda: (
                condition(kube_api, "BrokerReachable").get("status") == "False"
                and condition(kube_api, "BrokerReachable")
            ),
            message="no BrokerReachable=False",
        )
        parts = urllib.parse.urlsplit(amqp_url)
        assert f"{parts.hostname}:{parts.port}" in reachable["message"]
        eventually(lambda: events(kube_api, reachable["reason"]))
    finally:
        process.stop()
    exposed = [
        process.log(),
        str(kube_api.client.get(f"{CES}/billing")),
        str(kube_api.client.get("/api/v1/namespaces/default/events")),
    ]
    assert not [text for text in exposed if secret_password in text]
