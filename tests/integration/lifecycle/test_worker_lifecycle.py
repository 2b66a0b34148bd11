"""The workers' lifecycle with real Celery workers, the real operator and a real RabbitMQ: deletion costs from
the tasks the pods run, stuck workers found and replaced — never during a broker outage.

What cannot exist here: a kubelet and the ReplicaSet controller. The test plays both: it creates each pod (as the
API server stores it after the webhook, Running) and runs its worker locally with the pod's env (the injected
settings name the worker's broker connections after its pod); after an eviction it stops that worker and starts the
replacement. The ReplicaSet's choice of victims by deletion cost is checked on a real cluster by the e2e suite.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator.core import naming
from celery_event_operator.core.api import metadata
from celery_event_operator.core.lifecycle.stuck import RECONNECT_SECONDS
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_healing import admitted_with_settings
from tests.support.kube import EmulatedApi, condition, events, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit
from tests.support.waiting import stays
from tests.support.workers import Worker, as_kubelet_would

APPS = REPO / "tests" / "integration" / "injection" / "apps"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"
HANDLER_QUEUE = "billing.orders.order.created"
STUCK_AFTER_SECONDS = 6
STATUS_INTERVAL_SECONDS = 2


def service(queue_type: str = "classic", **workers: Any) -> dict[str, Any]:
    body = billing_sample()
    spec = body["spec"]
    spec["events"]["handlers"] = [{"name": "orders.order.created"}]
    spec["queueType"] = queue_type
    spec["statusIntervalSeconds"] = STATUS_INTERVAL_SECONDS
    spec["workers"] |= {"stuckAfterSeconds": STUCK_AFTER_SECONDS, **workers}
    return body


@dataclasses.dataclass
class Fleet:
    """The service's pods and their workers, as the ReplicaSet and the kubelets would keep them."""

    api: EmulatedApi
    operator: OperatorProcess
    directory: pathlib.Path
    handled_log: pathlib.Path
    workers: dict[str, Worker] = dataclasses.field(default_factory=dict)

    def start(self, name: str) -> Worker:
        pod = admitted_with_settings(self.operator, name)
        pod["status"] = {"phase": "Running"}
        self.api.client.create(PODS, pod)
        env = as_kubelet_would(pod, self.api.client, self.directory / f"settings-{name}")
        assert env[naming.POD_NAME_ENV] == name, "the downward API gives the worker its pod's name"
        worker = Worker(
            APPS,
            "orders_app",
            {**env, "HANDLER_LOG": str(self.handled_log)},
            self.directory / f"worker-{name}.log",
            "-n",
            f"celery@{name}",
            "--pool=threads",
            "--concurrency=2",
        ).start()
        self.workers[name] = worker
        return worker

    def fire(self, *events: tuple[int, str]) -> None:
        code = (
            "from orders_app import order_created\n"
            f"for order_id, behaviour in {list(events)!r}:\n    order_created(order_id, behaviour)"
        )
        next(iter(self.workers.values())).run(code)

    def handled(self) -> list[dict[str, Any]]:
        text = self.handled_log.read_text() if self.handled_log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def pod(self, name: str) -> dict[str, Any] | None:
        found: list[dict[str, Any]] = [
            pod for pod in self.api.client.get(PODS)["items"] if pod["metadata"]["name"] == name
        ]
        return found[0] if found else None

    def deletion_cost(self, name: str) -> str | None:
        pod = self.pod(name)
        return (
            None if pod is None else (pod["metadata"].get("annotations") or {}).get(metadata.DELETION_COST_ANNOTATION)
        )

    def stop_all(self) -> None:
        for worker in self.workers.values():
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
            worker.stop()


def events_of(api: EmulatedApi, reason: str) -> list[str]:
    return [event["message"] for event in events(api, reason)]


@pytest.fixture
def fleet(kube_api: EmulatedApi, operator: OperatorProcess, tmp_path: pathlib.Path) -> Iterator[Fleet]:
    """The real operator (conftest's, stopped after the workers) and the sample's workload, workers to start."""
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    found = Fleet(kube_api, operator, tmp_path, tmp_path / "handled.jsonl")
    yield found
    found.stop_all()


def test_a_pod_running_a_long_task_costs_more_to_delete_than_an_idle_one(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    fleet.start("billing-worker-busy")
    fleet.fire((1, "long:25"))
    eventually(lambda: [h.get("phase") for h in fleet.handled()] == ["started"], timeout=20)
    fleet.start("billing-worker-idle")
    # After 10 s of running, the busy pod's task would be thrown away by a deletion: it costs more.
    eventually(
        lambda: fleet.deletion_cost("billing-worker-busy") == "1",
        timeout=30,
        message="the busy pod's deletion cost was not set",
    )
    assert fleet.deletion_cost("billing-worker-idle") is None, "an idle pod is not written to (it costs 0)"
    eventually(lambda: [h.get("phase") for h in fleet.handled()] == ["started", "done"], timeout=30)
    eventually(
        lambda: fleet.deletion_cost("billing-worker-busy") == "0",
        timeout=20,
        message="the finished task's cost stayed",
    )
    assert condition(fleet.api, "WorkersHealthy")["status"] == "True"
    stays(
        lambda: fleet.deletion_cost("billing-worker-idle") is None,
        seconds=4,
        message="the idle pod was patched at rest",
    )


def test_a_worker_that_stops_consuming_is_reported_evicted_and_replaced_nothing_lost(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    worker = fleet.start("billing-worker-a")
    fleet.fire((1, "ok"), (2, "ok"))
    eventually(lambda: len(fleet.handled()) == 2, timeout=20)
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)

    # The process and its heartbeats go on; its consumer of the handler queue is gone.
    worker.run(
        "from orders_app import app\n"
        f"print(app.control.cancel_consumer({HANDLER_QUEUE!r}, destination=['celery@billing-worker-a'], reply=True))"
    )
    fleet.fire(*[(order_id, "ok") for order_id in range(3, 13)])
    stuck = eventually(
        lambda: (
            condition(fleet.api, "WorkersHealthy").get("status") == "False" and condition(fleet.api, "WorkersHealthy")
        ),
        timeout=STUCK_AFTER_SECONDS + 3 * STATUS_INTERVAL_SECONDS + 10,
        message="the worker that consumes nothing was not reported",
    )
    assert stuck["reason"] == "WorkersStuck"
    assert "billing-worker-a: heartbeats but consumes from no handler queue" in stuck["message"]
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=20, message="the stuck pod was not evicted")
    [warning] = eventually(lambda: events_of(fleet.api, "WorkerStuck"), timeout=10)
    assert "billing-worker-a" in warning
    assert any("the worker is stuck" in message for message in events_of(fleet.api, "PodEvicted"))

    # The ReplicaSet's replacement; the evicted pod's worker gets its SIGTERM.
    worker.terminate()
    fleet.start("billing-worker-b")
    eventually(
        lambda: sorted(h["order_id"] for h in fleet.handled()) == list(range(1, 13)),
        timeout=40,
        message="the messages that waited were not all handled",
    )
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)
    assert len(events_of(fleet.api, "PodEvicted")) == 1, "one eviction"


def test_a_worker_stopped_with_sigstop_is_reported_and_replaced(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    worker = fleet.start("billing-worker-a")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)
    assert worker.process is not None
    worker.process.send_signal(signal.SIGSTOP)  # the process hangs: no heartbeat, the pod still Running
    stuck = eventually(
        lambda: (
            condition(fleet.api, "WorkersHealthy").get("status") == "False" and condition(fleet.api, "WorkersHealthy")
        ),
        # Silence counts once the workers had the time to reconnect after the events were first consumed.
        timeout=RECONNECT_SECONDS + STUCK_AFTER_SECONDS + 3 * STATUS_INTERVAL_SECONDS + 10,
        message="the silent worker was not reported",
    )
    assert "billing-worker-a: no heartbeat for" in stuck["message"]
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=20, message="the silent pod was not evicted")
    worker.kill()
    fleet.start("billing-worker-b")
    fleet.fire((1, "ok"))
    eventually(lambda: len(fleet.handled()) == 1, timeout=20, message="the replacement does not consume")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)


def test_a_broker_outage_evicts_nothing_and_reports_the_broker(fleet: Fleet, private_rabbit: PrivateRabbit) -> None:
    create_broker_secret(fleet.api, private_rabbit.url)
    fleet.api.client.create(CES, service())
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    fleet.start("billing-worker-a")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)

    private_rabbit.stop()
    eventually(lambda: condition(fleet.api, "BrokerReachable").get("status") == "False", timeout=30)
    stays(
        lambda: (
            fleet.pod("billing-worker-a") is not None
            and condition(fleet.api, "WorkersHealthy").get("status") != "False"
        ),
        seconds=3 * STUCK_AFTER_SECONDS,
        message="a worker was judged during the outage",
    )
    assert condition(fleet.api, "WorkersHealthy")["reason"] == "NotChecked"
    private_rabbit.start()
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=90)
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=60)
    assert fleet.pod("billing-worker-a") is not None
    assert events_of(fleet.api, "WorkerStuck") == []
    assert events_of(fleet.api, "PodEvicted") == []
