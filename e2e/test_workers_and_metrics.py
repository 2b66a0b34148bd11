"""Worker pods on a real cluster: settings injected by the webhook, series gone after a rollout,
and the built-in scaler reacting to a backlog."""

from __future__ import annotations

import json
import re

from e2e.conftest import Kubectl, eventually, live_workers, run_in_service, scrape


def pods(kubectl: Kubectl) -> list[dict[str, object]]:
    items: list[dict[str, object]] = kubectl.json("get", "pods", "-l", "celeryevents.io/service=billing")["items"]
    return items


def test_worker_pods_get_the_settings_injected(kubectl: Kubectl, service_with_workers: None) -> None:
    [pod, *_] = pods(kubectl)
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    env = {item["name"]: item for item in container["env"]}
    assert env["CELERY_BROKER_URL"]["valueFrom"]["secretKeyRef"] == {"name": "rabbitmq", "key": "url"}
    assert env["CELERY_CONFIG_MODULE"]["value"] == "celeryevents_settings"
    assert "celeryevents.io/config-hash" in pod["metadata"]["annotations"]  # type: ignore[index]

    def configured() -> bool:
        status = kubectl.json("get", "ces", "billing")["status"]
        workers = next(c for c in status["conditions"] if c["type"] == "WorkersConfigured")
        return bool(workers["status"] == "True")

    eventually(configured)
    queues = kubectl("exec", "deployment/rabbitmq", "--", "rabbitmqctl", "list_queues", "-q", "name")
    assert "billing.orders.order.created" in queues, "the topology is declared"


def test_rollout_restart_removes_the_old_pods_series(kubectl: Kubectl, service_with_workers: None) -> None:
    def workers_with_series() -> set[str]:
        return {
            match.group(1)
            for line in scrape(kubectl).splitlines()
            if line.startswith("celery_worker_up{") and 'service_name="billing"' in line
            for match in [re.search(r'hostname="([^"]+)"', line)]
            if match
        }

    old = eventually(workers_with_series)
    kubectl("rollout", "restart", "deployment/billing-worker")
    kubectl("rollout", "status", "deployment/billing-worker", "--timeout=180s")

    def only_the_new_pods() -> set[str]:
        # The old pods end with Celery's warm shutdown; the operator drops a pod's series when the pod is gone.
        new = {str(pod["metadata"]["name"]) for pod in live_workers(kubectl)}
        series = workers_with_series()
        return series if series == new and len(new) == 2 else set()

    assert not eventually(only_the_new_pods) & old


def test_a_backlog_scales_the_workers_up(kubectl: Kubectl, service_with_workers: None) -> None:
    kubectl(
        "patch",
        "ces",
        "billing",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "spec": {
                    "statusIntervalSeconds": 5,
                    "autoscaling": {
                        "enabled": True,
                        "minReplicas": 0,
                        "maxReplicas": 3,
                        "messagesPerReplica": 10,
                        "scaleDownStabilizationSeconds": 30,
                    },
                }
            }
        ),
    )
    eventually(lambda: kubectl.json("get", "deployment", "billing-worker")["spec"]["replicas"] == 0)
    produce = "from billing_app import order_created\nfor i in range(100): order_created(i, 1)"
    run_in_service(kubectl, "billing-producer", produce)
    try:
        eventually(lambda: kubectl.json("get", "deployment", "billing-worker")["spec"]["replicas"] == 3, timeout=120)
        scaled = [e["message"] for e in kubectl.json("get", "events")["items"] if e.get("reason") == "Scaled"]
        assert any("from 0 to 3" in message for message in scaled)
    finally:
        kubectl("delete", "pod", "billing-producer", "--ignore-not-found")
