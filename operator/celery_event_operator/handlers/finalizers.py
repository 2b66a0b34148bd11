"""Finalizers of this operator that are not this shard's: left by the shards of another shard count, or by the
operator before it had a finalizer per shard. No running shard owns them, so the shard that keeps the resource
takes them off once its own deletion is done — a service's deletion handler with kopf's own finalizer; otherwise
(a replay, whose daemon kopf stops first; a service deleted before this shard's finalizer came) when the resource
is being deleted without this shard's finalizer — else the deletion would hang on them."""

from __future__ import annotations

import functools
from typing import Any

import kopf

from celery_event_operator.core.api.metadata import others_finalizers
from celery_event_operator.core.options import OperatorOptions


def left_to_take_off(event_type: str | None, meta: kopf.Meta, options: OperatorOptions) -> list[str]:
    """Once this shard's deletion of the resource is done, the other finalizers of this operator still on it."""
    if event_type == "DELETED" or meta.get("deletionTimestamp") is None:
        return []
    finalizers = list(meta.get("finalizers") or [])
    if options.finalizer in finalizers:
        return []  # this shard's deletion is not done yet
    return others_finalizers(finalizers, options.finalizer)


def take_off(patch: kopf.Patch, finalizers: list[str]) -> None:
    """On kopf's patch of the resource after the handler (a JSON patch of the finalizers list)."""
    for finalizer in finalizers:
        patch.fns.append(functools.partial(_without, finalizer=finalizer))


def _without(body: Any, finalizer: str) -> None:
    metadata = body.get("metadata", {})
    if finalizer in metadata.get("finalizers", []):
        metadata["finalizers"].remove(finalizer)
