"""The operator's watch of the worker pods on a real API server: the first listing (in pages), then each change — a
pod added, annotated, relabelled, unlabelled, terminating, deleted — as the passes and the metrics read it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from celery_event_operator.adapters import kubeapi
from celery_event_operator.adapters.kubeapi import KubeApi
from celery_event_operator.adapters.pods import PodWatch
from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.service.watched import Labelled
from tests.support.cluster import Cluster


def pod(name: str, service: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {SERVICE_LABEL: service} if service else {"app": "other"}},
        # Bound to a node that does not exist: the API server keeps it, no kubelet runs it.
        "spec": {"nodeName": "nowhere", "containers": [{"name": "worker", "image": "worker"}]},
    }


async def eventually(check: Callable[[], bool], message: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.05)


async def test_the_pods_are_listed_then_each_change_is_seen(
    cluster: Cluster, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name, service in (("a", "billing"), ("b", "billing"), ("c", "shipping"), ("d", None)):
        cluster.client.create(pods, pod(name, service))
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setattr(kubeapi, "PODS_PAGE", 2)  # the listing in pages, as of thousands of pods
    gone: list[Labelled] = []
    watch = PodWatch(KubeApi.from_environment(), (namespace,), gone.append)
    watch.start()
    try:
        async with asyncio.timeout(30):
            await watch.listed()
        of = watch.of(namespace)

        def names(service: str = "billing") -> list[str]:
            return sorted(found.name for found in of(service))

        assert (names(), names("shipping")) == (["a", "b"], ["c"]), "the unlabelled pod is nobody's"
        cluster.client.create(pods, pod("e", "billing"))
        await eventually(lambda: names() == ["a", "b", "e"], "an added pod was not seen")
        cluster.client.merge_patch(f"{pods}/a", {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "2"}}})
        await eventually(
            lambda: [found.deletion_cost for found in of("billing") if found.name == "a"] == ["2"],
            "a pod's new deletion cost was not seen",
        )
        cluster.client.merge_patch(f"{pods}/c", {"metadata": {"labels": {SERVICE_LABEL: "billing"}}})
        await eventually(lambda: names() == ["a", "b", "c", "e"] and names("shipping") == [], "relabelled: not moved")
        cluster.client.merge_patch(f"{pods}/e", {"metadata": {"labels": {SERVICE_LABEL: None}}})
        await eventually(lambda: names() == ["a", "b", "c"], "a pod that lost its label stayed")
        # Bound to a node, a pod terminates until its kubelet confirms: no longer a worker, not gone yet.
        cluster.client.delete(f"{pods}/b")
        await eventually(lambda: names() == ["a", "c"], "a terminating pod stayed one of the workers")
        # The API server says a pod that left the selector DELETED, as it says a deletion: taken as gone.
        assert [found.name for found in gone] == ["e"], "only the pod that left the watch is gone so far"
        cluster.client.delete(f"{pods}/b", {"gracePeriodSeconds": 0})
        await eventually(lambda: [found.name for found in gone] == ["e", "b"], "the deleted pod was not said gone")
    finally:
        watch.close()
