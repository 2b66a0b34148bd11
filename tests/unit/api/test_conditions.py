from __future__ import annotations

import datetime

import pytest

from celery_event_operator.api import conditions

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def ready(
    existing: list[dict[str, object]], status: str, reason: str, now: datetime.datetime, generation: int = 1
) -> list[dict[str, object]]:
    return conditions.updated(
        existing,
        type="Ready",
        status=status,
        reason=reason,  # type: ignore[arg-type]
        message=reason.lower(),
        generation=generation,
        now=now,
    )


def test_new_condition_gets_the_current_time() -> None:
    assert ready([], "True", "Fine", T0) == [
        {
            "type": "Ready",
            "status": "True",
            "reason": "Fine",
            "message": "fine",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-01-01T12:00:00Z",
        }
    ]


@pytest.mark.parametrize(
    ("second_status", "second_reason", "expected_time"),
    [
        pytest.param("True", "Fine", "2026-01-01T12:00:00Z", id="same-status-keeps-time"),
        pytest.param("True", "OtherReason", "2026-01-01T12:00:00Z", id="reason-change-alone-keeps-time"),
        pytest.param("False", "Broken", "2026-01-01T12:05:00Z", id="status-change-moves-time"),
    ],
)
def test_last_transition_time_moves_only_with_status(
    second_status: str, second_reason: str, expected_time: str
) -> None:
    after = ready(ready([], "True", "Fine", T0), second_status, second_reason, T1, generation=2)
    assert after[0]["lastTransitionTime"] == expected_time
    assert after[0]["reason"] == second_reason
    assert after[0]["observedGeneration"] == 2


def test_other_conditions_are_kept_in_order() -> None:
    existing = [
        {"type": "BrokerReachable", "status": "False", "reason": "Down", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    ]
    result = ready(existing, "False", "Broken", T0)
    assert [c["type"] for c in result] == ["BrokerReachable", "Ready"]
    assert result[0] == existing[0]
    assert conditions.find(result, "Ready") == result[1]
    assert conditions.find(result, "Missing") is None
