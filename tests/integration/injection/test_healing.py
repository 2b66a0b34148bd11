"""Pods admitted without the settings are healed: evicted one at a time through the Eviction API, with an
Event, and their replacement carries the settings. The real operator against the emulated API.

What cannot exist here: the ReplicaSet controller and the API server's admission. The test plays both —
after an eviction it creates the replacement pod as the API server would, through the operator's webhook.
"""

from __future__ import annotations

import pathlib
from typing import Any

from celery_event_operator.core.api import metadata
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_webhook import admitted
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, worker_pod
from tests.support.waiting import stays

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"
HASH = metadata.HASH_ANNOTATION
LABELS = {metadata.SERVICE_LABEL: "billing"}


def service(**workers: Any) -> dict[str, Any]:
    body = billing_sample()
    body["spec"]["workers"] |= {"healAfterSeconds": 5, **workers}
    body["spec"]["statusIntervalSeconds"] = 2  # healing acts in the status pass: several passes after the grace
    return body


def admitted_with_settings(operator: OperatorProcess, name: str) -> dict[str, Any]:
    """A pod as the API server stores it after the webhook, once the operator knows the service."""

    def admit() -> dict[str, Any] | None:
        pod, _ = admitted(
            operator, worker_pod(LABELS) | {"metadata": {"name": name, "namespace": "default", "labels": LABELS}}
        )
        return pod if HASH in pod["metadata"].get("annotations", {}) else None

    found: dict[str, Any] = eventually(admit, timeout=20, message="the webhook never injected the settings")
    return found


def pod_names(api: EmulatedApi) -> set[str]:
    return {pod["metadata"]["name"] for pod in api.client.get(PODS)["items"]}


def evictions(api: EmulatedApi) -> list[str]:
    return [
        event["message"]
        for event in api.client.get("/api/v1/namespaces/default/events")["items"]
        if event.get("reason") == "PodEvicted"
    ]


def test_a_pod_created_while_the_operator_was_stopped_is_evicted_and_replaced_with_the_settings(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    kube_api.client.create(CES, service())
    # Admitted while no operator answered: failurePolicy Ignore lets the pod in unchanged.
    unconfigured = worker_pod(LABELS)
    unconfigured["metadata"] = {"name": "billing-worker-unconfigured", "labels": LABELS}
    kube_api.client.create(PODS, unconfigured)

    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    try:
        kube_api.client.create(PODS, admitted_with_settings(operator, "billing-worker-ok"))
        waiting = eventually(
            lambda: (
                condition(kube_api, "WorkersConfigured").get("reason") == "RolloutPending"
                and condition(kube_api, "WorkersConfigured")
            ),
            timeout=20,
        )
        assert "the other 1 are evicted one at a time after 5 s" in waiting["message"]

        eventually(
            lambda: "billing-worker-unconfigured" not in pod_names(kube_api),
            timeout=30,
            message="the unconfigured pod was not evicted",
        )
        [message] = eventually(lambda: evictions(kube_api), timeout=10, message="no PodEvicted Event")
        assert "billing-worker-unconfigured" in message
        assert "without the service's settings" in message

        # The ReplicaSet's replacement, admitted through the webhook now that the operator answers.
        kube_api.client.create(PODS, admitted_with_settings(operator, "billing-worker-new"))
        eventually(lambda: condition(kube_api, "WorkersConfigured").get("status") == "True", timeout=20)
        stays(
            lambda: pod_names(kube_api) == {"billing-worker-ok", "billing-worker-new"},
            seconds=8,
            message="a configured pod was evicted",
        )
        assert len(evictions(kube_api)) == 1
    finally:
        operator.stop()


def test_healing_switched_off_leaves_unconfigured_pods_alone(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    kube_api.client.create(CES, service(healUnconfiguredPods=False))
    kube_api.client.create(PODS, worker_pod(LABELS) | {"metadata": {"name": "billing-worker-x", "labels": LABELS}})
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    try:
        eventually(lambda: condition(kube_api, "WorkersConfigured").get("reason") is not None, timeout=20)
        stays(lambda: "billing-worker-x" in pod_names(kube_api), seconds=10, message="the pod was evicted")
        assert "evicted" not in condition(kube_api, "WorkersConfigured").get("message", "")
    finally:
        operator.stop()
