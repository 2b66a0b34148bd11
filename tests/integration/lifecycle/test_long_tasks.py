"""Long tasks against the broker's delivery-acknowledgement timeout, with real workers, the real operator and a
RabbitMQ node of the test's own (its `consumer_timeout` set to 20 s, checked every second instead of every minute),
of each version of the matrix.

Up to RabbitMQ 4.2 the broker's timeout applies to both queue types (a consumer's own is ignored) and closes the
channel: the task runs twice, and the operator counts the re-run, names its cause and says what to change. On 4.3 a
quorum queue honours the timeout the workers ask for (longer than their tasks; a service without `workers` asks none,
and the broker's then cancels the consumer instead of closing its channel: counted alike), and classic queues enforce
none: the task runs once, and the condition says which timeout is in effect. What cannot exist here: a kubelet and
the ReplicaSet controller; fleet.py plays both.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from tests.conftest import REPO, create_broker_secret
from tests.integration.lifecycle.fleet import CES, Fleet, events_of, service
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

ACK_TIMEOUT_SECONDS = 20
TASK_SECONDS = 30

pytestmark = pytest.mark.every_broker


def timeout_in_effect(version: str, queue_type: str, asked: bool) -> str | None:
    """What RabbitMQ `version` does to the 30 s task on a handler queue of `queue_type`, the workers asking for their
    own timeout or not (measured, written out here rather than taken from the operator's table): the timeout the
    condition names when the task runs once, None when the broker's 20 s apply and it runs twice."""
    if tuple(int(part) for part in version.split(".")[:2]) < (4, 3):
        return None
    if queue_type == "classic":
        return f"none: RabbitMQ {version} enforces no acknowledgement timeout on classic queues"
    return "s, asked by the workers" if asked else None


@pytest.fixture
def fleet_on_a_short_ack_timeout(
    kube_api: EmulatedApi, crd_installed: object, tmp_path: pathlib.Path, private_rabbit: PrivateRabbit
) -> Iterator[Fleet]:
    """The operator told the broker's timeout (it cannot be read remotely), and the sample's workload."""
    operator = OperatorProcess(
        kube_api.kubeconfig, tmp_path / "operator.log", "--broker-consumer-timeout", str(ACK_TIMEOUT_SECONDS)
    ).start()
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    create_broker_secret(kube_api, private_rabbit.url, managementURL=private_rabbit.management_url or "")
    found = Fleet(kube_api, operator, tmp_path, tmp_path / "handled.jsonl")
    yield found
    found.stop_all()
    operator.stop()


@pytest.mark.parametrize(
    "private_rabbit", [{"management": True, "consumer_timeout_seconds": ACK_TIMEOUT_SECONDS}], indirect=True
)
@pytest.mark.parametrize(
    ("queue_type", "asked"),
    [
        pytest.param("classic", True, id="classic"),
        pytest.param("quorum", True, id="quorum"),
        pytest.param("quorum", False, id="quorum-without-workers-spec"),
    ],
)
def test_a_task_longer_than_the_brokers_acknowledgement_timeout_runs_as_its_broker_does_and_is_explained(
    fleet_on_a_short_ack_timeout: Fleet, queue_type: str, asked: bool, private_rabbit: PrivateRabbit
) -> None:
    fleet = fleet_on_a_short_ack_timeout
    version = private_rabbit.server_version()
    body = service(queue_type)
    if not asked:  # no limit to ask for: the broker's own timeout applies
        del body["spec"]["workers"]
    fleet.api.client.create(CES, body)
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=60)
    fleet.start("billing-worker-a", concurrency=1)
    fleet.start("billing-worker-b", concurrency=1)
    eventually(lambda: condition(fleet.api, "TasksRunOnce").get("status") == "True", timeout=30)
    fleet.fire((1, f"long:{TASK_SECONDS}"))
    expected = timeout_in_effect(version, queue_type, asked)
    if expected is not None:
        eventually(lambda: fleet.phases(1) == ["started", "done"], timeout=TASK_SECONDS + 30)
        assert fleet.phases(1) == ["started", "done"], "the task ran twice"
        message = condition(fleet.api, "TasksRunOnce")["message"]
        assert condition(fleet.api, "TasksRunOnce")["status"] == "True", message
        assert expected in message
        return
    eventually(
        lambda: fleet.phases(1)[:2] == ["started", "started"],
        timeout=ACK_TIMEOUT_SECONDS + 30,
        message="the broker did not give the task out again",
    )
    found = eventually(
        lambda: (
            condition(fleet.api, "TasksRunOnce").get("reason") == "TasksRerun" and condition(fleet.api, "TasksRunOnce")
        ),
        timeout=20,
        message="the re-run was not reported",
    )
    assert found["status"] == "False"
    message = found["message"]
    assert "1 started again after the broker's acknowledgement timeout delivered it again while it ran" in message
    assert "orders.order.created (1)" in message
    assert f"consumer_timeout {ACK_TIMEOUT_SECONDS} s of RabbitMQ {version}" in message
    workers_could_ask = queue_type == "quorum" and tuple(int(part) for part in version.split(".")[:2]) >= (4, 3)
    advice = "give the service spec.workers" if workers_could_ask else "raise consumer_timeout in rabbitmq.conf"
    assert advice in message
    [event] = eventually(lambda: events_of(fleet.api, "TasksRerun"), timeout=10)
    assert "acknowledgement timeout" in event
    reruns = (
        'celery_event_operator_task_reruns_total{namespace="default",service_name="billing",'
        'name="orders.order.created",cause="ack_timeout"} 1'
    )
    eventually(lambda: reruns in fleet.operator.scrape(), timeout=10, message="the re-run was not counted")
