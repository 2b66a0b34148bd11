"""The admission webhook of the real operator, called over HTTPS with real AdmissionReviews."""

from __future__ import annotations

import base64
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_devcluster import jsonpatch
from celery_event_operator.core.api import metadata
from celery_event_operator.core.injection import pod as injection_pod
from celery_event_operator.core.injection import settings as injection_settings
from tests.conftest import billing_sample, create_broker_secret
from tests.support.kube import EmulatedApi, eventually
from tests.support.operator_process import OperatorProcess, admission_review, worker_pod

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
MOUNT = injection_settings.MOUNT_PATH


def admitted(operator: OperatorProcess, pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod as the API server would store it after the webhook, and the raw response."""
    answer = operator.admit(admission_review(pod))
    response = answer["response"]
    assert response["allowed"] is True
    if "patch" not in response:
        return pod, response
    assert response["patchType"] == "JSONPatch"
    return jsonpatch.apply(pod, json.loads(base64.b64decode(response["patch"]))), response


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        variable["name"]: variable.get("value", variable.get("valueFrom"))
        for variable in pod["spec"]["containers"][0].get("env", [])
    }


@pytest.fixture
def operator(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    create_broker_secret(kube_api, test_vhost_url)
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    kube_api.client.create(CES, billing_sample())
    eventually(lambda: kube_api.client.get(f"{CES}/billing").get("status", {}).get("observedGeneration"), timeout=20)
    yield process
    process.stop()


def test_labelled_pod_gets_the_settings(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    pod, _ = admitted(operator, worker_pod({"celeryevents.io/service": "billing"}))
    env = env_of(pod)
    assert env["CELERY_BROKER_URL"] == {"secretKeyRef": {"name": "rabbitmq", "key": "url"}}
    assert env["CELERY_LOADER"] == "default"
    assert env["CELERY_CONFIG_MODULE"] == injection_settings.LOADER_MODULE
    assert env["CELERY_EVENTS_SETTINGS"] == f"{MOUNT}/settings.json"
    assert env["CELERY_WORKER_WITHOUT_MINGLE"] == env["CELERY_WORKER_WITHOUT_GOSSIP"] == "1"
    assert env["PYTHONPATH"] == MOUNT
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": injection_pod.VOLUME_NAME, "mountPath": MOUNT, "readOnly": True}
    ]
    assert pod["spec"]["volumes"] == [
        {"name": injection_pod.VOLUME_NAME, "configMap": {"name": "billing-celery-events", "defaultMode": 0o444}}
    ]
    configmap = kube_api.client.get("/api/v1/namespaces/default/configmaps/billing-celery-events")
    settings = json.loads(configmap["data"]["settings.json"])
    assert pod["metadata"]["annotations"][metadata.HASH_ANNOTATION] == injection_settings.config_hash(settings)
    assert "amqp://" not in json.dumps(pod), "the broker URL stays in its Secret"


def test_users_env_volumes_and_mounts_are_kept(operator: OperatorProcess) -> None:
    original = worker_pod({"celeryevents.io/service": "billing"}, volumes=[{"name": "cache", "emptyDir": {}}])
    original["spec"]["containers"][0]["env"] = [
        {"name": "PYTHONPATH", "value": "/app/lib"},
        {"name": "CELERY_BROKER_URL", "value": "amqp://own@broker//"},
        {"name": "FEATURE", "value": "on"},
    ]
    original["spec"]["containers"][0]["volumeMounts"] = [{"name": "cache", "mountPath": "/cache"}]
    pod, _ = admitted(operator, original)
    container = pod["spec"]["containers"][0]
    assert container["env"][:3] == original["spec"]["containers"][0]["env"], "the user's entries come first, unchanged"
    names = [variable["name"] for variable in container["env"]]
    assert names.count("CELERY_BROKER_URL") == 1, "the user's own broker URL wins"
    assert container["env"][-1] == {"name": "PYTHONPATH", "value": f"$(PYTHONPATH):{MOUNT}"}
    assert container["volumeMounts"][0] == {"name": "cache", "mountPath": "/cache"}
    assert pod["spec"]["volumes"][0] == {"name": "cache", "emptyDir": {}}
    assert len(pod["spec"]["volumes"]) == 2


def test_unlabelled_pod_is_untouched(operator: OperatorProcess) -> None:
    original = worker_pod()
    pod, response = admitted(operator, original)
    assert pod == original
    assert "patch" not in response


def test_pod_of_an_unknown_service_is_admitted_with_a_warning(operator: OperatorProcess) -> None:
    original = worker_pod({"celeryevents.io/service": "shipping"})
    pod, response = admitted(operator, original)
    assert pod["spec"] == original["spec"]
    warning = pod["metadata"]["annotations"][metadata.WARNING_ANNOTATION]
    assert "shipping" in warning
    assert response["warnings"] == [warning]
