"""The emulated API behaves as the real one where kopf and kubectl depend on it (over HTTP only)."""

from __future__ import annotations

import base64
import collections
import json
import pathlib
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
import yaml

from celery_event_devcluster.rbac import Identity
from tests.conftest import REPO, create_broker_secret
from tests.support.kube import ApiError, EmulatedApi, eventually

CES = "/apis/celeryevents.io/v1alpha1/namespaces/shop/celeryeventservices"
CMS = "/api/v1/namespaces/shop/configmaps"


def service(name: str = "billing", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name},
        "spec": {"broker": {"secretRef": {"name": "rabbitmq"}}, **spec},
    }


def test_create_fills_server_fields(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    created = kube_api.client.create(CES, service())
    meta = created["metadata"]
    assert meta["namespace"] == "shop", "namespace comes from the URL"
    assert meta["uid"]
    assert meta["creationTimestamp"]
    assert meta["resourceVersion"]
    assert meta["generation"] == 1
    with pytest.raises(ApiError) as conflict:
        kube_api.client.create(CES, service())
    assert conflict.value.status == 409


def test_generation_and_resource_version(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    client = kube_api.client
    rv0 = client.create(CES, service())["metadata"]["resourceVersion"]
    spec_changed = client.merge_patch(f"{CES}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    assert spec_changed["metadata"]["generation"] == 2
    assert int(spec_changed["metadata"]["resourceVersion"]) > int(rv0)
    labelled = client.merge_patch(f"{CES}/billing", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 2, "metadata changes do not bump generation"
    status = client.merge_patch(f"{CES}/billing/status", {"status": {"observedGeneration": 2}})
    assert status["status"] == {"observedGeneration": 2}
    assert status["metadata"]["generation"] == 2
    ignored = client.merge_patch(f"{CES}/billing", {"status": {"observedGeneration": 99}, "spec": {}})
    assert ignored["status"] == {"observedGeneration": 2}, "status is written only through /status"
    noop = client.merge_patch(f"{CES}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    assert noop["metadata"]["resourceVersion"] == ignored["metadata"]["resourceVersion"]


def test_json_patch_with_optimistic_concurrency(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    client = kube_api.client
    rv = client.create(CES, service())["metadata"]["resourceVersion"]
    added = client.json_patch(
        f"{CES}/billing",
        [
            {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
            {"op": "add", "path": "/metadata/finalizers", "value": ["celeryevents.io/finalizer"]},
        ],
    )
    assert added["metadata"]["finalizers"] == ["celeryevents.io/finalizer"]
    with pytest.raises(ApiError) as stale:
        client.json_patch(
            f"{CES}/billing",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "remove", "path": "/metadata/finalizers"},
            ],
        )
    assert stale.value.status == 422, "a failed test is Unprocessable Entity, which kopf retries"


def test_finalizers_hold_deletion(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    client = kube_api.client
    client.create(CES, {**service(), "metadata": {"name": "billing", "finalizers": ["x/y"]}})
    client.delete(f"{CES}/billing")
    held = client.get(f"{CES}/billing")
    assert held["metadata"]["deletionTimestamp"]
    client.merge_patch(f"{CES}/billing", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiError) as gone:
        client.get(f"{CES}/billing")
    assert gone.value.status == 404


def test_crd_is_served_after_creation(kube_api: EmulatedApi) -> None:
    with pytest.raises(ApiError):
        kube_api.client.get("/apis/celeryevents.io/v1alpha1")
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "crds"))
    resources = kube_api.client.get("/apis/celeryevents.io/v1alpha1")["resources"]
    main = next(r for r in resources if r["name"] == "celeryeventservices")
    assert main["shortNames"] == ["celeryevents", "ces"]
    assert {r["name"] for r in resources} >= {"celeryeventservices/status", "celeryeventservices/scale"}
    assert "ces" in kube_api.kubectl("api-resources").stdout


def test_lists_are_typed_and_filtered(kube_api: EmulatedApi) -> None:
    client = kube_api.client
    client.create(CMS, {"metadata": {"name": "a", "labels": {"app": "x"}}, "data": {}})
    client.create(CMS, {"metadata": {"name": "b"}, "data": {}})
    listed = client.get(CMS)
    assert (listed["apiVersion"], listed["kind"]) == ("v1", "ConfigMapList")
    assert [item["metadata"]["name"] for item in listed["items"]] == ["a", "b"]
    assert [i["metadata"]["name"] for i in client.get(CMS + "?labelSelector=app%3Dx")["items"]] == ["a"]


def test_secret_string_data_is_stored_encoded(kube_api: EmulatedApi) -> None:
    secret = kube_api.client.create(
        "/api/v1/namespaces/shop/secrets", {"metadata": {"name": "s"}, "stringData": {"url": "amqp://h/"}}
    )
    assert secret["data"] == {"url": "YW1xcDovL2gv"}
    assert "stringData" not in secret


def test_watch_streams_json_lines_since_a_version(kube_api: EmulatedApi) -> None:
    client = kube_api.client
    first = client.create(CMS, {"metadata": {"name": "a"}, "data": {}})
    client.create(CMS, {"metadata": {"name": "b"}, "data": {}})
    url = f"{kube_api.url}{CMS}?watch=true&timeoutSeconds=1&resourceVersion={first['metadata']['resourceVersion']}"
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.headers["Content-Type"] == "application/json"
        events = [json.loads(line) for line in response.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "b")]


def watched_since(api: EmulatedApi, path: str, version: str, query: str = "") -> list[dict[str, Any]]:
    url = f"{api.url}{path}?watch=true&timeoutSeconds=1&resourceVersion={version}{query}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return [json.loads(line) for line in response.read().splitlines() if line]


def test_a_watch_from_a_listed_version_replays_a_deletion_in_between(kube_api: EmulatedApi) -> None:
    """Issue #16: `kubectl delete` lists, then watches from the list's version; a deletion in that gap was never
    sent, and kubectl waited forever."""
    client = kube_api.client
    client.create(CMS, {"metadata": {"name": "a"}, "data": {}})
    listed = client.get(f"{CMS}?fieldSelector=metadata.name%3Da")["metadata"]["resourceVersion"]
    client.delete(f"{CMS}/a")
    events = watched_since(kube_api, CMS, listed, "&fieldSelector=metadata.name%3Da")
    [(kind, deleted)] = [(e["type"], e["object"]) for e in events]
    assert kind == "DELETED"
    assert int(deleted["metadata"]["resourceVersion"]) > int(listed), "a deletion has a version of its own"


def test_a_watch_older_than_the_history_is_told_410_gone(kube_api: EmulatedApi) -> None:
    assert kube_api.emulator is not None
    kube_api.emulator._history = collections.deque(maxlen=3)  # white-box: a short window
    first = kube_api.client.create(CMS, {"metadata": {"name": "c0"}, "data": {}})["metadata"]["resourceVersion"]
    for number in range(1, 6):
        kube_api.client.create(CMS, {"metadata": {"name": f"c{number}"}, "data": {}})
    [event] = watched_since(kube_api, CMS, first)
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_kubectl_delete_returns_at_once_twenty_times_in_a_row(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], operator: Any, test_vhost_url: str
) -> None:
    """With the real operator removing its finalizer in between; 2 of 2 tries never returned before."""
    create_broker_secret(kube_api, test_vhost_url, namespace="shop")
    for round_ in range(20):
        kube_api.client.create(CES, service())
        eventually(
            lambda: (
                "celeryevents.io/finalizer" in kube_api.client.get(f"{CES}/billing")["metadata"].get("finalizers", [])
            ),
            timeout=20,
        )
        started = time.monotonic()
        kube_api.kubectl("delete", "ces", "billing", "-n", "shop", "--timeout=30s")
        assert time.monotonic() - started < 25, (  # returns, well before its own timeout (a loaded machine: slowly)
            f"round {round_}: kubectl delete took {time.monotonic() - started:.1f} s"
        )


def test_kubectl_describe_shows_only_the_objects_own_events(
    kube_api: EmulatedApi, crd_installed: dict[str, Any]
) -> None:
    for name in ("billing", "shipping"):
        uid = kube_api.client.create(CES, service(name))["metadata"]["uid"]
        kube_api.client.create(
            "/api/v1/namespaces/shop/events",
            {
                "metadata": {"name": f"{name}.1"},
                "involvedObject": {"kind": "CeleryEventService", "name": name, "namespace": "shop", "uid": uid},
                "reason": f"About{name.capitalize()}",
                "message": f"about {name}",
                "type": "Normal",
            },
        )
    described = kube_api.kubectl("describe", "ces", "billing", "-n", "shop").stdout
    assert "AboutBilling" in described
    assert "AboutShipping" not in described
    table = kube_api.kubectl("get", "events", "-n", "shop").stdout.splitlines()
    assert table[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "kubectl get events"
    assert table[1].split()[1:] == ["Normal", "AboutBilling", "celeryeventservice/billing", "about", "billing"]


def test_kubectl_get_prints_the_printer_columns(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    kube_api.client.create(CES, service())
    kube_api.client.merge_patch(
        f"{CES}/billing/status",
        {
            "status": {
                "queueLength": 42,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2026-01-01T00:00:00Z"}
                ],
            }
        },
    )
    output = kube_api.kubectl("get", "ces", "-n", "shop").stdout.splitlines()
    assert output[0].split() == ["NAME", "READY", "QUEUE", "CONSUMERS", "REPLICAS", "AGE"]
    assert output[1].split()[:3] == ["billing", "True", "42"]


def test_requests_are_not_kept(kube_api: EmulatedApi) -> None:
    for index in range(50):
        kube_api.client.create(CMS, {"metadata": {"name": f"cm{index}"}, "data": {}})
    assert kube_api.emulator is not None
    # kmock's request log is what made every request slower than the last.
    assert list(kube_api.emulator._requests) == []


def test_scale_subresource_of_a_workload_and_of_the_crd(kube_api: EmulatedApi, crd_installed: dict[str, Any]) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    deployment = "/apis/apps/v1/namespaces/default/deployments/billing-worker"
    scale = kube_api.client.get(f"{deployment}/scale")
    assert (scale["kind"], scale["spec"]["replicas"], scale["status"]["selector"]) == ("Scale", 2, "app=billing-worker")
    kube_api.client.merge_patch(f"{deployment}/scale", {"spec": {"replicas": 5}})
    assert kube_api.client.get(deployment)["spec"]["replicas"] == 5
    assert "scaled" in kube_api.kubectl("scale", "deployment", "billing-worker", "--replicas=3").stdout
    assert kube_api.client.get(deployment)["spec"]["replicas"] == 3

    body = service()
    body["spec"]["workers"] = {"scaleTargetRef": {"name": "billing-worker"}, "replicas": 1}
    kube_api.client.create(CES, body)
    kube_api.kubectl("scale", "ces", "billing", "-n", "shop", "--replicas=4")
    assert kube_api.client.get(f"{CES}/billing")["spec"]["workers"]["replicas"] == 4


def test_errors_are_shaped_as_a_real_api_server_shapes_them(kube_api: EmulatedApi) -> None:
    """Issue #16: NotFound showed the emulator's internals."""
    missing = kube_api.kubectl("get", "configmap", "nope", check=False)
    assert missing.stderr.strip() == 'Error from server (NotFound): configmaps "nope" not found'
    # A path no resource serves: kmock's answer told how to declare it in kmock, with a traceback.
    unknown = kube_api.kubectl("get", "--raw", "/readyz", check=False)
    assert unknown.stderr.strip() == "Error from server (NotFound): the server could not find the requested resource"
    with pytest.raises(ApiError) as raised:
        kube_api.client.get("/apis/nothing.example/v1/things")
    assert raised.value.status == 404
    shown = json.dumps(raised.value.body)
    assert "kmock" not in shown
    assert "Traceback" not in shown


def test_kubectl_creates_secrets_and_configmaps_it_sends_as_protobuf(kube_api: EmulatedApi) -> None:
    """Issue #16: kubectl 1.32 sends built-in types as protobuf and does not fall back to JSON when refused,
    so `kubectl create secret generic` failed in dev mode."""
    kube_api.kubectl("create", "secret", "generic", "s1", "--from-literal=a=b", "--from-literal=url=amqp://x/é")
    secret = kube_api.client.get("/api/v1/namespaces/default/secrets/s1")
    assert secret["type"] == "Opaque"
    assert {key: base64.b64decode(value).decode() for key, value in secret["data"].items()} == {
        "a": "b",
        "url": "amqp://x/é",
    }
    kube_api.kubectl("create", "configmap", "c1", "-n", "shop", "--from-literal=k=v")
    assert kube_api.client.get(f"{CMS}/c1")["data"] == {"k": "v"}
    assert "c1" in kube_api.kubectl("get", "configmap", "-n", "shop").stdout
    # A type not decoded here is refused as a JSON-only server refuses it.
    refused = kube_api.kubectl("create", "serviceaccount", "sa1", check=False)
    assert refused.returncode == 1
    assert "unknown format - accepted media types: application/json" in refused.stderr


def test_rbac_of_a_restricted_identity_as_kubectl_and_clients_see_it(
    kube_api: EmulatedApi, tmp_path: pathlib.Path
) -> None:
    """Issue 26: opt-in RBAC, decided from the API's own Roles and bindings, with a real API server's 403."""
    reader = Identity.service_account("operators", "reader")
    kubeconfig = kube_api.restricted_kubeconfig(reader, tmp_path / "reader.kubeconfig")

    def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
        """As the reader: kubectl sends no bearer token over plain HTTP, it impersonates (as the administrator)."""
        return kube_api.kubectl("--as", reader.user, *args, check=False)

    assert kubectl("get", "pods", "-n", "shop").stderr.strip() == (
        'Error from server (Forbidden): pods is forbidden: User "system:serviceaccount:operators:reader" cannot '
        'list resource "pods" in API group "" in the namespace "shop"'
    )
    rbac_api = "/apis/rbac.authorization.k8s.io/v1/namespaces/shop"
    kube_api.client.create(
        f"{rbac_api}/roles",
        {"metadata": {"name": "read"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]},
    )
    kube_api.client.create(
        f"{rbac_api}/rolebindings",
        {
            "metadata": {"name": "read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "operators"}],
        },
    )
    assert kubectl("get", "pods", "-n", "shop").returncode == 0, "granted at once"
    assert "Forbidden" in kubectl("get", "pods", "-n", "billing").stderr, "in its namespace only"
    assert kube_api.kubectl("get", "pods", "-n", "billing").returncode == 0, "the administrator is not restricted"

    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    request = urllib.request.Request(
        f"{kube_api.url}/api/v1/namespaces/shop/configmaps/settings", headers={"Authorization": f"Bearer {token}"}
    )
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        urllib.request.urlopen(request, timeout=10)
    assert forbidden.value.code == 403
    assert json.loads(forbidden.value.read()) == {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "settings" is forbidden: User "system:serviceaccount:operators:reader" cannot get '
        'resource "configmaps" in API group "" in the namespace "shop"',
        "reason": "Forbidden",
        "details": {"name": "settings", "kind": "configmaps"},
        "code": 403,
    }
    asked = {(a.verb, a.resource, a.namespace, a.refused_by) for a in kube_api.asked()}
    assert asked == {
        ("list", "pods", "shop", "RBAC"),
        ("list", "pods", "shop", ""),
        ("list", "pods", "billing", "RBAC"),
        ("get", "configmaps", "shop", "RBAC"),
    }

    stranger = urllib.request.Request(f"{kube_api.url}/api/v1/pods", headers={"Authorization": "Bearer nobody-gave"})
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(stranger, timeout=10)
    assert (unknown.value.code, json.loads(unknown.value.read())["reason"]) == (401, "Unauthorized")
