"""The pods of every service, indexed (their settings hash counts for WorkersConfigured; their names keep
the metric series of live workers; their address, phase and deletion cost serve the workers' lifecycle), and
the series of a deleted pod removed at once."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import kopf

from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.injection import pod as pod_settings
from celery_event_operator.core.service.pods import PodsOf, WorkerPod, template_of


@kopf.index("v1", "pods", labels={SERVICE_LABEL: kopf.PRESENT})
def pods_by_service(
    *,
    namespace: str | None,
    name: str | None,
    labels: kopf.Labels,
    annotations: kopf.Annotations,
    meta: kopf.Meta,
    spec: kopf.Spec,
    status: kopf.Status,
    **_: Any,
) -> dict[tuple[str | None, str], WorkerPod]:
    if meta.get("deletionTimestamp") or name is None:
        return {}  # terminating: no longer one of the service's workers
    pod = WorkerPod(
        name,
        pod_settings.carried_hash(annotations, spec.get("volumes") or []),
        ip=status.get("podIP") or None,
        running=status.get("phase") == "Running",
        deletion_cost=annotations.get(DELETION_COST_ANNOTATION),
        template=template_of(labels),
    )
    return {(namespace, labels[SERVICE_LABEL]): pod}


def service_pods(index: kopf.Index[Any, Any] | None, namespace: str | None) -> PodsOf:
    """A view of the index for one namespace (kopf keeps the index current; the view reads it when called)."""

    def pods(service: str) -> list[WorkerPod]:
        found: Iterable[WorkerPod] = index.get((namespace, service), []) if index else []
        return list(found)

    return pods


def _deleted(type: str, **_: Any) -> bool:
    # Filtered before the handler is called, so the other events of every pod leave no "succeeded" log line.
    return type == "DELETED"


# On the event loop (async), where the events are consumed and /metrics is rendered: no thread touches the state.
@kopf.on.event("v1", "pods", labels={SERVICE_LABEL: kopf.PRESENT}, when=_deleted)
async def forget_deleted_pod(
    *,
    name: str | None,
    namespace: str | None,
    labels: kopf.Labels,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    if name is None:
        return
    metrics = memo.context.metrics.find(namespace or "", labels[SERVICE_LABEL])
    if metrics is not None:
        metrics.forget_worker(name, time.monotonic())
        logger.debug("series of worker %s removed", name)
