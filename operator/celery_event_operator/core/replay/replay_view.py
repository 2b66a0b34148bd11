"""The command line's side of replays (pure): the CeleryEventReplay `archive replay|purge --via-cluster` creates, and
how far one is as someone following it sees it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from celery_event_operator.core.api.metadata import GROUP
from celery_event_operator.core.api.models import REPLAY_KIND, VERSION, parse_replay_spec
from celery_event_operator.core.replay.replay_status import finished, succeeded


def manifest(
    service: str,
    *,
    purge: bool,
    events: Sequence[str] = (),
    exception_types: Sequence[str] = (),
    task_ids: Sequence[str] = (),
    older_than_seconds: int | None = None,
    newer_than_seconds: int | None = None,
    limit: int | None = None,
    rate_per_second: int | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """The CeleryEventReplay `archive replay|purge --via-cluster` creates (named by the API server); its spec is
    checked here first, so that a mistake is told before anything is created."""
    chosen: dict[str, Any] = {
        "events": list(events),
        "exceptionTypes": list(exception_types),
        "taskIds": list(task_ids),
        "olderThanSeconds": older_than_seconds,
        "newerThanSeconds": newer_than_seconds,
    }
    spec: dict[str, Any] = {
        "serviceRef": {"name": service},
        "action": "purge" if purge else "replay",
        "filter": {key: value for key, value in chosen.items() if value not in (None, [])},
        "limit": limit,
        "ratePerSecond": rate_per_second,
        "dryRun": dry_run,
        "confirm": purge,
    }
    spec = {key: value for key, value in spec.items() if value is not None}
    parse_replay_spec(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": REPLAY_KIND,
        "metadata": {"generateName": f"{service}-{spec['action']}-"[:58]},
        "spec": spec,
    }


@dataclasses.dataclass(frozen=True)
class Seen:
    """A replay's state as someone following it sees it."""

    state: str  # the Succeeded condition's status: "", Unknown, True, False
    reason: str
    message: str
    done: int
    total: int | None  # what it takes, once counted


def seen(body: Mapping[str, Any]) -> Seen:
    status = body.get("status") or {}
    condition = succeeded(status)
    action = (body.get("spec") or {}).get("action")
    done = status.get("purged" if action == "purge" else "replayed") or 0
    total = None
    if isinstance(status.get("remaining"), int):
        total = done + (status.get("skipped") or 0) + status["remaining"]
        if finished(status):
            total = done + (status.get("remaining") or 0)
    return Seen(
        str(condition.get("status") or ""),
        str(condition.get("reason") or ""),
        str(condition.get("message") or ""),
        done,
        total,
    )
