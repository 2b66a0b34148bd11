"""Status conditions as the Kubernetes API conventions define them (pure).

A condition keeps its lastTransitionTime while its status stays the same, so `kubectl describe`
tells how long something has been broken, not when the operator last looked.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.api.models import Condition, ConditionStatus

READY = "Ready"


def timestamp(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def updated(
    existing: Iterable[Mapping[str, Any]],
    *,
    type: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """The conditions with `type` set; other conditions are kept as they are, in their order."""
    result: list[dict[str, Any]] = []
    found = False
    for condition in existing:
        if condition.get("type") != type:
            result.append(dict(condition))
            continue
        found = True
        unchanged = condition.get("status") == status and "lastTransitionTime" in condition
        since = condition["lastTransitionTime"] if unchanged else timestamp(now)
        result.append(_render(type, status, reason, message, generation=generation, since=since))
    if not found:
        result.append(_render(type, status, reason, message, generation=generation, since=timestamp(now)))
    return result


def _render(
    type: str, status: ConditionStatus, reason: str, message: str, *, generation: int | None, since: str
) -> dict[str, Any]:
    condition = Condition(
        type=type,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=since,
    )
    return condition.model_dump(by_alias=True, exclude_none=True)


def find(conditions: Iterable[Mapping[str, Any]], type: str) -> Mapping[str, Any] | None:
    return next((condition for condition in conditions if condition.get("type") == type), None)
