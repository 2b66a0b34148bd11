from __future__ import annotations

import datetime

import pytest

from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.models import Condition, ConditionStatus

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def ready(
    existing: list[Condition], status: ConditionStatus, reason: str, now: datetime.datetime, generation: int = 1
) -> list[Condition]:
    return conditions.updated(
        existing, type="Ready", status=status, reason=reason, message=reason.lower(), generation=generation, now=now
    )


def test_new_condition_gets_the_current_time() -> None:
    [condition] = ready([], "True", "Fine", T0)
    assert condition.model_dump(by_alias=True, exclude_none=True) == {
        "type": "Ready",
        "status": "True",
        "reason": "Fine",
        "message": "fine",
        "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T12:00:00Z",
    }


@pytest.mark.parametrize(
    ("second_status", "second_reason", "expected_time"),
    [
        pytest.param("True", "Fine", "2026-01-01T12:00:00Z", id="same-status-keeps-time"),
        pytest.param("True", "OtherReason", "2026-01-01T12:00:00Z", id="reason-change-alone-keeps-time"),
        pytest.param("False", "Broken", "2026-01-01T12:05:00Z", id="status-change-moves-time"),
    ],
)
def test_last_transition_time_moves_only_with_status(
    second_status: ConditionStatus, second_reason: str, expected_time: str
) -> None:
    [after] = ready(ready([], "True", "Fine", T0), second_status, second_reason, T1, generation=2)
    assert after.last_transition_time == expected_time
    assert after.reason == second_reason
    assert after.observed_generation == 2


def test_other_conditions_are_kept_in_order() -> None:
    existing = [
        Condition(type="BrokerReachable", status="False", reason="Down", last_transition_time="2026-01-01T00:00:00Z")
    ]
    result = ready(existing, "False", "Broken", T0)
    assert [c.type for c in result] == ["BrokerReachable", "Ready"]
    assert result[0] == existing[0]
    assert conditions.find(result, "Ready") == result[1]
    assert conditions.find(result, "Missing") is None
