"""Every feature of the real operator under the chart's RBAC, as a cluster enforces it (issue 26).

The emulated API decides the operator's requests with the Roles, ClusterRoles and bindings the real Helm
engine renders (created in the API, as `helm install` creates them), for the identity of the chart's
ServiceAccount, and runs the OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift and in
clusters that enable it). The operator runs with the rendered args and mounts, one process per replica. For
each variant of the chart's RBAC (cluster-wide or per namespace, one replica or a peering of two): Ready, the
rollout stamp, the webhook, healing by eviction, autoscaling through /scale and deletion with deletionPolicy
delete — with no request refused, and every request one of kubeapi.API_CALLS.

What cannot exist here and is stood in for: the kubelet and in-cluster credentials (as in
test_chart_variants.py: the test starts the container's command, with a kubeconfig holding a token of the
ServiceAccount's identity), the PodSet controller and the API server's call of the webhook (the test
creates the pods, admitted through the operator's webhook over the Service's TLS as the API server would).
"""

from __future__ import annotations

import base64
import functools
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from celery_event_devcluster import jsonpatch, owner_references
from celery_event_devcluster.rbac import Identity
from celery_event_operator.adapters.kubeapi import API_CALLS
from celery_event_operator.core.api import metadata
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_webhook import worker_pod
from tests.integration.test_chart_variants import NAMESPACE, Pod, of_kind, render, webhook_answer
from tests.integration.test_chart_variants import webhook_secrets as rendered_secrets
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, KubeClient, eventually, gone, install_crds
from tests.support.operator_process import admission_review
from tests.support.waiting import stays

HASH = metadata.HASH_ANNOTATION
LABELS = {metadata.SERVICE_LABEL: "billing"}
RBAC_KINDS = {"ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings"}
NAMESPACED_RBAC_KINDS = {"Role": "roles", "RoleBinding": "rolebindings"}
VARIANTS = [
    pytest.param({}, id="defaults"),
    pytest.param({"watchNamespaces": ["shop"]}, id="watchNamespaces"),
    pytest.param({"replicaCount": 2}, id="replicaCount=2"),
    pytest.param({"watchNamespaces": ["shop"], "replicaCount": 2}, id="both"),
]


def install(api: EmulatedApi, documents: list[dict[str, Any]], crd_installed: dict[str, Any]) -> None:
    """What `helm install` creates that the API serves: the CRDs not installed yet (kopf's peerings), and the RBAC
    objects."""
    install_crds(api, of_kind(documents, "CustomResourceDefinition"))
    for document in documents:
        base = "/apis/rbac.authorization.k8s.io/v1"
        if document["kind"] in RBAC_KINDS:
            api.client.create(f"{base}/{RBAC_KINDS[document['kind']]}", document)
        elif document["kind"] in NAMESPACED_RBAC_KINDS:
            namespace = document["metadata"]["namespace"]
            api.client.create(f"{base}/namespaces/{namespace}/{NAMESPACED_RBAC_KINDS[document['kind']]}", document)


def service(namespace: str) -> dict[str, Any]:
    body = billing_sample()
    body["metadata"] = {"name": "billing", "namespace": namespace}
    body["spec"] |= {
        "deletionPolicy": "delete",
        "statusIntervalSeconds": 1,
        "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 5},
    }
    body["spec"]["workers"] |= {"healAfterSeconds": 5}
    return body


def condition(client: KubeClient, path: str, type: str) -> dict[str, Any]:
    found: dict[str, Any] = next(
        (c for c in (client.get(path).get("status") or {}).get("conditions", []) if c["type"] == type), {}
    )
    return found


@pytest.fixture
def replicas() -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for replica in started:
        replica.stop()


@pytest.mark.parametrize("values", VARIANTS)
def test_every_feature_works_under_the_charts_rbac_and_the_owner_reference_rule(
    values: dict[str, Any],
    kube_api: EmulatedApi,
    crd_installed: dict[str, Any],
    test_vhost_url: str,
    test_vhost: str,
    rabbitmq_management: rabbitmq.Management,
    replicas: list[Pod],
    tmp_path: pathlib.Path,
) -> None:
    documents = render(values)
    install(kube_api, documents, crd_installed)
    [deployment] = of_kind(documents, "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    identity = Identity.service_account(NAMESPACE, account)
    kubeconfig = kube_api.restricted_kubeconfig(identity, tmp_path / "service-account.kubeconfig")
    kube_api.admit(owner_references.NAME)
    secrets, ca_bundle = rendered_secrets(documents, tmp_path)
    for index in range(deployment["spec"]["replicas"]):
        replicas.append(Pod(deployment, secrets, tmp_path / f"pod-{index}", kubeconfig))
    for replica in replicas:
        eventually(replica.ready, timeout=30, message="the operator never became Ready")

    try:
        exercise(kube_api, values, documents, ca_bundle, replicas, test_vhost_url, test_vhost, rabbitmq_management)
    except BaseException:
        for replica in replicas:
            print(f"--- {replica.log} ---\n{replica.log.read_text(errors='replace')[-15000:]}")
        print(f"refused: {refused(kube_api)}")
        raise

    assert not refused(kube_api), f"requests of the operator were refused: {refused(kube_api)}"
    asked = kube_api.asked()
    assert {a.user for a in asked} == {identity.user}
    unlisted = {a.call for a in asked} - set(API_CALLS)
    assert not unlisted, f"calls missing from kubeapi.API_CALLS (and so from the chart's RBAC test): {unlisted}"


def refused(api: EmulatedApi) -> set[str]:
    return {f"{a.verb} {a.group}/{a.resource} in {a.namespace!r}: {a.refused_by}" for a in api.asked() if a.refused_by}


def exercise(
    api: EmulatedApi,
    values: dict[str, Any],
    documents: list[dict[str, Any]],
    ca_bundle: str,
    replicas: list[Pod],
    broker_url: str,
    vhost: str,
    management: rabbitmq.Management,
) -> None:
    namespace = (values.get("watchNamespaces") or ["default"])[0]
    client = api.client
    services = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
    workload = f"/apis/apps/v1/namespaces/{namespace}/deployments/billing-worker"
    pods = f"/api/v1/namespaces/{namespace}/pods"
    create_broker_secret(api, broker_url, namespace)
    client.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        yaml.safe_load((REPO / "examples" / "billing-worker.yaml").read_text()),
    )
    client.create(services, service(namespace))

    def ready() -> dict[str, Any]:
        found = condition(client, f"{services}/billing", "Ready")
        assert found.get("status") == "True", found  # shown as the last state when it never is
        return found

    def stamp() -> str | None:
        return (client.get(workload)["spec"]["template"]["metadata"].get("annotations") or {}).get(HASH)

    eventually(ready, timeout=40, message="never Ready")
    first = eventually(stamp, timeout=10, message="no rollout stamp on the workers' pod template")
    client.merge_patch(f"{services}/billing", {"spec": {"retry": {"maxRetries": 3}}})  # new settings: a rollout
    eventually(lambda: stamp() not in (None, first), timeout=20, message="the new settings were not rolled out")
    eventually(lambda: client.get(workload)["spec"]["replicas"] == 3, timeout=20, message="not scaled to minReplicas")

    # The webhook, as its Service reaches it: any replica may answer.
    def configured_by(replica: Pod) -> dict[str, Any]:
        return admitted(documents, replica, ca_bundle, namespace, "billing-worker-configured")

    admitted_by = [
        eventually(functools.partial(configured_by, replica), timeout=20, message="the webhook injected nothing")
        for replica in replicas
    ]
    client.create(pods, admitted_by[0])
    # Admitted while no webhook answered (failurePolicy Ignore): healed by eviction.
    unconfigured = worker_pod(LABELS) | {
        "metadata": {"name": "billing-worker-unconfigured", "namespace": namespace, "labels": LABELS}
    }
    client.create(pods, unconfigured)
    eventually(
        lambda: gone(client, f"{pods}/billing-worker-unconfigured"), timeout=40, message="the pod was not evicted"
    )
    stays(lambda: not gone(client, f"{pods}/billing-worker-configured"), seconds=2, message="a healthy pod went")

    client.delete(f"{services}/billing")
    eventually(lambda: gone(client, f"{services}/billing"), timeout=30, message="the service was not released")
    assert rabbitmq.snapshot(management, vhost)["queues"] == {}, "deletionPolicy delete left queues"


def admitted(
    documents: list[dict[str, Any]], replica: Pod, ca_bundle: str, namespace: str, name: str
) -> dict[str, Any]:
    """A pod as the API server stores it after the webhook's patch (with the settings' hash)."""
    pod = worker_pod(LABELS) | {"metadata": {"name": name, "namespace": namespace, "labels": LABELS}}
    response = webhook_answer(documents, replica.ports, ca_bundle, admission_review(pod, namespace))["response"]
    assert response["allowed"] is True
    assert "patch" in response, response
    patched: dict[str, Any] = jsonpatch.apply(pod, json.loads(base64.b64decode(response["patch"])))
    assert HASH in patched["metadata"]["annotations"]
    return patched
