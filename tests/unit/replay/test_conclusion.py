"""What a replay does next from what it saw of the archive (pure, as tables): the honesty rules of issue 31."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.replay import conclusion, plan
from celery_event_operator.core.replay.conclusion import ArchiveSeen, PassDone
from tests.unit.replay.test_plan import CREATED_AT, NOW, body

STARTED_AT = CREATED_AT + 5


def started(matched: int, archived: int = 1000) -> plan.Started:
    return plan.Started(STARTED_AT, archived, matched, "billing", 1, None)


def running() -> list[dict[str, Any]]:
    begun = plan.begun(
        [], plan.understand(body()), service_name="billing", started_at=STARTED_AT, archived=1, matched=1
    )
    conditions: list[dict[str, Any]] = begun.status_patch["conditions"]
    return conditions


def conclude(
    spec: dict[str, Any] | None = None,
    *,
    began: plan.Started | None,
    seen: ArchiveSeen,
    last_pass: PassDone | None = None,
    previous: list[dict[str, Any]] | None = None,
) -> conclusion.Step:
    return conclusion.conclude(
        previous if previous is not None else running(),
        plan.understand(body(spec)),
        service_name="billing",
        began=began,
        started_at=STARTED_AT,
        seen=seen,
        last_pass=last_pass,
        now=NOW,
    )


def reason(step: conclusion.Step) -> str:
    return str(plan.succeeded(step.decision.status_patch).get("reason"))


@pytest.mark.parametrize(
    ("spec", "began", "seen", "last_pass", "action", "counts", "why"),
    [
        pytest.param(
            {}, None, ArchiveSeen(1600, 1000, 800), None, "wait", {}, "ArchiveInUse", id="held-before-it-starts"
        ),
        pytest.param(
            {}, started(2000), ArchiveSeen(1000, 1000, 1000), None, "wait", {}, "ArchiveInUse", id="held-on-resume"
        ),
        pytest.param(
            {},
            started(2000),
            ArchiveSeen(0, 0, 1190),
            PassDone(811, 0),
            "wait",
            {},
            "ArchiveInUse",
            id="held-before-the-end-never-Replayed",
        ),
        pytest.param(
            {},
            None,
            ArchiveSeen(1600, 1000, 0),
            None,
            "begin",
            {"archived": 1600, "matched": 1000, "replayed": 0, "remaining": 1000},
            "Running",
            id="whole-archive-begins",
        ),
        pytest.param(
            {},
            None,
            ArchiveSeen(1600, 1000, None),
            None,
            "begin",
            {"matched": 1000},
            "Running",
            id="no-management-api-begins",
        ),
        pytest.param(
            {},
            started(2000),
            ArchiveSeen(1190, 1190, 0),
            None,
            "move",
            {"replayed": 810, "remaining": 1190},
            "Running",
            id="resume-counts-what-left-the-archive",
        ),
        pytest.param(
            {},
            started(2000),
            ArchiveSeen(0, 0, 0),
            PassDone(1190, 0),
            "end",
            {"replayed": 2000, "skipped": 0, "remaining": 0},
            "Replayed",
            id="all-moved",
        ),
        pytest.param(
            {},
            started(1000),
            ArchiveSeen(600, 300, 0),
            PassDone(700, 0),
            "move",
            {"replayed": 700, "remaining": 300},
            "Running",
            id="some-came-back-walk-again",
        ),
        pytest.param(
            {},
            started(1000),
            ArchiveSeen(30, 30, 0),
            PassDone(970, 30),
            "end",
            {"replayed": 970, "skipped": 30},
            "Replayed",
            id="unroutable-stay-skipped",
        ),
        pytest.param(
            {"limit": 100},
            started(1000),
            ArchiveSeen(900, 900, 0),
            PassDone(100, 0),
            "end",
            {"replayed": 100, "skipped": 900},
            "Replayed",
            id="limit-reached",
        ),
        pytest.param(
            {},
            started(1000),
            ArchiveSeen(5, 5, 0),
            PassDone(0, 0),
            "end",
            {"replayed": 995, "skipped": 5},
            "Replayed",
            id="a-walk-that-moved-nothing-ends",
        ),
        pytest.param(
            {"dryRun": True},
            started(1000),
            ArchiveSeen(1000, 1000, 0),
            None,
            "end",
            {"remaining": 0},
            "DryRun",
            id="dry-run",
        ),
    ],
)
def test_what_follows_an_observation(
    spec: dict[str, Any],
    began: plan.Started | None,
    seen: ArchiveSeen,
    last_pass: PassDone | None,
    action: str,
    counts: dict[str, int],
    why: str,
) -> None:
    step = conclude(spec, began=began, seen=seen, last_pass=last_pass)
    assert step.action == action
    assert {key: step.decision.status_patch.get(key) for key in counts} == counts
    if action == "move":
        assert "conditions" not in step.decision.status_patch, "the Running condition stays as written"
        assert step.done == counts["replayed"]
    else:
        assert reason(step) == why


def test_waiting_for_a_held_archive_says_how_many_and_posts_one_event() -> None:
    first = conclude(began=None, seen=ArchiveSeen(800, 500, 800), previous=[])
    message = plan.succeeded(first.decision.status_patch)["message"]
    assert "800 archived events of billing are held unacknowledged by another client" in message
    assert plan.succeeded(first.decision.status_patch)["status"] == "Unknown"
    assert [(note.type, note.reason) for note in first.decision.events] == [("Normal", "ArchiveInUse")]
    again = conclude(began=None, seen=ArchiveSeen(800, 500, 700), previous=first.decision.status_patch["conditions"])
    assert again.decision.events == (), "one Event when it starts waiting, not one per look"
    assert "startTime" not in again.decision.status_patch, "nothing recorded as started"


def test_a_replay_whose_service_is_deleted_ends_with_what_it_moved() -> None:
    decision = conclusion.service_deleted(
        running(), plan.understand(body()), started(3000), done=612, unroutable=0, now=NOW
    )
    status = decision.status_patch
    condition = plan.succeeded(status)
    assert (condition["status"], condition["reason"]) == ("False", "ServiceDeleted")
    assert "612 of 3000" in condition["message"]
    assert "2388 stay archived" in condition["message"]
    assert (status["replayed"], status["skipped"], status["remaining"]) == (612, 0, 2388)
    assert [(note.type, note.reason) for note in decision.events] == [("Warning", "ServiceDeleted")]
