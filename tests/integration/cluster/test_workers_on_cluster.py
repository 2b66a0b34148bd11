"""A service's workers on the real control plane: admitted by the API server's call to the operator's webhook,
rolled by the Deployment controller, scaled down by the ReplicaSet controller by deletion cost, evicted through
the Eviction API under a PodDisruptionBudget, and the settings ConfigMap collected by the garbage collector.

The operator runs as the chart's ServiceAccount (real RBAC); real Celery workers run on a real RabbitMQ. Mocked:
the kubelet and the container image (tests/support/process_kubelet.py runs `celery -A orders_app worker` with the
admitted pod's env and settings).
"""

from __future__ import annotations

import pathlib
import signal
import time
from typing import Any

from celery_event_operator.core.api import metadata
from tests.conftest import create_broker_secret
from tests.integration.lifecycle.fleet import APPS, HANDLER_QUEUE, STUCK_AFTER_SECONDS, service
from tests.support.cluster import ChartOperator, Cluster
from tests.support.kube import condition, eventually, gone
from tests.support.waiting import stays
from tests.support.workers import release_held

HASH = metadata.HASH_ANNOTATION
COST = metadata.DELETION_COST_ANNOTATION


def worker_deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "billing-worker"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "billing-worker"}},
            "template": {
                "metadata": {"labels": {"app": "billing-worker", metadata.SERVICE_LABEL: "billing"}},
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "billing-worker:latest",
                            "command": ["celery", "-A", "orders_app", "worker"],
                        }
                    ]
                },
            },
        },
    }


class Service:
    """The billing service of one test: its paths in the test's namespace, its pods and workers."""

    def __init__(self, cluster: Cluster, namespace: str, handled_log: pathlib.Path) -> None:
        self.cluster, self.namespace, self.handled_log = cluster, namespace, handled_log
        self.ces = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
        self.deployment = f"/apis/apps/v1/namespaces/{namespace}/deployments/billing-worker"
        self.configmap = f"/api/v1/namespaces/{namespace}/configmaps/billing-celery-events"

    def start(self, vhost_url: str, replicas: int, **workers: Any) -> None:
        self.cluster.kubelet.run_workers(
            self.namespace,
            APPS,
            "orders_app",
            "--pool=threads",
            "--concurrency=2",
            env={"HANDLER_LOG": str(self.handled_log)},
        )
        create_broker_secret(self.cluster, vhost_url, self.namespace)  # type: ignore[arg-type]
        self.cluster.client.create(self.ces, service(**workers))
        eventually(lambda: self.condition("Ready").get("status") == "True", timeout=60)
        self.cluster.client.create(
            f"/apis/apps/v1/namespaces/{self.namespace}/deployments", worker_deployment(replicas)
        )

    def condition(self, type: str) -> dict[str, Any]:
        return condition(self.cluster, type, namespace=self.namespace)  # type: ignore[arg-type]

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.client.get(
            f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=app%3Dbilling-worker"
        )["items"]
        return items

    def running(self) -> dict[str, dict[str, Any]]:
        """The pods that run a worker (not being deleted), by name."""
        workers = self.cluster.kubelet.workers(self.namespace)
        return {
            pod["metadata"]["name"]: pod
            for pod in self.pods()
            if pod["metadata"]["name"] in workers
            and not pod["metadata"].get("deletionTimestamp")
            and pod.get("status", {}).get("phase") == "Running"
        }

    def template_hash(self) -> str | None:
        annotations = self.cluster.client.get(self.deployment)["spec"]["template"]["metadata"].get("annotations")
        found: str | None = (annotations or {}).get(HASH)
        return found

    def settled(self, replicas: int) -> dict[str, dict[str, Any]]:
        """The running pods once the workload settled: `replicas` of them, all with the settings stamped on the
        pod template (the stamp itself is a template change: the Deployment controller rolls once for it), and
        that rollout done. A pod made before the stamp carries the same hash (the webhook writes it on every pod
        it configures), so the hashes alone cannot tell the rollout's old pod from its new one."""

        def done() -> dict[str, dict[str, Any]]:
            deployment = self.cluster.client.get(self.deployment)
            rolled = deployment.get("status", {})
            rolled_out = rolled.get("observedGeneration") == deployment["metadata"]["generation"] and (
                rolled.get("replicas", 0) == rolled.get("updatedReplicas", 0) == replicas
            )
            running, stamp = self.running(), self.template_hash()
            hashes = {(pod["metadata"].get("annotations") or {}).get(HASH) for pod in running.values()}
            pods = {
                pod["metadata"]["name"]: (
                    pod.get("status", {}).get("phase"),
                    bool(pod["metadata"].get("deletionTimestamp")),
                )
                for pod in self.pods()
            }
            settled = rolled_out and stamp is not None and len(running) == replicas == len(pods) and hashes == {stamp}
            assert settled, f"template {stamp}, running {sorted(running)} with {hashes}, pods {pods}, rollout {rolled}"
            return running

        found: dict[str, dict[str, Any]] = eventually(done, timeout=90, message="the workers never settled")
        return found

    def fire(self, *events: tuple[int, str]) -> None:
        code = (
            "from orders_app import order_created\n"
            f"for order_id, behaviour in {list(events)!r}:\n    order_created(order_id, behaviour)"
        )
        next(iter(self.cluster.kubelet.workers(self.namespace).values())).run(code)

    def phases(self) -> list[tuple[int, str]]:
        import json  # noqa: PLC0415

        text = self.handled_log.read_text() if self.handled_log.exists() else ""
        return [(line["order_id"], line.get("phase", "handled")) for line in map(json.loads, text.splitlines())]


def test_pods_are_admitted_by_the_api_servers_webhook_call_and_rolled_by_the_deployment_controller(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=2)
    first = billing.settled(2)
    for pod in first.values():
        # What the API server stored is what the webhook's patch made of the pod: settings, broker, hash.
        [container] = pod["spec"]["containers"]
        env = {variable["name"]: variable for variable in container["env"]}
        assert env["CELERY_CONFIG_MODULE"]["value"]
        assert any("secretKeyRef" in variable.get("valueFrom", {}) for variable in env.values())
    billing.fire((1, "ok"), (2, "ok"))
    eventually(lambda: sorted(billing.phases()) == [(1, "handled"), (2, "handled")], timeout=30)

    # A settings change: the operator stamps the new hash on the template, the Deployment controller rolls.
    stamped = billing.template_hash()
    cluster.client.merge_patch(f"{billing.ces}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    eventually(lambda: billing.template_hash() != stamped, timeout=30, message="the new settings were not stamped")
    second = billing.settled(2)
    assert set(second).isdisjoint(first), "the Deployment controller did not replace the pods"
    eventually(lambda: all(gone(cluster.client, f"/api/v1/namespaces/{namespace}/pods/{n}") for n in first), timeout=60)
    billing.fire((3, "ok"))
    eventually(lambda: (3, "handled") in billing.phases(), timeout=30)


def test_the_garbage_collector_removes_the_settings_configmap_with_its_service(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=0)
    owner = eventually(lambda: cluster.client.get(billing.configmap)["metadata"]["ownerReferences"], timeout=30)
    assert owner[0]["kind"] == "CeleryEventService"
    cluster.client.delete(f"{billing.ces}/billing")
    eventually(lambda: gone(cluster.client, f"{billing.ces}/billing"), timeout=60, message="the service stayed")
    eventually(
        lambda: gone(cluster.client, billing.configmap), timeout=60, message="the garbage collector left the ConfigMap"
    )


def test_a_scale_down_removes_the_idle_pod_and_the_busy_one_finishes_its_task(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=1)
    [busy] = billing.settled(1)
    billing.fire((1, "hold:300"))  # runs until released: however long the scale-up takes, it is still busy
    eventually(lambda: billing.phases() == [(1, "started")], timeout=30)
    cluster.client.merge_patch(billing.deployment, {"spec": {"replicas": 2}})
    [idle] = eventually(lambda: len(billing.running()) == 2 and list(set(billing.running()) - {busy}), timeout=90)
    eventually(
        lambda: (billing.running()[busy]["metadata"].get("annotations") or {}).get(COST) == "1",
        timeout=40,
        message="the busy pod's deletion cost was not set",
    )
    cluster.client.merge_patch(billing.deployment, {"spec": {"replicas": 1}})
    # The ReplicaSet controller picks the pod of lower deletion cost: the idle one.
    eventually(lambda: gone(cluster.client, f"/api/v1/namespaces/{namespace}/pods/{idle}"), timeout=60)
    assert busy in billing.running()
    release_held(billing.handled_log, 1)
    eventually(lambda: billing.phases() == [(1, "started"), (1, "done")], timeout=40)


def test_a_stuck_worker_is_evicted_through_the_eviction_api_as_its_disruption_budget_allows(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=1)
    [stuck] = billing.settled(1)
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "billing-worker"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "billing-worker"}}},
    }
    cluster.client.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", budget)
    eventually(lambda: billing.condition("WorkersHealthy").get("status") == "True", timeout=60)
    worker = cluster.kubelet.workers(namespace)[stuck]
    # The process and its heartbeats go on; its consumer of the handler queue is gone.
    worker.run(
        "from orders_app import app\n"
        f"print(app.control.cancel_consumer({HANDLER_QUEUE!r}, destination=['celery@{stuck}'], reply=True))"
    )
    billing.fire(*[(order_id, "ok") for order_id in range(1, 11)])

    def reported_stuck() -> dict[str, Any]:
        found = billing.condition("WorkersHealthy")
        assert found.get("status") == "False", found  # the last state shown when it never is
        return found

    reported = eventually(reported_stuck, timeout=STUCK_AFTER_SECONDS + 40)
    assert f"{stuck}: consumes from no handler queue" in reported["message"]
    # minAvailable 1 of 1: the disruption controller allows no eviction, and the stuck pod stays.
    stays(lambda: stuck in billing.running(), seconds=8, message="evicted against the PodDisruptionBudget")
    cluster.client.merge_patch(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/billing-worker", {"spec": {"minAvailable": 0}}
    )
    eventually(lambda: stuck not in billing.running(), timeout=60, message="the stuck pod was never evicted")
    eventually(
        lambda: len(billing.running()) == 1 and billing.condition("WorkersHealthy").get("status") == "True", timeout=90
    )
    eventually(lambda: sorted(order for order, _ in billing.phases()) == list(range(1, 11)), timeout=60)
    # The evicted pod ends as a kubelet ends it: SIGTERM, its grace period, then removal.
    eventually(lambda: gone(cluster.client, f"/api/v1/namespaces/{namespace}/pods/{stuck}"), timeout=60)


def test_a_pod_admitted_while_the_webhook_was_down_is_healed(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """failurePolicy Ignore: with the operator down, the API server admits a worker pod unchanged — but the pod
    still carries the settings hash its template was stamped with. It is judged by what it carries (no settings),
    and healed: evicted once the operator is back, replaced by a pod the webhook configured."""
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=0, healAfterSeconds=5)
    stamp = eventually(billing.template_hash, timeout=30, message="the operator never stamped the pod template")
    chart_operator.stop()
    cluster.client.merge_patch(billing.deployment, {"spec": {"replicas": 1}})
    [unconfigured] = eventually(billing.pods, timeout=30)
    assert unconfigured["metadata"]["annotations"][HASH] == stamp, "the template's stamp, not the webhook's"
    assert not any(
        variable["name"] == "CELERY_CONFIG_MODULE" for variable in unconfigured["spec"]["containers"][0].get("env", [])
    ), "admitted unchanged: the webhook did not answer"
    chart_operator.start()
    name = unconfigured["metadata"]["name"]
    eventually(lambda: gone(cluster.client, f"/api/v1/namespaces/{namespace}/pods/{name}"), timeout=90)
    [healed] = billing.settled(1).values()
    env = {variable["name"] for variable in healed["spec"]["containers"][0]["env"]}
    assert "CELERY_CONFIG_MODULE" in env


def test_a_webhook_that_hangs_holds_a_pod_only_for_the_charts_timeout(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """The operator's process stopped (SIGSTOP: its port still takes connections, nothing answers): the API server
    waits the chart's `webhook.timeoutSeconds` (5) and, `failurePolicy: Ignore`, admits the pod unchanged — a hung
    operator never blocks a team's deployments for longer. Once it runs again, pods get their settings."""
    billing = Service(cluster, namespace, tmp_path / "handled.jsonl")
    billing.start(test_vhost_url, replicas=0)
    pods = f"/api/v1/namespaces/{namespace}/pods"
    template = worker_deployment(1)["spec"]["template"]

    def create(name: str) -> tuple[dict[str, Any], float]:
        began = time.monotonic()
        pod: dict[str, Any] = cluster.client.create(
            pods,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name}}
            | {"spec": {**template["spec"], "nodeName": "nowhere"}},
        )
        return pod, time.monotonic() - began

    def configured(pod: dict[str, Any]) -> bool:
        return any(
            variable["name"] == "CELERY_CONFIG_MODULE" for variable in pod["spec"]["containers"][0].get("env", [])
        )

    process = chart_operator.process.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        unchanged, waited = create("while-hung")
    finally:
        process.send_signal(signal.SIGCONT)
    assert not configured(unchanged), "admitted unchanged"
    assert 4.5 <= waited < 15, f"the API server waited {waited:.1f} s for the hung webhook (timeoutSeconds 5)"

    def configured_again() -> float | None:
        pod, seconds = create(f"after-{time.monotonic_ns()}")
        return seconds if configured(pod) else None

    waited = eventually(configured_again, timeout=30, message="the webhook never answered again")
    assert waited < 4.5, "the webhook answers again at once"
