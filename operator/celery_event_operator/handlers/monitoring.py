"""Prometheus metrics from each service's Celery events; series of deleted pods removed at once."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import kopf

from celery_event_operator import reconcile
from celery_event_operator.api.models import GROUP, PLURAL, VERSION, InvalidSpecError
from celery_event_operator.injection.settings import SERVICE_LABEL
from celery_event_operator.kubeapi import SecretError
from celery_event_operator.monitoring import consumer
from celery_event_operator.topology.sync import broker_address

SWEEP_SECONDS = 30.0
# A worker outside Kubernetes (no pod) that was not heard from this long is gone. Celery heartbeats
# every 2 s; task events count as signs of life too.
SILENCE_SECONDS = 300.0


@kopf.index("v1", "pods", labels={SERVICE_LABEL: kopf.PRESENT})
def pods_by_service(namespace: str | None, name: str | None, labels: kopf.Labels, **_: Any
                    ) -> dict[tuple[str | None, str], str | None]:
    return {(namespace, labels[SERVICE_LABEL]): name}


@kopf.on.event("v1", "pods", labels={SERVICE_LABEL: kopf.PRESENT})
def forget_deleted_pod(*, type: str, name: str | None, namespace: str | None, labels: kopf.Labels,
                       memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    if type != "DELETED" or name is None:
        return
    metrics = memo.metrics.find(namespace or "", labels[SERVICE_LABEL])
    if metrics is not None:
        metrics.forget_worker(name, time.monotonic())
        logger.debug("series of worker %s removed", name)


def _monitored(spec: kopf.Spec, **_: Any) -> bool:
    return bool((spec.get("monitoring") or {}).get("enabled", True))


@kopf.daemon(GROUP, VERSION, PLURAL, when=_monitored, cancellation_timeout=10.0)
async def consume_celery_events(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, stopped: kopf.DaemonStopped,
                                pods_by_service: kopf.Index[Any, Any] | None = None, **_: Any) -> None:
    namespace = body.metadata.namespace or ""
    try:
        validated = reconcile.validate(body)
    except InvalidSpecError:
        return  # reported by the reconcile handler; kopf restarts the daemon when the spec changes
    spec, service = validated.spec, validated.service_name
    while not stopped:  # the Secret may be missing or broken for a while
        try:
            address = await asyncio.to_thread(broker_address, memo.kube, namespace, spec)
            break
        except SecretError:
            await stopped.wait(SWEEP_SECONDS)  # BrokerReachable says why
    else:
        return
    metrics = memo.metrics.service(namespace, service)
    stop = threading.Event()
    consuming = asyncio.create_task(asyncio.to_thread(consumer.consume, address, service, metrics, stop, logger))
    try:
        while not stopped:
            await stopped.wait(SWEEP_SECONDS)
            live = list(pods_by_service.get((body.metadata.namespace, service), [])) if pods_by_service else []
            gone = metrics.sweep(live, time.monotonic(), SILENCE_SECONDS)
            if gone:
                logger.info("series of workers no longer seen removed: %s", ", ".join(gone))
    finally:
        # Deleted, or monitoring turned off: its series go. First thing: kopf may cancel this daemon
        # outright (it does at deletion), and then nothing after the next await would run.
        memo.metrics.remove(namespace, service)
        stop.set()  # the consumer thread ends within a second
        await asyncio.shield(consuming)
