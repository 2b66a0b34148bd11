"""The CeleryEventReplay resource: each one run by its ReplayKeeper (flow/replays.py) in a daemon of its own.

A replay goes to the operator (shard) that keeps the service it names, which also holds the one-replay-per-service
slots. Ended replays (Succeeded True or False) are left alone: no daemon, no finalizer; a running one carries
kopf's finalizer, so that its deletion stops it between two events.
"""

from __future__ import annotations

from typing import Any

import kopf

from celery_event_operator.core.api.metadata import GROUP
from celery_event_operator.core.api.models import REPLAY_PLURAL, VERSION
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.core.replay import replay_status
from celery_event_operator.flow.replays import ReplayKeeper, Shared
from celery_event_operator.handlers.finalizers import left_to_take_off, take_off
from celery_event_operator.handlers.posting import events_poster


@kopf.on.startup()
def share_between_replays(memo: kopf.Memo, **_: Any) -> None:
    memo.replays = Shared()  # the root memo's: every replay's daemon sees the same slots and service reads


def _of_this_shard(namespace: str | None, spec: kopf.Spec, memo: kopf.Memo) -> bool:
    """Of a service of this operator's shard."""
    options: OperatorOptions = memo.options
    reference = spec.get("serviceRef")
    service = reference.get("name") if isinstance(reference, dict) else None
    return options.owns(namespace, service if isinstance(service, str) else None)


def _runs_here(namespace: str | None, spec: kopf.Spec, status: kopf.Status, memo: kopf.Memo, **_: Any) -> bool:
    """Not ended, and of a service of this operator's shard."""
    return not replay_status.finished(status) and _of_this_shard(namespace, spec, memo)


def _others_finalizers_left(
    type: str | None, namespace: str | None, spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> bool:
    # Ended or not: an ended replay may still carry the finalizer of another shard count or of the operator before.
    return _of_this_shard(namespace, spec, memo) and bool(left_to_take_off(type, meta, memo.options))


@kopf.daemon(GROUP, VERSION, REPLAY_PLURAL, when=_runs_here, cancellation_backoff=5.0, cancellation_timeout=20.0)
async def run_replay(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, stopped: kopf.DaemonStopped, **_: Any
) -> None:
    await ReplayKeeper(memo.context, memo.replays, body, events_poster(body, logger), logger).run(stopped)


@kopf.on.event(GROUP, VERSION, REPLAY_PLURAL, when=_others_finalizers_left)
def release_others_finalizers(type: str | None, meta: kopf.Meta, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    # After this shard's deletion: the finalizers of other shard counts, or of the operator before sharding.
    take_off(patch, left_to_take_off(type, meta, memo.options))
