"""Worker pods on a real cluster: settings injected by the webhook, series gone after a rollout,
and the built-in scaler reacting to a backlog."""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Iterator

import pytest
import yaml

from e2e.conftest import Kubectl, eventually, scrape

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
WORKER_IMAGE = os.environ.get("E2E_WORKER_IMAGE", "billing-worker:e2e")


def worker_manifest() -> str:
    deployment = yaml.safe_load((EXAMPLES / "billing-worker.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = WORKER_IMAGE, "Never"
    return yaml.safe_dump(deployment)


def pods(kubectl: Kubectl) -> list[dict[str, object]]:
    items: list[dict[str, object]] = kubectl.json("get", "pods", "-l", "celeryevents.io/service=billing")["items"]
    return items


@pytest.fixture
def service_with_workers(kubectl: Kubectl) -> Iterator[None]:
    kubectl("apply", "-f", str(EXAMPLES / "billing.yaml"))
    kubectl("apply", "-f", "-", stdin=worker_manifest())
    kubectl("rollout", "status", "deployment/billing-worker", "--timeout=180s")
    yield
    kubectl("delete", "deployment", "billing-worker", "--ignore-not-found")
    kubectl("delete", "-f", str(EXAMPLES / "billing.yaml"), "--ignore-not-found", "--timeout=60s")


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
        return set(re.findall(r'celery_worker_up\{[^}]*service_name="billing",hostname="([^"]+)"', scrape(kubectl)))

    old = eventually(workers_with_series)
    kubectl("rollout", "restart", "deployment/billing-worker")
    kubectl("rollout", "status", "deployment/billing-worker", "--timeout=180s")
    new = {str(pod["metadata"]["name"]) for pod in pods(kubectl)}  # type: ignore[index]
    eventually(lambda: workers_with_series() and workers_with_series() <= new)
    assert not workers_with_series() & old


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
    kubectl(
        "run",
        "billing-producer",
        "--restart=Never",
        f"--image={WORKER_IMAGE}",
        "--image-pull-policy=Never",
        "--labels=celeryevents.io/service=billing",
        "--command",
        "--",
        "python",
        "-c",
        "from billing_app import order_created\nfor i in range(100): order_created(i, 1)",
    )
    try:
        eventually(lambda: kubectl.json("get", "deployment", "billing-worker")["spec"]["replicas"] == 3, timeout=120)
        scaled = [e["message"] for e in kubectl.json("get", "events")["items"] if e.get("reason") == "Scaled"]
        assert any("from 0 to 3" in message for message in scaled)
    finally:
        kubectl("delete", "pod", "billing-producer", "--ignore-not-found")
