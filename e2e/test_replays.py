"""CeleryEventReplay on a real cluster: the API server's schema and RBAC aggregation (what the emulated API cannot
show), and a replay run by the operator for the sample service's workers."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from e2e.conftest import Kubectl, eventually, run_in_service

ARCHIVE = """
from billing_app import app
from kombu import Exchange
archive = Exchange("billing:archived", type="fanout", no_declare=True)
with app.connection_for_write() as connection:
    producer = connection.Producer()
    for order_id in range(5):
        task_id = f"e2e-replay-{order_id}"
        producer.publish(
            [[order_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
            exchange=archive, routing_key="orders.order.cancelled", serializer="json", declare=[],
            headers={"lang": "py", "task": "orders.order.cancelled", "id": task_id, "root_id": task_id,
                     "parent_id": None, "retries": 3, "x-celery-events-exception-type": "RuntimeError",
                     "x-celery-events-exception": "RuntimeError: refunds are disabled",
                     "x-celery-events-archived-at": 1.0})
"""


def replay(name: str, **spec: object) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "celeryevents.io/v1alpha1",
            "kind": "CeleryEventReplay",
            "metadata": {"name": name},
            "spec": {"serviceRef": {"name": "billing"}, **spec},
        }
    )


@pytest.fixture
def archived_events(kubectl: Kubectl, service_with_workers: None) -> Iterator[None]:
    """Five archived orders.order.cancelled events, published from a pod of the service (settings injected)."""
    run_in_service(kubectl, "billing-archiver", ARCHIVE)
    eventually(lambda: kubectl.json("get", "pod", "billing-archiver")["status"]["phase"] == "Succeeded")
    yield
    kubectl("delete", "pod", "billing-archiver", "--ignore-not-found")


def test_the_operator_replays_archived_events(kubectl: Kubectl, archived_events: None) -> None:
    task_ids = [f"e2e-replay-{n}" for n in range(5)]
    kubectl("create", "-f", "-", stdin=replay("e2e-replay", filter={"taskIds": task_ids}, ratePerSecond=2))
    try:

        def succeeded() -> dict[str, object]:
            status = kubectl.json("get", "cer", "e2e-replay").get("status") or {}
            condition = next((c for c in status.get("conditions", []) if c["type"] == "Succeeded"), {})
            return status if condition.get("status") == "True" else {}

        status = eventually(succeeded)
        assert (status["matched"], status["replayed"], status["remaining"]) == (5, 5, 0)
        reasons = [
            e["reason"]
            for e in kubectl.json("get", "events")["items"]
            if e["involvedObject"].get("name") == "e2e-replay"
        ]
        assert sorted(reasons) == ["Replayed", "Started"]
    finally:
        kubectl("delete", "cer", "e2e-replay", "--ignore-not-found")


def test_the_api_server_refuses_an_unconfirmed_purge_and_a_changed_spec(kubectl: Kubectl) -> None:
    refused = kubectl.run("create", "-f", "-", stdin=replay("e2e-purge", action="purge"))
    assert refused.returncode != 0
    assert "set confirm: true" in refused.stderr
    kubectl("create", "-f", "-", stdin=replay("e2e-dry", action="purge", dryRun=True))
    try:
        changed = kubectl.run("patch", "cer", "e2e-dry", "--type=merge", "-p", json.dumps({"spec": {"limit": 1}}))
        assert changed.returncode != 0
        assert "immutable" in changed.stderr
    finally:
        kubectl("delete", "cer", "e2e-dry", "--ignore-not-found")


def test_namespace_editors_may_replay_and_viewers_may_not(kubectl: Kubectl) -> None:
    """The chart's ClusterRoles aggregate into the built-in edit and view roles."""
    namespace = kubectl.namespace
    for account, role in (("e2e-editor", "edit"), ("e2e-viewer", "view")):
        kubectl("create", "serviceaccount", account)
        kubectl("create", "rolebinding", account, f"--clusterrole={role}", f"--serviceaccount={namespace}:{account}")
    try:

        def can(account: str, verb: str) -> str:
            user = f"system:serviceaccount:{namespace}:{account}"
            return kubectl.run(
                "auth", "can-i", verb, "celeryeventreplays.celeryevents.io", f"--as={user}"
            ).stdout.strip()

        eventually(lambda: can("e2e-editor", "create") == "yes")
        assert can("e2e-viewer", "list") == "yes"
        assert can("e2e-viewer", "create") == "no"
    finally:
        for account in ("e2e-editor", "e2e-viewer"):
            kubectl("delete", "rolebinding", account, "--ignore-not-found")
            kubectl("delete", "serviceaccount", account, "--ignore-not-found")
