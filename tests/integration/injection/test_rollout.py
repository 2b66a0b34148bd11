"""The settings ConfigMap, its hash, the rollout stamp and WorkersConfigured, with the real operator."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator.core.api import metadata
from celery_event_operator.core.injection import settings as injection_settings
from celery_event_operator.core.injection.pod import VOLUME_NAME
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
CONFIGMAP = "/api/v1/namespaces/default/configmaps/billing-celery-events"
DEPLOYMENT = "/apis/apps/v1/namespaces/default/deployments/billing-worker"
HASH = metadata.HASH_ANNOTATION


@pytest.fixture
def operator(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    create_broker_secret(kube_api, test_vhost_url)
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    yield process
    process.stop()


def workers(api: EmulatedApi) -> dict[str, Any]:
    return condition(api, "WorkersConfigured")


def template_hash(api: EmulatedApi) -> str | None:
    annotations = api.client.get(DEPLOYMENT)["spec"]["template"]["metadata"].get("annotations") or {}
    value: str | None = annotations.get(HASH)
    return value


def configmap_settings(api: EmulatedApi) -> dict[str, Any]:
    settings: dict[str, Any] = json.loads(api.client.get(CONFIGMAP)["data"]["settings.json"])
    return settings


def test_settings_change_updates_configmap_hash_and_pod_template(
    kube_api: EmulatedApi, operator: OperatorProcess
) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    kube_api.client.create(CES, billing_sample())
    first = eventually(lambda: template_hash(kube_api), timeout=20, message="the pod template was never stamped")
    configmap = kube_api.client.get(CONFIGMAP)
    assert configmap["metadata"]["ownerReferences"][0]["kind"] == "CeleryEventService"
    assert configmap["data"][f"{injection_settings.LOADER_MODULE}.py"] == injection_settings.LOADER_SOURCE
    assert injection_settings.config_hash(configmap_settings(kube_api)) == first
    assert len(configmap_settings(kube_api)["celery_events"]["retry_exchanges"]) == 10

    kube_api.client.merge_patch(f"{CES}/billing", {"spec": {"retry": {"maxRetries": 3}}})
    second = eventually(
        lambda: template_hash(kube_api) != first and template_hash(kube_api),
        timeout=20,
        message="the new hash was not stamped",
    )
    assert configmap_settings(kube_api)["celery_events"]["retry_exchanges"] == [
        "billing:retry",
        "billing:retry.1",
        "billing:retry.2",
    ]
    assert injection_settings.config_hash(configmap_settings(kube_api)) == second
    # kopf posts Events from a queue of its own: the second may come a little after the stamp.
    eventually(
        lambda: (
            [e["reason"] for e in kube_api.client.get("/api/v1/namespaces/default/events")["items"]].count(
                "RolloutStarted"
            )
            == 2
        ),
        timeout=5,
        message="not one RolloutStarted per change",
    )


def test_rollout_off_leaves_the_workload_alone(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    service = billing_sample()
    service["spec"]["workers"]["rolloutOnChange"] = False
    kube_api.client.create(CES, service)
    eventually(lambda: kube_api.client.get(CONFIGMAP), timeout=20)
    eventually(lambda: workers(kube_api).get("status"), timeout=20)
    assert template_hash(kube_api) is None


def test_workers_configured_counts_pods_with_current_settings(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    kube_api.client.create(CES, billing_sample())
    current = eventually(lambda: template_hash(kube_api), timeout=20)

    def pod(name: str, config_hash: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": {metadata.SERVICE_LABEL: "billing"},
                "annotations": {HASH: config_hash},
            },
            # The settings volume the webhook adds: a pod is judged by the settings it carries.
            "spec": {
                "containers": [{"name": "worker", "image": "billing-worker"}],
                "volumes": [{"name": VOLUME_NAME, "configMap": {"name": "billing-celery-events"}}],
            },
        }

    kube_api.client.create("/api/v1/namespaces/default/pods", pod("old", "0000000000000000"))
    kube_api.client.create("/api/v1/namespaces/default/pods", pod("new", current))
    # A status pass between the two creations sees "0/1 pods": wait for the one that sees both.
    eventually(
        lambda: (
            workers(kube_api).get("reason") == "RolloutPending"
            and workers(kube_api).get("message", "").startswith("1/2 pods")
        ),
        timeout=10,
        message="the rollout of 1 of 2 pods was not reported",
    )
    kube_api.client.delete("/api/v1/namespaces/default/pods/old")
    done = eventually(lambda: workers(kube_api).get("status") == "True" and workers(kube_api), timeout=10)
    assert done["message"].startswith("1/1 pods")


def test_missing_scale_target_is_reported(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    kube_api.client.create(CES, billing_sample())
    condition = eventually(
        lambda: workers(kube_api).get("reason") == "ScaleTargetNotFound" and workers(kube_api), timeout=20
    )
    assert "billing-worker" in condition["message"]
    assert condition["status"] == "False"
