"""Every feature of the operator under the chart's RBAC, decided by the real API server's RBAC authoriser and
OwnerReferencesPermissionEnforcement (moved here from the emulator, issue 32): for each variant of the chart's RBAC
(cluster-wide or per namespace, one replica or a peering of two), Ready, the rollout stamp, the webhook called by
the API server, autoscaling through /scale and deletion with deletionPolicy delete (an eviction under the chart's
RBAC: test_workers_on_cluster.py's stuck worker) — and the
API server's audit log shows no request of the operator refused and every request one of kubeapi.API_CALLS.

Mocked: the kubelet (pods are reported Running without a process: no worker needs to run here).
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from celery_event_operator.adapters.kubeapi import API_CALLS
from celery_event_operator.core.api import metadata
from tests.conftest import billing_sample, create_broker_secret
from tests.integration.cluster.test_workers_on_cluster import worker_deployment
from tests.support import rabbitmq
from tests.support.cluster import ChartOperator, Cluster, lines_of
from tests.support.kube import condition, eventually, gone

HASH = metadata.HASH_ANNOTATION
WATCHED = "<the test's namespace>"
VARIANTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"watchNamespaces": [WATCHED]}, id="watchNamespaces"),
    pytest.param({"replicaCount": 2}, id="replicaCount=2"),
]


def service() -> dict[str, Any]:
    body = billing_sample()
    body["spec"] |= {
        "deletionPolicy": "delete",
        "statusIntervalSeconds": 1,
        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 5},
    }
    body["spec"]["workers"] |= {"healAfterSeconds": 5}
    return body


@pytest.mark.parametrize("values", VARIANTS)
def test_every_feature_works_under_the_charts_rbac_with_no_request_refused(
    values: dict[str, Any],
    cluster: Cluster,
    namespace: str,
    test_vhost_url: str,
    test_vhost: str,
    rabbitmq_management: rabbitmq.Management,
    tmp_path: pathlib.Path,
) -> None:
    values = {**values, "watchNamespaces": [namespace for _ in values.get("watchNamespaces", [])]}
    chart = ChartOperator(cluster, values, tmp_path).install()
    try:
        chart.start_all()
        if values.get("replicaCount", 1) > 1:
            chart.peered()  # replicas starting meanwhile hand over: the users' changes come once they have met
        exercise(cluster, namespace, test_vhost_url, test_vhost, rabbitmq_management)
    except BaseException:
        for log in sorted(tmp_path.glob("operator-*.log")):
            print(f"--- {log.name} (lines of {namespace} or none) ---")
            print(lines_of(log.read_text(errors="replace"), namespace)[-60000:])
        raise
    finally:
        chart.stop()
        chart.uninstall()
    account = chart.deployments[0]["spec"]["template"]["spec"]["serviceAccountName"]
    user = f"system:serviceaccount:{chart.namespace}:{account}"
    requests = [entry for entry in cluster.audit(user) if "objectRef" in entry]
    refused = {
        f"{e['verb']} {e['objectRef'].get('apiGroup', '')}/{resource(e)} in {e['objectRef'].get('namespace')!r}"
        for e in requests
        if e.get("responseStatus", {}).get("code") == 403
        # Not the authoriser: an Event about another test's resource, posted as its namespace goes (the
        # NamespaceLifecycle admission refuses new content there, to anyone; those tests' operators share this
        # ServiceAccount's name).
        and "because it is being terminated" not in e["responseStatus"].get("message", "")
    }
    assert not refused, f"requests of the operator were refused: {refused}"
    asked = {(e["objectRef"].get("apiGroup", ""), resource(e), e["verb"]) for e in requests}
    # The lifecycle's writes are among them: the audit is the operator's own record.
    assert {
        ("apps", "deployments/scale", "patch"),
        ("apps", "deployments", "patch"),
    } <= asked
    unlisted = asked - set(API_CALLS)
    assert not unlisted, f"calls missing from kubeapi.API_CALLS (and so from the chart's RBAC test): {unlisted}"
    # Nothing over-granted: what the operator never needs, the API refuses it.
    for verb, what in (("delete", "pods"), ("create", "deployments"), ("list", "secrets"), ("update", "configmaps")):
        answer = cluster.kubectl("auth", "can-i", verb, what, "-n", namespace, f"--as={user}", check=False)
        assert answer.stdout.strip() == "no", f"{verb} {what} is granted"


def resource(entry: dict[str, Any]) -> str:
    ref = entry["objectRef"]
    return f"{ref['resource']}/{ref['subresource']}" if ref.get("subresource") else str(ref["resource"])


def exercise(cluster: Cluster, namespace: str, broker_url: str, vhost: str, management: rabbitmq.Management) -> None:
    client = cluster.client
    services = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
    workload = f"/apis/apps/v1/namespaces/{namespace}/deployments/billing-worker"
    pods = f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3Dbilling-worker"
    create_broker_secret(cluster, broker_url, namespace)  # type: ignore[arg-type]
    # Workers that come before their service: admitted without settings (the webhook knows no service yet).
    client.create(f"/apis/apps/v1/namespaces/{namespace}/deployments", worker_deployment(1))
    [unconfigured] = eventually(lambda: [p["metadata"]["name"] for p in client.get(pods)["items"]], timeout=30)
    client.create(services, service())

    def ready() -> dict[str, Any]:
        found = condition(cluster, "Ready", namespace=namespace)  # type: ignore[arg-type]
        assert found.get("status") == "True", found  # shown as the last state when it never is
        return found

    def stamp() -> str | None:
        return (client.get(workload)["spec"]["template"]["metadata"].get("annotations") or {}).get(HASH)

    eventually(ready, timeout=60, message="never Ready")
    first = eventually(stamp, timeout=20, message="no rollout stamp on the workers' pod template")
    eventually(lambda: client.get(workload)["spec"]["replicas"] == 3, timeout=30, message="not scaled to minReplicas")
    # The pod admitted before its service goes (replaced by the stamp's rollout, or healed by eviction), and the
    # Deployment's pods are the webhook's.
    eventually(lambda: gone(client, f"/api/v1/namespaces/{namespace}/pods/{unconfigured}"), timeout=60)
    configured = eventually(
        lambda: (
            len(items := [p for p in client.get(pods)["items"] if not p["metadata"].get("deletionTimestamp")]) == 3
            and items
        ),
        timeout=60,
    )
    assert all(HASH in (p["metadata"].get("annotations") or {}) for p in configured)
    client.merge_patch(f"{services}/billing", {"spec": {"retry": {"maxRetries": 3}}})  # new settings: a rollout
    eventually(lambda: stamp() not in (None, first), timeout=30, message="the new settings were not rolled out")

    client.delete(f"{services}/billing")
    eventually(lambda: gone(client, f"{services}/billing"), timeout=60, message="the service was not released")
    assert rabbitmq.snapshot(management, vhost)["queues"] == {}, "deletionPolicy delete left queues"
