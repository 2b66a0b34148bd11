"""The CeleryEventService resource: each one kept true by its ServiceKeeper (flow/services.py).

The change handlers reconcile at once (create, spec change, operator start); the resource's one daemon
resyncs the topology, refreshes queue lengths and autoscales on its own schedule, and holds its events
consumer. Deletion with `deletionPolicy: delete` removes the service's empty queues and exchanges.
"""

from __future__ import annotations

from typing import Any

import kopf

from celery_event_operator.core.api.metadata import GROUP, others_finalizers
from celery_event_operator.core.api.models import PLURAL, VERSION
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.core.service.pods import PodsOf
from celery_event_operator.flow.context import Context
from celery_event_operator.flow.services import ServiceKeeper
from celery_event_operator.handlers.finalizers import left_to_take_off, take_off
from celery_event_operator.handlers.posting import events_poster

DELETE_RETRIES = 10
DELETE_BACKOFF_SECONDS = 15.0


def _keeper(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger) -> ServiceKeeper:
    """The resource's keeper (kopf keeps one memo per resource, shared by its handlers and daemon)."""
    keeper: ServiceKeeper | None = memo.get("keeper")
    if keeper is None:
        context: Context = memo.context  # typed: the keeper's ports are checked against the concrete adapters
        keeper = memo["keeper"] = ServiceKeeper(
            context, body.metadata.namespace or "", body.metadata.name or "", events_poster(body, logger), logger
        )
    return keeper


async def _pods(memo: kopf.Memo, body: kopf.Body) -> PodsOf:
    """The live pods of the namespace's services, once they have been listed."""
    context: Context = memo.context
    await context.pods.listed()
    return context.pods.of(body.metadata.namespace or "")


def _owned(namespace: str | None, name: str | None, memo: kopf.Memo, **_: Any) -> bool:
    """Only the services of this operator's shard (`--shard-index/--shard-count`)."""
    options: OperatorOptions = memo.options
    return options.owns(namespace, name)


def _others_finalizers_left(
    type: str | None, namespace: str | None, name: str | None, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> bool:
    return _owned(namespace, name, memo) and bool(left_to_take_off(type, meta, memo.options))


@kopf.on.resume(GROUP, VERSION, PLURAL, when=_owned)
@kopf.on.create(GROUP, VERSION, PLURAL, when=_owned)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec", when=_owned)
async def reconcile_service(
    body: kopf.Body,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    # Returns nothing: kopf would store a handler's result in status, which belongs to our schema. Annotations ride
    # on kopf's own patch of the resource after the handler.
    pods = await _pods(memo, body)
    await _keeper(body, memo, logger).reconcile(body, pods, patch.metadata.annotations.update)


@kopf.daemon(GROUP, VERSION, PLURAL, when=_owned, cancellation_backoff=5.0, cancellation_timeout=10.0)
async def keep_service(
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    await _keeper(body, memo, logger).run(body, await _pods(memo, body), stopped)


@kopf.on.delete(GROUP, VERSION, PLURAL, when=_owned, retries=DELETE_RETRIES, backoff=DELETE_BACKOFF_SECONDS)
async def delete_service_entities(
    *, body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, retry: int, **_: Any
) -> None:
    # Every resource releases its claim on the service's name (core/service/ownership.py), so that another may take
    # it over; with `deletionPolicy: delete` its empty queues and exchanges go first.
    keeper = _keeper(body, memo, logger)
    remove = spec.get("deletionPolicy") == "delete"
    retry_because = await keeper.delete_entities(body, remove=remove, last_try=retry >= DELETE_RETRIES - 1)
    if retry_because is not None:
        raise kopf.TemporaryError(retry_because, delay=DELETE_BACKOFF_SECONDS)
    # With kopf's own finalizer, on the same patch: the finalizers of other shard counts or of the operator before
    # sharding, which no running shard owns.
    options: OperatorOptions = memo.options
    take_off(patch, others_finalizers(list(body.metadata.get("finalizers") or []), options.finalizer))


@kopf.on.event(GROUP, VERSION, PLURAL, when=_others_finalizers_left)
async def release_others_finalizers(
    *,
    type: str | None,
    body: kopf.Body,
    meta: kopf.Meta,
    patch: kopf.Patch,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    # Being deleted under the finalizer of another shard count (or of the operator before sharding) and never under
    # this shard's: it was deleted while no shard of this count ran, so its deletion handler never ran here. Its
    # deletion is done first; when the broker does not answer, the finalizers stay (the next event, or a restart,
    # tries again), as a claim left behind would refuse every other resource of the name for ever.
    remove = body.spec.get("deletionPolicy") == "delete"
    if await _keeper(body, memo, logger).delete_entities(body, remove=remove, last_try=False) is None:
        take_off(patch, left_to_take_off(type, meta, memo.options))
