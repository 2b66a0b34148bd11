"""The Kubernetes API calls of a service's passes and of a replay, off the event loop (I/O; the flow's ClusterAccess
and ReplayApi)."""

from __future__ import annotations

from typing import Any

from celery_event_operator.adapters.injection import workers
from celery_event_operator.adapters.kubeapi import AsyncKubeApi
from celery_event_operator.core.api.models import CeleryEventServiceSpec, ScaleTargetRef
from celery_event_operator.core.injection.outcome import WorkersOutcome


class Cluster:
    def __init__(self, kube: AsyncKubeApi) -> None:
        self.kube = kube

    async def sync_workers(
        self, *, owner: dict[str, Any], service: str, spec: CeleryEventServiceSpec, pod_hashes: list[str | None]
    ) -> WorkersOutcome:
        return await workers.sync(self.kube, owner=owner, service=service, spec=spec, pod_hashes=pod_hashes)

    async def read_scale(self, namespace: str, target: ScaleTargetRef) -> int | None:
        found = await self.kube.read(self.kube.api.read_scale, namespace, target.kind, target.name)
        return None if found is None else found[0]

    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None:
        await self.kube.call(self.kube.api.set_scale, namespace, target.kind, target.name, replicas)

    async def evict_pod(self, namespace: str, name: str) -> bool:
        return await self.kube.call(self.kube.api.evict_pod, namespace, name)

    async def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        await self.kube.call(self.kube.api.patch_service_status, namespace, name, fields)

    async def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.kube.call(self.kube.api.patch_service_metadata, namespace, name, annotations)

    async def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.kube.read(self.kube.api.read_service, namespace, name)

    async def patch_replay_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        await self.kube.call(self.kube.api.patch_replay_status, namespace, name, fields)

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        await self.kube.call(self.kube.api.annotate_pod, namespace, name, annotations)
