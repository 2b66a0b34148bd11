"""A service's worker pods for the lifecycle tests: real Celery workers, the real operator, a real RabbitMQ.

What cannot exist here: a kubelet and the ReplicaSet controller. `Fleet` plays both: it creates each pod (as the API
server stores it after the webhook, Running) and runs its worker locally with the pod's env (the injected settings
name the worker's broker connections after its pod); after an eviction the test stops that worker and starts the
replacement, as the ReplicaSet and the kubelet would.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from celery_event_operator.core import naming
from celery_event_operator.core.api import metadata
from tests.conftest import REPO, billing_sample
from tests.integration.injection.test_healing import admitted_with_settings
from tests.support.kube import EmulatedApi, events
from tests.support.operator_process import OperatorProcess
from tests.support.workers import Worker, as_kubelet_would, release_held

APPS = REPO / "tests" / "integration" / "injection" / "apps"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"
HANDLER_QUEUE = "billing.orders.order.created"
STUCK_AFTER_SECONDS = 6
STATUS_INTERVAL_SECONDS = 2
# Celery's heartbeats switched off as many teams run their workers (fewer broker messages).
WITHOUT_HEARTBEAT = ("--without-heartbeat", "--without-gossip", "--without-mingle")


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

    def start(
        self,
        name: str,
        *options: str,
        template: str = "5d8f",
        pool: str = "threads",
        concurrency: int = 2,
        env: dict[str, str] | None = None,
    ) -> Worker:
        """A Running pod of the workload's pod template `template` (its pod-template-hash) and its worker."""
        pod = admitted_with_settings(self.operator, name)
        pod["metadata"]["labels"]["pod-template-hash"] = template
        pod["status"] = {"phase": "Running"}
        self.api.client.create(PODS, pod)
        kubelet_env = as_kubelet_would(pod, self.api.client, self.directory / f"settings-{name}")
        assert kubelet_env[naming.POD_NAME_ENV] == name, "the downward API gives the worker its pod's name"
        worker = Worker(
            APPS,
            "orders_app",
            {**kubelet_env, **(env or {}), "HANDLER_LOG": str(self.handled_log)},
            self.directory / f"worker-{name}.log",
            "-n",
            f"celery@{name}",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            *options,
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

    def release(self, *order_ids: int) -> None:
        release_held(self.handled_log, *order_ids)

    def phases(self, order_id: int) -> list[str]:
        """What the handler recorded of one order's runs, in order ("started", "done"; "handled" for a quick run)."""
        return [h.get("phase", "handled") for h in self.handled() if h["order_id"] == order_id]

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
        """The end of a test: nothing is waited for (a warm or cold shutdown waits for, or on, running tasks)."""
        for worker in self.workers.values():
            if worker.process is not None and worker.process.poll() is None:
                worker.kill()


def events_of(api: EmulatedApi, reason: str) -> list[str]:
    return [event["message"] for event in events(api, reason)]
