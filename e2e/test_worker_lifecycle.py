"""The workers' lifecycle on a real cluster: the ReplicaSet controller, told by the operator's deletion costs,
removes the idle worker on a scale-down and keeps the one running a long task (the emulated API has no
ReplicaSet controller: the integration suite checks the annotations, this suite the controller's choice)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from e2e.conftest import Kubectl, deploy_billing, eventually, run_in_service, worker_manifest

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def worker_costs(kubectl: Kubectl) -> dict[str, int]:
    """The live worker pods (not the producer) and their deletion costs."""
    items = kubectl.json("get", "pods", "-l", "app=billing-worker")["items"]
    return {
        pod["metadata"]["name"]: int((pod["metadata"].get("annotations") or {}).get(DELETION_COST, "0"))
        for pod in items
        if not pod["metadata"].get("deletionTimestamp")
    }


@pytest.fixture
def slow_workers(kubectl: Kubectl) -> Iterator[None]:
    """Two workers of one process each, whose invoices take two minutes."""
    deployment = yaml.safe_load(worker_manifest(kubectl))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["command"] += ["--concurrency=1"]
    container["env"] = [{"name": "BILLING_INVOICE_SECONDS", "value": "120"}]
    deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 150
    yield from deploy_billing(kubectl, yaml.safe_dump(deployment))


def test_a_scale_down_removes_the_idle_worker_and_keeps_the_busy_one(kubectl: Kubectl, slow_workers: None) -> None:
    run_in_service(kubectl, "billing-producer", "from billing_app import order_created\norder_created(1, 100)")
    try:

        def busy_pod() -> str | None:
            costs = worker_costs(kubectl)
            busy = [name for name, cost in costs.items() if cost > 0]
            return busy[0] if len(busy) == 1 and len(costs) == 2 else None

        busy = eventually(busy_pod, timeout=90)
        kubectl("scale", "deployment/billing-worker", "--replicas=1")
        eventually(lambda: list(worker_costs(kubectl)) == [busy])
    finally:
        kubectl("delete", "pod", "billing-producer", "--ignore-not-found")
