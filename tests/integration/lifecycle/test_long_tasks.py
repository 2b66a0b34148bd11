"""Long tasks against the broker's delivery-acknowledgement timeout, with real workers, the real operator and a
RabbitMQ node of the test's own (its `consumer_timeout` set to 20 s, checked every second instead of every minute).

RabbitMQ 3.10 (the one here) cannot set the timeout per queue or per consumer: the task runs twice, and the
operator counts the re-run, names its cause and says what to change. What cannot exist here: a kubelet and the
ReplicaSet controller; fleet.py plays both.
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
def test_a_task_longer_than_the_brokers_acknowledgement_timeout_runs_twice_counted_and_explained(
    fleet_on_a_short_ack_timeout: Fleet, queue_type: str
) -> None:
    fleet = fleet_on_a_short_ack_timeout
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=60)
    fleet.start("billing-worker-a", concurrency=1)
    fleet.start("billing-worker-b", concurrency=1)
    eventually(lambda: condition(fleet.api, "TasksRunOnce").get("status") == "True", timeout=30)
    fleet.fire((1, "long:30"))
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
    assert f"consumer_timeout {ACK_TIMEOUT_SECONDS} s of RabbitMQ 3.10.8" in message
    assert "raise consumer_timeout in rabbitmq.conf above the longest task" in message
    [event] = eventually(lambda: events_of(fleet.api, "TasksRerun"), timeout=10)
    assert "acknowledgement timeout" in event
    reruns = (
        'celery_event_operator_task_reruns_total{namespace="default",service_name="billing",'
        'name="orders.order.created",cause="ack_timeout"} 1'
    )
    eventually(lambda: reruns in fleet.operator.scrape(), timeout=10, message="the re-run was not counted")
