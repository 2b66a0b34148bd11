"""Keep a service's workers configured: its settings ConfigMap, the rollout stamp, the pod count (I/O)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from celery_event_operator.adapters.kubeapi import AsyncKubeApi
from celery_event_operator.core.api.metadata import HASH_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.errors import KubeError, KubeUnavailableError
from celery_event_operator.core.injection import settings as rendering
from celery_event_operator.core.injection.outcome import WorkersOutcome, count_pods


def configmap_body(name: str, owner: dict[str, Any], service: str, data: dict[str, str]) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {SERVICE_LABEL: service, "app.kubernetes.io/managed-by": "celery-event-operator"},
            # Owned by the resource: deleting the service deletes its settings. Without blockOwnerDeletion: it
            # would only hold a foreground deletion of the service until the ConfigMap is gone, which nothing
            # waits for, and setting it needs `update` on celeryeventservices/finalizers where the API server
            # enforces owner references (OpenShift): a permission the operator otherwise has no use for.
            "ownerReferences": [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                }
            ],
        },
        "data": data,
    }


async def sync(
    kube: AsyncKubeApi,
    *,
    owner: dict[str, Any],
    service: str,
    spec: CeleryEventServiceSpec,
    pod_hashes: Iterable[str | None],
) -> WorkersOutcome:
    """The settings ConfigMap and the rollout stamp made current; `pod_hashes`: the settings hash each live pod
    of the service carries (from the operator's watch of the pods: no listing)."""
    namespace = owner["metadata"]["namespace"]
    settings = rendering.render(service, spec)
    config_hash = rendering.config_hash(settings)
    data = rendering.configmap_data(settings)
    name = rendering.configmap_name(service)
    try:
        current = await kube.read(kube.api.read_configmap_data, namespace, name)
        if current != data:
            body = configmap_body(name, owner, service, data)
            await kube.call(kube.api.write_configmap, namespace, body, exists=current is not None)
    except KubeUnavailableError as exc:
        return WorkersOutcome(config_hash, unavailable=str(exc))
    except KubeError as exc:
        return WorkersOutcome(config_hash, configmap_error=str(exc))

    target_error = stamped = None
    target_reason = "ScaleTargetNotFound"
    if spec.workers is not None and spec.workers.rollout_on_change:
        target = spec.workers.scale_target_ref
        try:
            annotations = await kube.read(kube.api.read_template_annotations, namespace, target.kind, target.name)
            if annotations is None:
                target_error = f"{target.kind} {namespace}/{target.name} (workers.scaleTargetRef) does not exist"
            elif annotations.get(HASH_ANNOTATION) != config_hash:
                await kube.call(
                    kube.api.annotate_template,
                    namespace,
                    target.kind,
                    target.name,
                    {HASH_ANNOTATION: config_hash},
                )
                stamped = f"{target.kind}/{target.name}"
        except KubeUnavailableError as exc:  # not "not found": asked again next pass
            return dataclasses.replace(count_pods(config_hash, pod_hashes), unavailable=str(exc))
        except KubeError as exc:  # a missing permission is no missing workload: its own reason
            target_error, target_reason = str(exc), exc.reason
    return dataclasses.replace(
        count_pods(config_hash, pod_hashes),
        target_error=target_error,
        target_reason=target_reason,
        stamped=stamped,
    )
