"""Queue lengths in status, and autoscaling: one daemon per resource, every statusIntervalSeconds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import kopf

from celery_event_operator import reconcile
from celery_event_operator.api.models import GROUP, PLURAL, VERSION, InvalidSpecError
from celery_event_operator.kubeapi import KubeError
from celery_event_operator.scaling import run

DEFAULT_INTERVAL_SECONDS = 15.0


def _one_pass(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, memory: run.ScalerMemory) -> float:
    """Returns the interval until the next pass."""
    try:
        validated = reconcile.validate(body)
    except InvalidSpecError:
        return DEFAULT_INTERVAL_SECONDS  # the reconcile handler reports it
    outcome = run.run_pass(memo.kube, memo.brokers, dict(body), service=validated.service_name, spec=validated.spec,
                           memory=memory, now=time.monotonic(),
                           metrics=memo.metrics.find(body.metadata.namespace or "", validated.service_name))
    try:
        memo.kube.patch_service_status(body.metadata.namespace or "", body.metadata.name or "", outcome.status)
    except KubeError as exc:
        logger.warning("status not written: %s", exc)
    for note in outcome.events:
        kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        (logger.warning if note.type == "Warning" else logger.info)("%s: %s", note.reason, note.message)
    return float(validated.spec.status_interval_seconds)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def queue_stats_and_scaling(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                                  stopped: kopf.DaemonStopped, **_: Any) -> None:
    memory = run.ScalerMemory()
    while not stopped:
        # `body` is kept current by kopf; the pass is blocking I/O (kombu, the API client).
        interval = await asyncio.to_thread(_one_pass, body, memo, logger, memory)
        await stopped.wait(interval)
