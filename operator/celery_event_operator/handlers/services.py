"""The CeleryEventService resource: validate, declare its topology, keep status and Events true.

The same reconcile runs on create, on spec changes, on operator start (resume), and on a timer:
the timer is what brings back a hand-deleted queue and re-declares after a broker outage.
"""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import kopf

from celery_event_operator import reconcile
from celery_event_operator.api.models import GROUP, PLURAL, VERSION, InvalidSpecError
from celery_event_operator.injection import sync as injection
from celery_event_operator.topology import sync

RESYNC_SECONDS = float(os.environ.get("CELERY_EVENT_OPERATOR_RESYNC_SECONDS", "30"))
DELETE_RETRIES = 10
DELETE_BACKOFF_SECONDS = 15.0


def _now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


def _post(body: kopf.Body, notes: tuple[reconcile.EventNote, ...], logger: kopf.Logger) -> None:
    for note in notes:
        kopf.event(body, type=note.type, reason=note.reason, message=note.message)
        (logger.warning if note.type == "Warning" else logger.info)("%s: %s", note.reason, note.message)


def _reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger) -> None:
    # A timer tick and a spec change may overlap: one reconcile of an object at a time.
    with memo.setdefault("reconcile_lock", threading.Lock()):
        try:
            validated = reconcile.validate(body)
        except InvalidSpecError as exc:
            decision = reconcile.conclude_invalid(body, exc, _now())
        else:
            outcome = sync.sync(memo.kube, memo.brokers, namespace=body.metadata.namespace or "",
                                service=validated.service_name, spec=validated.spec,
                                previous=reconcile.declared_entities(body))
            workers = injection.sync(memo.kube, owner=dict(body), service=validated.service_name,
                                     spec=validated.spec)
            decision = reconcile.conclude(body, outcome, _now(), workers)
    # Returns nothing: kopf would store a handler's result in status, which belongs to our schema.
    ready: dict[str, Any] = next(
        (c for c in decision.status_patch.get("conditions", []) if c["type"] == "Ready"), {})
    memo.metrics.count_reconcile(ready.get("status") == "True")
    patch.status.update(decision.status_patch)
    patch.metadata.annotations.update(decision.annotations)
    _post(body, decision.events, logger)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
def reconcile_service(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger,
                      **_: Any) -> None:
    _reconcile(body, patch, memo, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync_service(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _reconcile(body, patch, memo, logger)


def _deletes_entities(spec: kopf.Spec, **_: Any) -> bool:
    # With `retain` there is nothing to do at deletion. (Every resource carries kopf's finalizer
    # anyway: kopf stops the resource's timer before letting it go.)
    return spec.get("deletionPolicy") == "delete"


@kopf.on.delete(GROUP, VERSION, PLURAL, when=_deletes_entities, retries=DELETE_RETRIES,
                backoff=DELETE_BACKOFF_SECONDS)
def delete_service_entities(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, retry: int, **_: Any) -> None:
    try:
        validated = reconcile.validate(body)
    except InvalidSpecError:
        return  # never acted on: nothing of it is on the broker
    outcome = sync.sync(memo.kube, memo.brokers, namespace=body.metadata.namespace or "",
                        service=validated.service_name, spec=validated.spec,
                        previous=reconcile.declared_entities(body), remove=True)
    if outcome.failure == "BrokerUnreachable" and retry < DELETE_RETRIES - 1:
        raise kopf.TemporaryError(outcome.failure_message, delay=DELETE_BACKOFF_SECONDS)
    _post(body, reconcile.conclude_deletion(outcome), logger)
