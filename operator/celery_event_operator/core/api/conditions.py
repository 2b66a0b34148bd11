"""Status conditions as the Kubernetes API conventions define them (pure).

A condition keeps its lastTransitionTime while its status stays the same, so `kubectl describe`
tells how long something has been broken, not when the operator last looked.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.core.api.models import Condition, ConditionStatus

READY = "Ready"


def timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def updated(
    existing: Iterable[Condition],
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime.datetime,
) -> list[Condition]:
    """The conditions with `type` set; other conditions are kept as they are, in their order."""
    result: list[Condition] = []
    found = False
    for condition in existing:
        if condition.type != type:
            result.append(condition)
            continue
        found = True
        since = condition.last_transition_time if condition.status == status else timestamp(now)
        result.append(_condition(type, status, reason, message, generation=generation, since=since))
    if not found:
        result.append(_condition(type, status, reason, message, generation=generation, since=timestamp(now)))
    return result


def _condition(
    type: str, status: ConditionStatus, reason: str, message: str, *, generation: int | None, since: str
) -> Condition:
    return Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )


def find(conditions: Iterable[Condition], type: str) -> Condition | None:
    return next((condition for condition in conditions if condition.type == type), None)


def find_written(status: Mapping[str, Any] | None, type: str) -> Mapping[str, Any]:
    """One condition of a status as the API holds it (a body's, not the typed model's); {} when there is none."""
    found = (status or {}).get("conditions") or []
    return next((c for c in found if isinstance(c, Mapping) and c.get("type") == type), {})
