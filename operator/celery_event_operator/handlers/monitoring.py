"""The pods of every service, indexed (their settings hash counts for WorkersConfigured; their names keep
the metric series of live workers), and the series of a deleted pod removed at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import kopf

from celery_event_operator.injection.settings import HASH_ANNOTATION, SERVICE_LABEL

ServicePods = Callable[[str], list[tuple[str, str | None]]]  # serviceName → (pod name, its settings hash)


@kopf.index("v1", "pods", labels={SERVICE_LABEL: kopf.PRESENT})
def pods_by_service(
    namespace: str | None,
    name: str | None,
    labels: kopf.Labels,
    annotations: kopf.Annotations,
    meta: kopf.Meta,
    **_: Any,
) -> dict[tuple[str | None, str], tuple[str | None, str | None]]:
    if meta.get("deletionTimestamp"):
        return {}  # terminating: no longer one of the service's workers
    return {(namespace, labels[SERVICE_LABEL]): (name, annotations.get(HASH_ANNOTATION))}


def service_pods(index: kopf.Index[Any, Any] | None, namespace: str | None) -> ServicePods:
    """A view of the index for one namespace (kopf keeps the index current; the view reads it when called)."""

    def pods(service: str) -> list[tuple[str, str | None]]:
        found: Iterable[tuple[str | None, str | None]] = index.get((namespace, service), []) if index else []
        return [(name, config_hash) for name, config_hash in found if name is not None]

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
