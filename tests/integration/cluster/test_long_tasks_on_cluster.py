"""Long tasks through a rollout and a scale-in made by Kubernetes' own controllers (issue 33), on the real control
plane: the Deployment controller replaces the pods after a settings change, the operator's autoscaler lowers the
replicas and the ReplicaSet controller picks the pod; the process kubelet sends SIGTERM and waits the pod's
`terminationGracePeriodSeconds` — the one the webhook set from `status.gracePeriodSeconds` — before SIGKILL.

Real Celery workers (threads pool, one task at a time per pod) on real RabbitMQ, both queue types; the operator as
the chart's ServiceAccount. Mocked: the kubelet and the container image (tests/support/process_kubelet.py).
"""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

from tests.conftest import create_broker_secret
from tests.integration.cluster.test_workers_on_cluster import Service, worker_deployment
from tests.integration.lifecycle.fleet import APPS, service
from tests.support.cluster import ChartOperator, Cluster
from tests.support.kube import eventually, gone
from tests.support.waiting import stays
from tests.support.workers import release_held


class LongTaskService(Service):
    """One task at a time per pod (so a pod running one is busy), the spec the test gives."""

    def start_with(self, vhost_url: str, replicas: int, queue_type: str, **spec: Any) -> None:
        self.cluster.kubelet.run_workers(
            self.namespace,
            APPS,
            "orders_app",
            "--pool=threads",
            "--concurrency=1",
            env={"HANDLER_LOG": str(self.handled_log)},
        )
        create_broker_secret(self.cluster, vhost_url, self.namespace)  # type: ignore[arg-type]
        body = service(queue_type, maxTaskRuntimeSeconds=MAX_TASK_RUNTIME_SECONDS)
        body["spec"] |= spec
        self.cluster.client.create(self.ces, body)
        # The grace the webhook gives the pods is in status before the first pod is admitted.
        eventually(
            lambda: (
                self.condition("Ready").get("status") == "True"
                and self.status().get("gracePeriodSeconds") == GRACE_SECONDS
            ),
            timeout=60,
        )
        self.cluster.client.create(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments", worker_deployment(replicas)
        )

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = self.cluster.client.get(f"{self.ces}/billing").get("status") or {}
        return found

    def pod_path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.cluster.client.get(self.pod_path(name))
        return found

    def handled(self) -> list[dict[str, Any]]:
        text = self.handled_log.read_text() if self.handled_log.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    def release(self, *order_ids: int) -> None:
        release_held(self.handled_log, *order_ids)


# The tasks' limit the grace covers: 150 s + 10 s for the worker to exit, rounded up to 180 s.
MAX_TASK_RUNTIME_SECONDS = 150
GRACE_SECONDS = 180
# A task runs until the test releases it (never past the limit, so never judged stuck): each test decides when the
# work ends instead of guessing how long the controllers take.
HELD_AT_MOST = f"hold:{MAX_TASK_RUNTIME_SECONDS - 10}"
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' terminationGracePeriodSeconds when nothing sets it


def runs(billing: LongTaskService, order_id: int) -> list[dict[str, Any]]:
    return [line for line in billing.handled() if line["order_id"] == order_id]


def reruns(chart_operator: ChartOperator) -> list[str]:
    return [
        line
        for line in chart_operator.process.scrape().splitlines()
        if line.startswith("celery_event_operator_task_reruns_total{")
    ]


def test_a_settings_change_while_a_task_runs_past_the_default_grace_lets_it_finish_once_on_its_pod(
    cluster: Cluster,
    namespace: str,
    chart_operator: ChartOperator,
    test_vhost_url: str,
    tmp_path: pathlib.Path,
    queue_type: str,
) -> None:
    billing = LongTaskService(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start_with(test_vhost_url, 1, queue_type)
    [old] = billing.settled(1)
    assert billing.running()[old]["spec"]["terminationGracePeriodSeconds"] == GRACE_SECONDS
    billing.fire((1, HELD_AT_MOST))
    eventually(lambda: [run["phase"] for run in runs(billing, 1)] == ["started"], timeout=30)

    cluster.client.merge_patch(f"{billing.ces}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    # The Deployment controller starts the new pod, then deletes the old one: SIGTERM, Celery's warm shutdown.
    [new] = eventually(lambda: list(set(billing.running()) - {old}), timeout=90, message="no new pod ran")
    eventually(lambda: billing.pod(old)["metadata"].get("deletionTimestamp"), timeout=60, message="the old pod stayed")
    terminating_since = time.monotonic()
    billing.fire((2, "ok"))
    eventually(lambda: runs(billing, 2), timeout=30, message="the new pod served no new work")
    assert [run["phase"] for run in runs(billing, 1)] == ["started"], "the new work waited for the long task"
    assert runs(billing, 2)[0]["hostname"].endswith(new)
    # Past the grace a pod gets by default, the old pod still runs its task: the webhook's grace is what keeps it.
    stays(
        lambda: (
            [run["phase"] for run in runs(billing, 1)] == ["started"]
            and not gone(cluster.client, billing.pod_path(old))
        ),
        seconds=DEFAULT_GRACE_SECONDS + 5 - (time.monotonic() - terminating_since),
        message="the task or its pod ended within the default grace",
    )

    billing.release(1)
    eventually(
        lambda: [run["phase"] for run in runs(billing, 1)] == ["started", "done"],
        timeout=30,
        message="the long task did not finish",
    )
    [started, done] = runs(billing, 1)
    assert started["hostname"] == done["hostname"], "it finished on its pod"
    assert started["hostname"].endswith(old)
    eventually(lambda: gone(cluster.client, billing.pod_path(old)), timeout=30, message="the old pod stayed")
    assert [run["phase"] for run in runs(billing, 1)] == ["started", "done"], "run once"
    assert reruns(chart_operator) == []
    assert billing.condition("TasksRunOnce")["status"] == "True"


def test_the_autoscaler_scaling_down_while_every_pod_is_busy_cuts_no_task_short(
    cluster: Cluster,
    namespace: str,
    chart_operator: ChartOperator,
    test_vhost_url: str,
    tmp_path: pathlib.Path,
    queue_type: str,
) -> None:
    """Four long tasks, two messages a replica: two pods run two of them while two wait; once those two start, two
    messages are left (both being worked on) and the autoscaler asks for one replica while both pods are busy."""
    billing = LongTaskService(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start_with(
        test_vhost_url,
        1,
        queue_type,
        autoscaling={
            "enabled": True,
            "minReplicas": 1,
            "maxReplicas": 2,
            "messagesPerReplica": 2,
            "scaleDownStabilizationSeconds": 0,
        },
    )
    billing.settled(1)
    billing.fire(*((order_id, HELD_AT_MOST) for order_id in (1, 2, 3, 4)))
    both = eventually(lambda: len(billing.running()) == 2 and set(billing.running()), timeout=90, message="no scale-up")

    def started_not_done() -> set[int]:
        phases = [(run["order_id"], run["phase"]) for run in billing.handled()]
        return {order for order, phase in phases if phase == "started"} - {o for o, p in phases if p == "done"}

    eventually(lambda: started_not_done() == {1, 2}, timeout=60, message="the two pods did not each take one")
    billing.release(1, 2)
    # The second pair started: each pod is busy, two messages are left, one replica is asked for.
    eventually(lambda: started_not_done() == {3, 4}, timeout=60, message="the second pair did not start")
    eventually(
        lambda: cluster.client.get(billing.deployment)["spec"]["replicas"] == 1,
        timeout=30,
        message="the autoscaler did not scale down",
    )
    [removed] = eventually(
        lambda: [name for name in both if billing.pod(name)["metadata"].get("deletionTimestamp")],
        timeout=30,
        message="the ReplicaSet controller deleted no pod",
    )
    assert started_not_done() == {3, 4}, "the scale-down came while both pods were busy"
    billing.release(3, 4)
    eventually(lambda: started_not_done() == set() and len(billing.handled()) == 8, timeout=60)
    eventually(lambda: gone(cluster.client, billing.pod_path(removed)), timeout=30)
    for order_id in (1, 2, 3, 4):
        [started, done] = runs(billing, order_id)
        assert (started["phase"], done["phase"]) == ("started", "done")
        assert started["hostname"] == done["hostname"]
    assert any(run["hostname"].endswith(removed) for run in billing.handled() if run["order_id"] in (3, 4))
    assert reruns(chart_operator) == []
