"""What a CeleryEventReplay asks for, understood (pure): the replay to run, or why it cannot run as written.

A replay runs once, to completion, as a Job does (replay_status.py says what its status says as it goes)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from celery_event_operator.core.api.models import CeleryEventReplaySpec, parse_replay_spec
from celery_event_operator.core.archive.messages import Selection
from celery_event_operator.core.errors import InvalidSpecError


@dataclasses.dataclass(frozen=True)
class Replay:
    """A replay's resource as the operator acts on it."""

    namespace: str
    name: str
    generation: int | None
    created_at: float  # unix time
    spec: CeleryEventReplaySpec

    @property
    def purge(self) -> bool:
        return self.spec.action == "purge"

    @property
    def done_field(self) -> str:
        """The status counter of what it did."""
        return "purged" if self.purge else "replayed"

    @property
    def service(self) -> str:
        return self.spec.service_ref.name

    def selection(self, started_at: float) -> Selection:
        """The spec's filter; ages count back from the replay's creation, so they mean the same after a restart."""
        chosen = self.spec.filter
        return Selection(
            events=frozenset(chosen.events),
            exception_types=frozenset(chosen.exception_types),
            task_ids=frozenset(chosen.task_ids),
            archived_since=None if chosen.newer_than_seconds is None else self.created_at - chosen.newer_than_seconds,
            archived_until=None if chosen.older_than_seconds is None else self.created_at - chosen.older_than_seconds,
            started_at=started_at,
        )

    def target(self, matched: int) -> int:
        """How many it takes of the `matched` selected events."""
        return matched if self.spec.limit is None else min(matched, self.spec.limit)


def understand(body: Mapping[str, Any]) -> Replay | InvalidSpecError:
    """The replay to run, or why it cannot run (a readable message): returned, as core/service/spec.py's
    `understand` returns its error, never raised."""
    meta = body.get("metadata") or {}
    raw = body.get("spec") or {}
    reference = raw.get("serviceRef") if isinstance(raw, Mapping) else None
    if isinstance(reference, Mapping) and "namespace" in reference:
        return InvalidSpecError(
            "spec.serviceRef.namespace: a replay acts on a service of its own namespace (whoever may create replays "
            "there may replay that namespace's archives, no other); create it in the service's namespace"
        )
    try:
        spec = parse_replay_spec(raw)
    except InvalidSpecError as exc:
        return exc
    return Replay(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        generation=meta.get("generation"),
        created_at=parse_time(meta.get("creationTimestamp")) or 0.0,
        spec=spec,
    )


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def describe_filter(spec: CeleryEventReplaySpec) -> str:
    chosen, parts = spec.filter, []
    if chosen.events:
        parts.append("events " + ", ".join(chosen.events))
    if chosen.exception_types:
        parts.append("after " + ", ".join(chosen.exception_types))
    if chosen.task_ids:
        parts.append(f"{len(chosen.task_ids)} task ids")
    if chosen.older_than_seconds is not None:
        parts.append(f"archived at least {chosen.older_than_seconds} s before its creation")
    if chosen.newer_than_seconds is not None:
        parts.append(f"archived at most {chosen.newer_than_seconds} s before its creation")
    if spec.limit is not None:
        parts.append(f"at most {spec.limit}")
    if spec.rate_per_second is not None:
        parts.append(f"{spec.rate_per_second}/s")
    return "; ".join(parts) or "every archived event"
