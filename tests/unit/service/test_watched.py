"""The watched pods (pure): what a listing and each watch event change, and which pods are gone."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION, HASH_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.injection.pod import VOLUME_NAME
from celery_event_operator.core.service.pods import WorkerPod
from celery_event_operator.core.service.watched import Labelled, WatchedPods, labelled


def pod_object(
    name: str,
    service: str | None = "billing",
    namespace: str = "shop",
    *,
    terminating: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {} if service is None else {SERVICE_LABEL: service},
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-11-28T06:00:00Z"
    meta.update(fields.pop("metadata", {}))
    return {"metadata": meta, **fields}


@pytest.mark.parametrize(
    ("obj", "found"),
    [
        pytest.param(pod_object("a"), Labelled("shop", "a", "billing", WorkerPod("a", None)), id="a-pending-pod"),
        pytest.param(
            pod_object(
                "a",
                metadata={
                    "annotations": {HASH_ANNOTATION: "h1", DELETION_COST_ANNOTATION: "2"},
                    "labels": {SERVICE_LABEL: "billing", "pod-template-hash": "t1"},
                },
                spec={"volumes": [{"name": VOLUME_NAME}]},
                status={"phase": "Running", "podIP": "10.0.0.1"},
            ),
            Labelled("shop", "a", "billing", WorkerPod("a", "h1", "10.0.0.1", True, "2", "t1")),
            id="running-with-settings-cost-and-template",
        ),
        pytest.param(
            pod_object("a", metadata={"annotations": {HASH_ANNOTATION: "h1"}}),
            Labelled("shop", "a", "billing", WorkerPod("a", None)),
            id="a-stamp-without-the-settings-volume-runs-none",
        ),
        pytest.param(pod_object("a", terminating=True), Labelled("shop", "a", "billing", None), id="terminating"),
        pytest.param(pod_object("a", service=None), None, id="no-service-label"),
        pytest.param({"metadata": "x"}, None, id="not-an-object"),
        pytest.param({}, None, id="empty"),
        pytest.param(pod_object("a", metadata={"labels": {SERVICE_LABEL: 5}}), None, id="a-label-not-text"),
    ],
)
def test_a_pod_object_is_read(obj: dict[str, Any], found: Labelled | None) -> None:
    assert labelled(obj) == found


def names(pods: WatchedPods, service: str = "billing", namespace: str = "shop") -> list[str]:
    return sorted(pod.name for pod in pods.of(namespace, service))


def test_a_listing_replaces_its_namespaces_pods_and_says_which_are_gone() -> None:
    pods = WatchedPods()
    assert pods.listed("shop", [pod_object("a"), pod_object("b"), pod_object("c", service="other")]) == []
    pods.listed("bank", [pod_object("z", namespace="bank")])
    assert (names(pods), names(pods, "other"), names(pods, namespace="bank")) == (["a", "b"], ["c"], ["z"])
    gone = pods.listed("shop", [pod_object("b")])
    assert sorted(pod.name for pod in gone) == ["a", "c"]
    assert (names(pods), names(pods, "other"), names(pods, namespace="bank")) == (["b"], [], ["z"]), "bank kept"
    assert [pod.name for pod in pods.listed(None, [pod_object("b")])] == ["z"], "a cluster-wide listing: every one"


def test_each_watch_event_changes_one_pod() -> None:
    pods = WatchedPods()
    pods.listed("shop", [pod_object("a")])
    assert pods.changed("ADDED", pod_object("b")) is None
    running = pod_object("b", status={"phase": "Running"})
    pods.changed("MODIFIED", running)
    assert [pod.running for pod in pods.of("shop", "billing") if pod.name == "b"] == [True]
    assert pods.changed("MODIFIED", pod_object("b", terminating=True)) is None, "terminating: not gone yet"
    assert names(pods) == ["a"], "but no longer one of the service's workers"
    assert pods.changed("DELETED", pod_object("b", terminating=True)) == Labelled("shop", "b", "billing", None)
    pods.changed("MODIFIED", pod_object("a", service="other"))
    assert (names(pods), names(pods, "other")) == ([], ["a"]), "relabelled: the other service's now"
    # A pod losing its label leaves a label-selected watch as a deletion (the real API server sends the object as
    # it was; an older one, as it is now): gone either way, by its name.
    assert pods.changed("DELETED", pod_object("a", service=None)) == Labelled(
        "shop", "a", "other", WorkerPod("a", None)
    )
    assert names(pods, "other") == []
    pods.changed("ADDED", pod_object("d"))
    assert pods.changed("DELETED", pod_object("d")) == Labelled("shop", "d", "billing", WorkerPod("d", None))
    assert pods.changed("DELETED", pod_object("never-seen")) is None
    assert pods.changed("DELETED", {"metadata": None}) is None
