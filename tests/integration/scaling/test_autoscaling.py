"""Queue lengths in status and autoscaling, with the real operator, RabbitMQ and the emulated API."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, free_port
from tests.support.private_broker import PrivateRabbit
from tests.support.rabbitmq import STATS_LAG_SECONDS
from tests.support.waiting import stays

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/billing-worker"
QUEUE = "billing.orders.order.created"
WINDOW = 12


def service(**autoscaling: Any) -> dict[str, Any]:
    body: dict[str, Any] = billing_sample()
    body["spec"]["statusIntervalSeconds"] = 1
    body["spec"]["autoscaling"] = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 10,
        "messagesPerReplica": 100,
        "scaleDownStabilizationSeconds": WINDOW,
        **autoscaling,
    }
    return body


def replicas(api: EmulatedApi) -> int:
    count: int = api.client.get(DEPLOYMENT)["spec"]["replicas"]
    return count


def event_reasons(api: EmulatedApi) -> list[str]:
    """kopf posts Events from a queue of its own: read them with `eventually`, they come a little later."""
    return [e.get("reason", "") for e in api.client.get("/api/v1/namespaces/default/events")["items"]]


def scaled_changes(api: EmulatedApi) -> set[str]:
    """`from 1 to 5` of each Scaled Event."""
    return {
        match.group(0)
        for e in api.client.get("/api/v1/namespaces/default/events")["items"]
        if e.get("reason") == "Scaled" and (match := re.search(r"from \d+ to \d+", e.get("message", "")))
    }


def topology_ready(api: EmulatedApi) -> bool:
    """Publish only after this: the status pass may report queue lengths (the queues exist, empty) while
    the first reconcile is still binding them, and a message published then is unroutable and dropped."""
    return condition(api, "TopologyReady").get("status") == "True"


def publish(url: str, count: int) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for index in range(count):
            channel.basic_publish(amqp.Message(f"event {index}"), exchange="events", routing_key="orders.order.created")


def purge(url: str) -> None:
    with Connection(url) as connection:
        connection.channel().queue_purge(QUEUE)


@pytest.fixture
def operator(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    yield process
    process.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- operator log ---\n{process.log()[-20000:]}")


def test_backlog_scales_up_holds_through_the_window_then_down(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    kube_api.client.create(CES, service())
    eventually(lambda: topology_ready(kube_api), timeout=20)
    eventually(lambda: kube_api.client.get(CES + "/billing").get("status", {}).get("queueLength") == 0, timeout=5)
    eventually(
        lambda: replicas(kube_api) == 1, timeout=WINDOW + 10, message="an idle service did not go to minReplicas"
    )

    publish(test_vhost_url, 500)
    # Within about one interval of the broker's statistics showing the backlog (and margin for a busy machine).
    eventually(
        lambda: replicas(kube_api) == 5,
        timeout=2 + STATS_LAG_SECONDS + 15,
        message="500 messages did not make 5 workers",
    )
    # The workload is scaled before the status is written: wait for that write too.
    status = eventually(
        lambda: (found := kube_api.client.get(CES + "/billing")["status"]).get("desiredReplicas") == 5 and found,
        timeout=5,
    )
    assert (status["queueLength"], status["desiredReplicas"]) == (500, 5)
    assert status["selector"] == "celeryevents.io/service=billing"
    assert status["lastScaleTime"]
    assert kube_api.kubectl("get", "ces").stdout.splitlines()[1].split()[2] == "500"

    purge(test_vhost_url)
    eventually(
        lambda: kube_api.client.get(CES + "/billing")["status"]["queueLength"] == 0, timeout=5 + STATS_LAG_SECONDS
    )
    # The last recommendation of 5 is at most an interval (1 s) older than this, plus the pass's own time and the
    # status read's lag (seconds on a loaded machine): held for half the window.
    stays(
        lambda: replicas(kube_api) == 5,
        seconds=WINDOW / 2,
        message="scaled down inside the stabilization window",
    )
    eventually(lambda: replicas(kube_api) == 1, timeout=WINDOW + 10, message="never scaled down after the window")
    eventually(
        lambda: {"from 1 to 5", "from 5 to 1"} <= scaled_changes(kube_api),
        timeout=5,
        message="no Scaled Event for each change",
    )


def test_scale_to_zero_and_back_above_the_activation_threshold(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    kube_api.client.create(CES, service(minReplicas=0, activationQueueLength=10, scaleDownStabilizationSeconds=0))
    eventually(lambda: topology_ready(kube_api), timeout=20)
    eventually(lambda: replicas(kube_api) == 0, timeout=10, message="an idle service did not go to zero")
    publish(test_vhost_url, 5)
    eventually(
        lambda: kube_api.client.get(CES + "/billing")["status"].get("queueLength") == 5, timeout=5 + STATS_LAG_SECONDS
    )
    stays(
        lambda: replicas(kube_api) == 0,
        seconds=2,
        message="5 messages woke the service, though not above the activation threshold of 10",
    )
    publish(test_vhost_url, 10)
    eventually(
        lambda: replicas(kube_api) == 1, timeout=5 + STATS_LAG_SECONDS, message="15 messages did not wake the service"
    )


def test_replicas_from_the_scale_subresource_without_autoscaling(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    body = service(enabled=False)
    kube_api.client.create(CES, body)
    eventually(lambda: kube_api.client.get(CES + "/billing").get("status", {}).get("selector"), timeout=20)
    assert replicas(kube_api) == 2, "without spec.workers.replicas the workload is left alone"
    kube_api.kubectl("scale", "ces", "billing", "--replicas=3")
    eventually(lambda: replicas(kube_api) == 3, timeout=15, message="kubectl scale ces did not reach the workers")


def test_broker_outage_leaves_replicas_alone(
    kube_api: EmulatedApi, operator: OperatorProcess, private_rabbit: PrivateRabbit
) -> None:
    create_broker_secret(kube_api, private_rabbit.url)
    body = service()
    # The private node has no management API; the derived URL (its host, port 15672) would reach the
    # shared broker's. Point it nowhere: ready counts only.
    body["spec"]["broker"]["managementURL"] = f"http://127.0.0.1:{free_port()}"
    kube_api.client.create(CES, body)
    eventually(lambda: topology_ready(kube_api), timeout=30)
    eventually(lambda: kube_api.client.get(CES + "/billing").get("status", {}).get("queueLength") == 0, timeout=5)
    publish(private_rabbit.url, 300)
    eventually(lambda: replicas(kube_api) == 3, timeout=20)

    private_rabbit.stop()

    down = eventually(
        lambda: (
            condition(kube_api, "BrokerReachable").get("status") == "False" and condition(kube_api, "BrokerReachable")
        ),
        timeout=30,
    )
    assert down["reason"] == "BrokerUnreachable"
    # Longer than the window: with a "0" from missing data it would scale down.
    stays(lambda: replicas(kube_api) == 3, seconds=WINDOW + 2, message="scaled on missing data")
    eventually(lambda: "ScalingPaused" in event_reasons(kube_api), timeout=5, message="no ScalingPaused Event")


def test_a_wait_target_says_what_it_judges_by_and_switching_to_queue_length_clears_it(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    """No worker runs here: no task's runtime is known, so the replicas stay (at least one) and status says why.
    The user's path with real workers is tests/integration/cluster/test_wait_target_on_cluster.py."""
    create_broker_secret(kube_api, test_vhost_url)
    body = service(minReplicas=0, targetWaitSeconds=30)
    del body["spec"]["autoscaling"]["messagesPerReplica"]
    kube_api.client.create(CES, body)
    eventually(lambda: topology_ready(kube_api), timeout=20)
    publish(test_vhost_url, 40)

    def shown() -> dict[str, Any]:
        found: dict[str, Any] = kube_api.client.get(CES + "/billing").get("status", {}).get("autoscaling") or {}
        return found

    # Until the events consumer connects (a moment) the reason says so; then that the runtime is unknown.
    figures = eventually(lambda: "runtime is not known yet" in shown().get("reason", "") and shown(), timeout=15)
    assert figures["targetWaitSeconds"] == 30
    assert figures["estimatedWait"] == "unknown"
    assert figures["measuredWait"] == "none measured in the last minute"
    # Nothing to size by: the Deployment's own count stays (its example has 2), and status says so.
    assert kube_api.client.get(CES + "/billing")["status"]["desiredReplicas"] == replicas(kube_api) == 2

    # One or the other: the merge patch names both, the old one as null.
    kube_api.client.merge_patch(
        CES + "/billing", {"spec": {"autoscaling": {"targetWaitSeconds": None, "messagesPerReplica": 10}}}
    )
    eventually(lambda: replicas(kube_api) == 4, timeout=10, message="40 messages at 10 a replica did not make 4")
    eventually(lambda: "autoscaling" not in kube_api.client.get(CES + "/billing")["status"], timeout=10)
