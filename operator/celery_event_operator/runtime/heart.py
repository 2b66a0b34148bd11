"""Heartbeats that say how many tasks the worker runs at once.

Celery's worker-online and worker-heartbeat events carry no pool size, and the operator's autoscaling needs each
pod's capacity. SlotsHeart takes the place of Celery's Heart bootstep in the worker's consumer: Celery's own heart
still decides what it sends and when; the dispatcher it is handed adds the field `concurrency` to each event.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.worker import heartbeat
from celery.worker.consumer.heart import Heart

from celery_event_operator.core import naming

logger = logging.getLogger(__name__)

CELERY_HEART_STEP = "celery.worker.consumer.heart:Heart"  # as the consumer's blueprint names it


def worker_slots(consumer: Any) -> int:
    """The most tasks the worker runs at once: with `--autoscale max,min` the maximum, else its pool's limit
    (`--concurrency` for prefork, threads, eventlet and gevent; 1 for solo)."""
    worker = consumer.controller
    slots = worker.max_concurrency if worker.autoscale else consumer.pool.limit
    if type(slots) is not int or slots < 1:
        raise ValueError(f"the pool's size is no positive integer: {slots!r}")
    return slots


class _SendingAlso:
    """The consumer's event dispatcher as the heart sees it: each event it sends carries `fields` too; everything else
    is the dispatcher's own (its `enabled` and the callbacks that start and stop the heart)."""

    def __init__(self, dispatcher: Any, fields: dict[str, Any]) -> None:
        self._dispatcher = dispatcher
        self._fields = fields

    def send(self, type: str, **fields: Any) -> Any:
        return self._dispatcher.send(type, **{**fields, **self._fields})  # ours win: a field Celery might add one day

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


class SlotsHeart(Heart):  # type: ignore[misc]  # Celery is untyped
    """Celery's Heart bootstep, its worker-online and worker-heartbeat events carrying the worker's slots."""

    def start(self, c: Any) -> None:
        dispatcher = c.event_dispatcher
        try:
            dispatcher = _SendingAlso(dispatcher, {naming.CONCURRENCY_FIELD: worker_slots(c)})
        except Exception:  # a hint for autoscaling: without it the worker still runs and heartbeats, as Celery's
            logger.warning("the worker's pool size is unknown: its heartbeats go without it", exc_info=True)
        c.heart = heartbeat.Heart(c.timer, dispatcher, self.heartbeat_interval)
        c.heart.start()
