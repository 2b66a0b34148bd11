"""The replay keeper's sequencing on fakes of its ports (a broker answering as told, an API recording the writes):
it writes what the conclusion says, once, and never an end the broker did not show."""

from __future__ import annotations

import asyncio
from typing import Any

from celery_event_operator.core.replay import replay_spec, replay_status
from celery_event_operator.core.replay.conclusion import ArchiveSeen
from celery_event_operator.flow.replays import ReplayKeeper, Shared
from tests.unit.flow.fakes import (
    SETTINGS,
    FakeBroker,
    FakeBrokers,
    FakeReplayApi,
    FakeReplayBroker,
    FakeReplayContext,
    RecordingLogger,
    resource,
)
from tests.unit.replay.test_replay_spec_and_status import archived, body


class Stopped:
    def __init__(self, after: int) -> None:
        self.waits = after

    def __bool__(self) -> bool:
        return self.waits <= 0

    async def wait(self, seconds: float) -> None:
        self.waits -= 1


def ready_service() -> dict[str, Any]:
    service = resource(events={"handlers": [{"name": "e"}]})
    service["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": ""}]}
    return service


def run(
    replay: dict[str, Any], service: dict[str, Any] | None, broker: FakeReplayBroker, attempts: int = 3
) -> tuple[FakeReplayApi, list[tuple[str, str]]]:
    kube = FakeReplayApi(replay, service)
    context = FakeReplayContext(kube, FakeBrokers(FakeBroker(SETTINGS)), broker)
    posted: list[tuple[str, str]] = []
    keeper = ReplayKeeper(
        context,
        Shared(),
        replay,
        lambda notes: posted.extend((note.type, note.reason) for note in notes),
        RecordingLogger(),
    )
    asyncio.run(keeper.run(Stopped(attempts)))
    return kube, posted


def reasons(kube: FakeReplayApi) -> list[str]:
    return [replay_status.succeeded(patch)["reason"] for patch in kube.patches if "conditions" in patch]


def test_a_held_archive_holds_the_replay_until_it_is_back_then_it_runs_and_ends_on_the_broker_count() -> None:
    broker = FakeReplayBroker(
        seen=[ArchiveSeen(1600, 1000, 800), ArchiveSeen(1600, 1000, 600), ArchiveSeen(1600, 1000, 0)],
        moves=[1000],
    )
    broker.left = ArchiveSeen(600, 0, 0)
    kube, posted = run(body(), ready_service(), broker)

    assert reasons(kube) == ["ArchiveInUse", "ArchiveInUse", "Running", "Replayed"]
    assert posted == [("Normal", "ArchiveInUse"), ("Normal", "Started"), ("Normal", "Replayed")]
    assert broker.asked == [
        *("size", "close", "size", "close"),  # held: looked at, nothing moved
        # Begun on the archive's size (no count first); no limit of its own: its walk goes to the end and counts
        *("size", "move limit=None", "seen_after_move", "close"),
    ]
    status = kube.replay["status"]
    assert (status["matched"], status["replayed"], status["skipped"], status["remaining"]) == (1000, 1000, 0, 0)


def test_a_pass_that_leaves_events_held_does_not_end_the_replay() -> None:
    """The issue's resume: 811 moved, 1,190 held by a reader at the end: not Replayed, it waits and walks again."""
    broker = FakeReplayBroker(seen=[ArchiveSeen(2001, 2001, 0), ArchiveSeen(1190, 1190, 0)], moves=[811, 1190])
    broker.left = ArchiveSeen(0, 0, 1190)
    kube, posted = run(body(), ready_service(), broker, attempts=1)

    assert reasons(kube) == ["Running", "ArchiveInUse"]
    assert "replayed" not in kube.replay["status"] or kube.replay["status"]["replayed"] == 811
    assert ("Normal", "Replayed") not in posted


def test_a_started_replay_whose_service_is_gone_ends_service_deleted_without_touching_the_broker() -> None:
    replay = body(
        status=replay_status.begun(
            [], replay_spec.understand(body()), service_name="billing", started_at=1.8e9, archived=3000, matched=3000
        ).status_patch
        | {"replayed": 612}
    )
    broker = FakeReplayBroker(seen=[], moves=[])
    kube, posted = run(replay, None, broker)

    assert reasons(kube) == ["ServiceDeleted"]
    assert posted == [("Warning", "ServiceDeleted")]
    assert broker.asked == []
    assert kube.replay["status"]["replayed"] == 612


def test_a_replay_that_walks_twice_shows_the_first_event_it_took() -> None:
    broker = FakeReplayBroker(
        seen=[ArchiveSeen(1000, 1000, 0), ArchiveSeen(300, 300, 0), ArchiveSeen(0, 0, 0)],
        moves=[700, 300],
        firsts=[archived(task_id="t-first"), archived(task_id="t-second-walk")],
    )
    kube, posted = run(body(), ready_service(), broker, attempts=1)

    assert reasons(kube) == ["Running", "Replayed"]
    assert posted == [("Normal", "Started"), ("Normal", "Replayed")]
    assert broker.asked == [
        *("size", "move limit=None", "seen_after_move"),
        *("observe", "move limit=None", "seen_after_move"),  # its first count: 700 moved + 300 still archived
        *("observe", "close"),
    ]
    assert kube.replay["status"]["matched"] == 1000
    status = kube.replay["status"]
    assert (status["replayed"], status["remaining"]) == (1000, 0)
    assert status["firstMessage"]["taskId"] == "t-first"


def test_what_its_first_walk_moved_stays_known_across_a_wait_before_its_count() -> None:
    """1,000 of 1,200 archived selected; the first walk moves 700, the count that follows finds 300 held elsewhere;
    by the next look 50 unselected ones expired. What it moved is the 700 it saw moved, not the 750 gone from what
    the archive held at the start; and once it moves again its condition says so (not the wait's)."""
    broker = FakeReplayBroker(
        seen=[
            ArchiveSeen(1200, 1000, 0),
            ArchiveSeen(0, 0, 300),
            ArchiveSeen(450, 300, 0, originals=450),
            ArchiveSeen(150, 0, 0, originals=150),
        ],
        moves=[700, 300],
    )
    kube, _ = run(body(), ready_service(), broker, attempts=2)

    assert reasons(kube) == ["Running", "ArchiveInUse", "Running", "Replayed"]
    status = kube.replay["status"]
    assert (status["matched"], status["replayed"], status["skipped"], status["remaining"]) == (1000, 1000, 0, 0)


def test_a_resumed_replay_goes_on_from_its_start_as_status_shows_it() -> None:
    """Resumed after a SIGKILL, before anything moved: its start and count stand through every walk."""
    begun = replay_status.begun(
        [], replay_spec.understand(body()), service_name="billing", started_at=1.8e9, archived=1000, matched=1000
    )
    broker = FakeReplayBroker(
        seen=[ArchiveSeen(1000, 1000, 0), ArchiveSeen(400, 400, 0), ArchiveSeen(0, 0, 0)], moves=[600, 400]
    )
    kube, posted = run(body(status=begun.status_patch), ready_service(), broker, attempts=1)

    assert reasons(kube) == ["Replayed"], "not begun again"
    assert posted == [("Normal", "Replayed")]
    assert all("startTime" not in patch for patch in kube.patches)
    status = kube.replay["status"]
    assert (status["matched"], status["replayed"], status["remaining"]) == (1000, 1000, 0)
