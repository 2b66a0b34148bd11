"""The emulator (the dev mode's Kubernetes API) answers as the real API server does, for the requests the dev mode
relies on (kopf's, the operator's, kubectl's): the same script of requests is sent to both, and what each answer
says (status codes, the fields the clients read, kubectl's output) must be the same. A difference is a bug of the
emulator, fixed there, or one documented in devcluster/celery_event_devcluster/emulator.py's docstring and listed
here by name (KNOWN_DIFFERENCES), so that the emulator cannot drift unnoticed."""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any

from celery_event_operator.core.api import crd
from tests.support.cluster import Cluster
from tests.support.kube import CRDS, ApiError, EmulatedApi, KubeClient

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


# Differences the dev mode lives with, each documented in emulator.py's docstring and docs/development.md.
KNOWN_DIFFERENCES = {
    # The emulator applies no structural-schema defaults (it validates no schema): the operator applies its
    # models' defaults itself when it reads a spec, so the dev mode behaves the same.
    "schema defaults",
}


def answer(call: Callable[[], Any]) -> Any:
    """An answer as the observations compare it: the body, or the error's code, reason and kind."""
    try:
        return call()
    except ApiError as exc:
        return {"code": exc.status, "reason": exc.body.get("reason"), "kind": exc.body.get("kind")}


def watched(client: KubeClient, path: str, version: str) -> list[tuple[str, str]]:
    request = urllib.request.Request(
        f"{client.server_url}{path}?watch=true&timeoutSeconds=1&resourceVersion={version}", headers=client.headers
    )
    with urllib.request.urlopen(request, timeout=10, context=client.context) as response:
        lines = [json.loads(line) for line in response.read().splitlines() if line]
    return [(event["type"], event["object"]["metadata"]["name"]) for event in lines]


def script(client: KubeClient, kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """What the dev mode's clients see of each request, by step."""
    seen: dict[str, Any] = {}
    services = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    body = {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": "billing"},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "workers": {"scaleTargetRef": {"name": "w"}, "replicas": 1},
        },
    }
    created = client.create(services, body)
    meta = created["metadata"]
    seen["create: server fields"] = (
        meta["namespace"] == namespace,
        bool(meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"]),
        meta["generation"],
    )
    seen["create again"] = answer(lambda: client.create(services, body))
    changed = client.merge_patch(f"{services}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    seen["spec patch: generation"] = changed["metadata"]["generation"]
    seen["spec patch: newer resourceVersion"] = int(changed["metadata"]["resourceVersion"]) > int(
        meta["resourceVersion"]
    )
    labelled = client.merge_patch(f"{services}/billing", {"metadata": {"labels": {"a": "b"}}})
    seen["metadata patch: generation"] = labelled["metadata"]["generation"]
    status = client.merge_patch(f"{services}/billing/status", {"status": {"observedGeneration": 2}})
    seen["status patch"] = (status["status"]["observedGeneration"], status["metadata"]["generation"])
    seen["schema defaults"] = (created["spec"].get("retry"), status["status"].get("conditions"))
    ignored = client.merge_patch(f"{services}/billing", {"status": {"observedGeneration": 99}, "spec": {}})
    seen["status through the main resource"] = ignored["status"]["observedGeneration"]
    noop = client.merge_patch(f"{services}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    seen["no-op patch keeps resourceVersion"] = (
        noop["metadata"]["resourceVersion"] == ignored["metadata"]["resourceVersion"]
    )
    version = noop["metadata"]["resourceVersion"]
    test_version = {"op": "test", "path": "/metadata/resourceVersion", "value": version}
    finalized = client.json_patch(
        f"{services}/billing", [test_version, {"op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"]}]
    )
    seen["json patch"] = finalized["metadata"]["finalizers"]
    seen["json patch, stale"] = answer(
        lambda: client.json_patch(
            f"{services}/billing", [test_version, {"op": "remove", "path": "/metadata/finalizers"}]
        )
    )
    scale = client.get(f"{services}/billing/scale")
    seen["scale"] = (scale["kind"], scale["apiVersion"], scale["spec"]["replicas"])
    kubectl("scale", "ces", "billing", "-n", namespace, "--replicas=4")
    seen["kubectl scale"] = client.get(f"{services}/billing")["spec"]["workers"]["replicas"]
    seen["printer columns"] = kubectl("get", "ces", "-n", namespace).stdout.splitlines()[0].split()
    client.delete(f"{services}/billing")
    seen["held by a finalizer"] = bool(client.get(f"{services}/billing")["metadata"].get("deletionTimestamp"))
    client.merge_patch(f"{services}/billing", {"metadata": {"finalizers": None}})
    seen["gone"] = answer(lambda: client.get(f"{services}/billing"))

    first = client.create(configmaps, {"metadata": {"name": "a", "labels": {"app": "x"}}, "data": {}})
    client.create(configmaps, {"metadata": {"name": "b"}, "data": {}})
    listed = client.get(f"{configmaps}?labelSelector=app%3Dx")
    seen["list"] = (listed["apiVersion"], listed["kind"], [item["metadata"]["name"] for item in listed["items"]])
    seen["watch from a version"] = watched(client, configmaps, first["metadata"]["resourceVersion"])
    secret = client.create(
        f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": "s"}, "stringData": {"url": "amqp://x/é"}}
    )
    seen["secret stringData"] = (
        secret["type"],
        base64.b64decode(secret["data"]["url"]).decode(),
        "stringData" in secret,
    )
    seen["kubectl: not found"] = kubectl("get", "configmap", "nope", "-n", namespace, check=False).stderr.strip()
    kubectl("create", "configmap", "c1", "-n", namespace, "--from-literal=k=v")
    seen["kubectl create configmap"] = client.get(f"{configmaps}/c1")["data"]
    return seen


def test_the_emulator_answers_as_the_real_api_server(cluster: Cluster, tmp_path: pathlib.Path) -> None:
    cluster.apply(list(crd.custom_resource_definitions()), tmp_path / "crds.yaml")
    for definition in crd.custom_resource_definitions():
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{definition['metadata']['name']}")
    namespace = cluster.create_namespace("conformance")
    try:
        real = script(cluster.client, cluster.kubectl, namespace)
    finally:
        cluster.client.delete(f"/api/v1/namespaces/{namespace}")
    with EmulatedApi(tmp_path / "emulator.kubeconfig") as emulator:
        for definition in crd.custom_resource_definitions():
            emulator.client.create(CRDS, definition)
        emulated = script(emulator.client, emulator.kubectl, namespace)
    differences = {
        step: (emulated[step], real[step])
        for step in real
        if emulated.get(step) != real[step] and step not in KNOWN_DIFFERENCES
    }
    # A known difference that went away is struck off the list.
    assert all(emulated[step] != real[step] for step in KNOWN_DIFFERENCES), "a known difference is gone"
    assert not differences, "emulator ≠ API server:\n" + "\n".join(
        f"{step}: emulator {mine!r}, API server {theirs!r}" for step, (mine, theirs) in differences.items()
    )
