"""What people and replicas do on the real API server: a namespace editor (bound to the built-in `edit`
ClusterRole, which the chart's rules join through the ClusterRole aggregation controller) creates and reads
replays; two operator replicas of the chart meet in a kopf peering and the standby takes over when the active
one is killed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_webhook import admitted
from tests.support.cluster import ChartOperator, Cluster, peering_state
from tests.support.kube import condition, eventually
from tests.support.operator_process import OperatorProcess, worker_pod

TAKEOVER_LIMIT_SECONDS = 40  # the peering lifetime (15 s) plus a resync and kopf's re-listing, with margin


def injects(replica: OperatorProcess, namespace: str) -> bool:
    labels = {"celeryevents.io/service": "billing"}
    pod = worker_pod(labels) | {"metadata": {"name": "w", "namespace": namespace, "labels": labels}}
    patched, _ = admitted(replica, pod)
    return "celeryevents.io/config-hash" in patched["metadata"].get("annotations", {})


def ready_service(cluster: Cluster, namespace: str, broker_url: str) -> str:
    create_broker_secret(cluster, broker_url, namespace)  # type: ignore[arg-type]
    path = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
    cluster.client.create(path, billing_sample())
    eventually(
        lambda: condition(cluster, "Ready", namespace=namespace).get("status") == "True",  # type: ignore[arg-type]
        timeout=60,
    )
    return f"{path}/billing"


def test_a_namespace_editor_creates_and_reads_replays(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str
) -> None:
    ready_service(cluster, namespace, test_vhost_url)
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "alice-edits"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }
    cluster.client.create(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings", binding)
    as_alice = ("-n", namespace, "--as=alice")
    eventually(
        lambda: (
            cluster.kubectl("auth", "can-i", "create", "celeryeventreplays", *as_alice, check=False).stdout.strip()
            == "yes"
        ),
        timeout=30,
        message="the chart's replay rules never joined `edit`",
    )
    created = cluster.kubectl("create", "-f", str(REPO / "examples" / "billing-replay.yaml"), *as_alice)
    name = created.stdout.split()[0].split("/")[-1]
    replays = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventreplays"

    def succeeded() -> dict[str, Any]:
        conditions = (cluster.client.get(f"{replays}/{name}").get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Succeeded" and c["status"] == "True"), {})

    eventually(succeeded, timeout=60, message="the editor's replay never ran")
    table = cluster.kubectl("get", "cer", *as_alice).stdout
    assert name in table
    # Editors replay through the operator: the broker's Secret is not theirs to need, and they cannot change the
    # operator's own objects.
    assert (
        cluster.kubectl("auth", "can-i", "update", "celeryeventservices/status", *as_alice, check=False).stdout.strip()
        == "no"
    )


@pytest.mark.parametrize("chart_operator", [{"replicaCount": 2}], indirect=True)
def test_two_replicas_of_the_chart_hand_over_on_the_real_api(
    cluster: Cluster, namespace: str, chart_operator: ChartOperator, test_vhost_url: str
) -> None:
    # The service comes once the replicas have met; the paused standby does nothing from then on.
    active, standby = chart_operator.peered()
    standby_before = len(standby.log())
    service = ready_service(cluster, namespace, test_vhost_url)
    assert peering_state(standby) == "standby"
    assert f"/namespaces/{namespace}/" not in standby.log()[standby_before:], "the paused standby touched the service"
    for replica in (active, standby):  # every replica answers the webhook, the standby's kopf paused
        eventually(lambda replica=replica: injects(replica, namespace), timeout=10, message="a replica's webhook")
    assert active.process is not None
    active.process.kill()  # SIGKILL: no goodbye in the peering
    killed_at = time.monotonic()
    cluster.client.merge_patch(service, {"spec": {"retry": {"maxRetries": 3}}})
    eventually(
        lambda: cluster.client.get(service).get("status", {}).get("observedGeneration") == 2,
        timeout=TAKEOVER_LIMIT_SECONDS,
        message="the standby did not take over",
    )
    print(f"takeover after SIGKILL: {time.monotonic() - killed_at:.1f} s")
    assert "Resuming operations after the pause" in standby.log()
    assert injects(standby, namespace), "the webhook answers throughout"
    # The settings of generation 2 reached the ConfigMap through the standby.
    configmap = cluster.client.get(f"/api/v1/namespaces/{namespace}/configmaps/billing-celery-events")
    assert '"billing:retry.2"' in configmap["data"]["settings.json"]
