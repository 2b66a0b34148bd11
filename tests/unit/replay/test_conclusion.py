"""Every decision of a replay from what its keeper observed (pure, as one table): why it waits, when it begins,
moves, stops or ends, and the honesty rules of issue 31."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.replay import conclusion, replay_spec, replay_status
from celery_event_operator.core.replay.conclusion import (
    ArchiveSeen,
    BrokerFailure,
    PassDone,
    Problem,
    ReplayObserved,
    ServiceMissing,
    SlotSeen,
)
from tests.unit.flow.fakes import SETTINGS, resource
from tests.unit.replay.test_replay_spec_and_status import CREATED_AT, NOW, body

STARTED_AT = CREATED_AT + 5


def service(ready: str = "True", reason: str = "Reconciled", message: str = "") -> conclusion.ServiceSeen:
    found = resource()
    found["status"] = {"conditions": [{"type": "Ready", "status": ready, "reason": reason, "message": message}]}
    return conclusion.service_seen(found)


def started(matched: int | None, archived: int = 1000) -> replay_status.Started:
    return replay_status.Started(STARTED_AT, archived, matched, "billing", 1, None)


def running() -> dict[str, Any]:
    """The status of a replay that began (its Running condition)."""
    return replay_status.begun(
        [], replay_spec.understand(body()), service_name="billing", started_at=STARTED_AT, archived=1, matched=1
    ).status_patch


def archive_in_use_shown() -> dict[str, Any]:
    """The status of a replay already waiting for a held archive."""
    replay = replay_spec.understand(body())
    return conclusion.archive_in_use([], replay, "billing", None, 800, now=NOW).status_patch


INVALID = InvalidSpecError("spec.action: purge needs confirm: true")
FREE = SlotSeen(None, "billing", "broker.example:5672/shop")
TAKEN = SlotSeen("shop/first", "billing", "broker.example:5672/shop")


def observed(spec: dict[str, Any] | None = None, **facts: Any) -> ReplayObserved:
    """A replay whose service is Ready, whose broker answers and whose turn it is, with `facts` instead."""
    seen: dict[str, Any] = {
        "replay": replay_spec.understand(body(spec)),
        "generation": 1,
        "began": None,
        "written": running(),
        "service": service(),
        "settings": SETTINGS,
        "slot": FREE,
        "started_at": STARTED_AT,
    }
    return ReplayObserved(**(seen | facts))


@pytest.mark.parametrize(
    ("seen", "action", "why", "events", "fields", "text"),
    [
        # --- before the archive: refused, or waiting (Succeeded Unknown) and touching nothing -----------------
        pytest.param(
            observed(replay=INVALID, service=None, written={}),
            "end",
            "InvalidSpec",
            [("Warning", "InvalidSpec")],
            {"observedGeneration": 1},
            "purge needs confirm: true; nothing was touched",
            id="InvalidSpec",
        ),
        pytest.param(
            observed(began=started(1000), generation=2, service=None),
            "end",
            "SpecChanged",
            [("Warning", "SpecChanged")],
            {},
            "the spec changed after the replay started",
            id="SpecChanged",
        ),
        pytest.param(
            observed(replay=INVALID, began=started(1000), generation=2, service=None),
            "end",
            "SpecChanged",
            [("Warning", "SpecChanged")],
            {},
            "it is immutable",
            id="SpecChanged-to-an-invalid-spec",
        ),
        pytest.param(
            observed(service=None, settings=None, slot=None),
            "look",
            None,
            [],
            {},
            "",
            id="its-service-not-looked-at-yet",
        ),
        pytest.param(
            observed(service=ServiceMissing(), written={}),
            "wait",
            "ServiceNotFound",
            [],
            {"observedGeneration": 1},
            "there is no CeleryEventService billing in namespace shop",
            id="ServiceNotFound",
        ),
        pytest.param(
            observed(service=service("False", "BrokerUnreachable", "connection refused")),
            "wait",
            "ServiceNotReady",
            [],
            {},
            "service billing is not Ready (BrokerUnreachable: connection refused); the replay starts once it is",
            id="ServiceNotReady",
        ),
        pytest.param(
            observed(service=Problem("KubernetesAPIForbidden", "cannot get celeryeventservices")),
            "wait",
            "KubernetesAPIForbidden",
            [],
            {},
            "cannot get celeryeventservices",
            id="API-error-reason",
        ),
        pytest.param(
            observed(settings=Problem("BrokerSecretInvalid", "secret rabbitmq has no key url")),
            "wait",
            "BrokerSecretInvalid",
            [],
            {},
            "secret rabbitmq has no key url",
            id="Secret-error-reason",
        ),
        pytest.param(
            observed(slot=TAKEN),
            "wait",
            "WaitingForReplay",
            [],
            {},
            "replay shop/first of the same archive (billing:archived at broker.example:5672/shop) goes first",
            id="WaitingForReplay",
        ),
        pytest.param(
            observed(broker=BrokerFailure("connection refused"), began=started(1000)),
            "wait",
            "BrokerUnavailable",
            [],
            {"observedGeneration": None},
            "connection refused; trying again (what was done stays done)",
            id="BrokerUnavailable",
        ),
        pytest.param(
            observed(
                broker=BrokerFailure(
                    "the archive holds more messages than one walk can count", reason="UnsupportedOperation"
                )
            ),
            "wait",
            "UnsupportedOperation",
            [],
            {},
            "the archive holds more messages than one walk can count; trying again (what was done stays done)",
            id="a refusal waits with its own reason",
        ),
        pytest.param(
            observed(broker=BrokerFailure("no queue billing:archived", archive_not_found=True)),
            "end",
            "ArchiveNotFound",
            [("Warning", "ArchiveNotFound")],
            {},
            "no queue billing:archived",
            id="ArchiveNotFound",
        ),
        pytest.param(
            observed(service=ServiceMissing(), began=started(3000), written=running() | {"replayed": 612}),
            "end",
            "ServiceDeleted",
            [("Warning", "ServiceDeleted")],
            {"replayed": 612, "skipped": 0, "remaining": 2388},
            "service billing was deleted: the replay stopped; 612 of 3000",
            id="ServiceDeleted-found-on-resume",
        ),
        # --- the archive: seen whole or waited for ----------------------------------------------------------
        pytest.param(
            observed(archive=None),
            "look",
            None,
            [],
            {},
            "",
            id="its-archive-not-looked-at-yet",
        ),
        pytest.param(
            observed(archive=ArchiveSeen(1600, 1000, 800), written={}),
            "wait",
            "ArchiveInUse",
            [("Normal", "ArchiveInUse")],
            {"observedGeneration": 1},
            "800 archived events of billing are held unacknowledged by another client",
            id="ArchiveInUse-first-time-an-Event",
        ),
        pytest.param(
            observed(archive=ArchiveSeen(1600, 1000, 700), written=archive_in_use_shown()),
            "wait",
            "ArchiveInUse",
            [],
            {},
            "700 archived events",
            id="ArchiveInUse-again-no-Event",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(1000, 1000, 1000)),
            "wait",
            "ArchiveInUse",
            [("Normal", "ArchiveInUse")],
            {},
            "; what was done stays done",
            id="ArchiveInUse-on-resume",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(0, 0, 1190), last_pass=PassDone(811, 0)),
            "wait",
            "ArchiveInUse",
            [("Normal", "ArchiveInUse")],
            {},
            "1190 archived events",
            id="ArchiveInUse-before-the-end-never-Replayed",
        ),
        pytest.param(
            observed(archive=ArchiveSeen(0, None, None, statistics_behind=True), written={}),
            "wait",
            "StatisticsBehind",
            [],
            {},
            "statistics of the archive of billing did not agree with the broker's own count",
            id="StatisticsBehind-never-begins-on-a-stale-none-held",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(0, None, None, statistics_behind=True)),
            "wait",
            "StatisticsBehind",
            [],
            {},
            "; what was done stays done",
            id="StatisticsBehind-on-resume-never-ends",
        ),
        pytest.param(
            observed(archive=ArchiveSeen(1600, 1000, 0), written={}),
            "begin",
            "Running",
            [("Normal", "Started")],
            {"archived": 1600, "matched": 1000, "replayed": 0, "remaining": 1000, "skipped": 0},
            "replay of 1000 archived events of billing started",
            id="begin",
        ),
        pytest.param(
            observed(archive=ArchiveSeen(1600, 1000, None), written={}),
            "begin",
            "Running",
            [("Normal", "Started")],
            {"matched": 1000},
            "",
            id="begin-without-a-management-API",
        ),
        # --- begun without a count: the first walk counts as it goes, `matched` written once known --------------
        pytest.param(
            observed(archive=ArchiveSeen(1600, None, 0, originals=1600), written={}),
            "begin",
            "Running",
            [("Normal", "Started")],
            {"archived": 1600, "matched": None, "replayed": 0, "skipped": 0, "remaining": None},
            "replay of archived events of billing started",
            id="begin-without-a-count",
        ),
        pytest.param(
            observed(began=started(None, archived=1600), archive=ArchiveSeen(1600, None, 0, originals=1600)),
            "move",
            None,
            [],
            {"replayed": 0, "matched": None, "remaining": None},
            "",
            id="move-the-first-walk-counts",
        ),
        pytest.param(
            observed(began=started(None), archive=ArchiveSeen(600, 300, 0, originals=600), last_pass=PassDone(700, 0)),
            "move",
            None,
            [],
            {"matched": 1000, "replayed": 700, "remaining": 300},
            "",
            id="move-again-its-first-count-is-what-it-moved-and-what-is-left",
        ),
        pytest.param(
            observed(
                began=started(None, archived=1600),
                archive=ArchiveSeen(600, 0, 0, originals=600),
                last_pass=PassDone(1000, 0),
            ),
            "end",
            "Replayed",
            [("Normal", "Replayed")],
            {"matched": 1000, "replayed": 1000, "skipped": 0, "remaining": 0},
            "1000 of 1000 selected archived events of billing sent back",
            id="end-its-first-walk-took-all",
        ),
        pytest.param(
            observed(began=started(None, archived=1600), archive=ArchiveSeen(1100, 400, 0, originals=1000)),
            "move",
            None,
            [],
            {"matched": 1000, "replayed": 600, "remaining": 400},
            "",
            id="move-resumed-before-its-count-what-left-of-what-it-held-was-moved",
        ),
        pytest.param(
            observed(began=started(None), archive=None, last_pass=PassDone(512, 0), halted="service deleted"),
            "look",
            None,
            [],
            {"replayed": 512, "matched": None},
            "",
            id="ServiceDeleted-during-its-first-walk-counts-first",
        ),
        pytest.param(
            observed(
                began=started(None),
                archive=ArchiveSeen(488, 488, 0),
                last_pass=PassDone(512, 0),
                halted="service deleted",
            ),
            "end",
            "ServiceDeleted",
            [("Warning", "ServiceDeleted")],
            {"replayed": 512, "matched": 1000, "remaining": 488},
            "512 of 1000 selected archived events of billing sent back to its handler queues, 488 stay archived",
            id="ServiceDeleted-during-its-first-walk-then-counted",
        ),
        pytest.param(
            observed(
                began=started(None),
                broker=BrokerFailure("no archive", archive_not_found=True),
                last_pass=PassDone(512, 0),
                halted="service deleted",
            ),
            "end",
            "ServiceDeleted",
            [("Warning", "ServiceDeleted")],
            {"replayed": 512, "matched": None},
            "512 selected archived events of billing sent back to its handler queues, the others stay archived",
            id="ServiceDeleted-during-its-first-walk-its-archive-gone",
        ),
        pytest.param(
            observed({"dryRun": True}, began=started(1000), archive=ArchiveSeen(1000, 1000, 0)),
            "end",
            "DryRun",
            [("Normal", "DryRun")],
            {"remaining": 0},
            "would replay 1000 of 1000 selected archived events of billing; nothing was changed",
            id="dry-run-end",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(1190, 1190, 0)),
            "move",
            None,
            [],
            {"replayed": 810, "remaining": 1190},
            "",
            id="move-a-resume-counts-what-left-the-archive",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(1190, 1190, 0), written=archive_in_use_shown()),
            "move",
            "Running",
            [],
            {"replayed": 810, "remaining": 1190},
            "replay of archived events of billing goes on",
            id="move-after-a-wait-says-Running-again",
        ),
        pytest.param(
            observed(began=started(1000), archive=ArchiveSeen(600, 300, 0), last_pass=PassDone(700, 0)),
            "move",
            None,
            [],
            {"replayed": 700, "remaining": 300},
            "",
            id="move-again-some-came-back",
        ),
        pytest.param(
            observed(began=started(2000), archive=ArchiveSeen(0, 0, 0), last_pass=PassDone(1190, 0)),
            "end",
            "Replayed",
            [("Normal", "Replayed")],
            {"replayed": 2000, "skipped": 0, "remaining": 0},
            "2000 of 2000 selected archived events of billing sent back to its handler queues",
            id="end-Replayed",
        ),
        pytest.param(
            observed(began=started(1000), archive=ArchiveSeen(30, 30, 0), last_pass=PassDone(970, 30)),
            "end",
            "Replayed",
            [("Normal", "Replayed")],
            {"replayed": 970, "skipped": 30, "remaining": 0},
            "; 30 skipped (beyond the limit, or no queue takes them) stay archived",
            id="end-Replayed-unroutable-skipped",
        ),
        pytest.param(
            observed(began=started(1000), archive=ArchiveSeen(5, 5, 0), last_pass=PassDone(0, 0)),
            "end",
            "Replayed",
            [("Normal", "Replayed")],
            {"replayed": 995, "skipped": 5},
            "995 of 1000",
            id="end-a-walk-that-moved-nothing",
        ),
        pytest.param(
            observed(
                {"action": "purge", "confirm": True, "limit": 100},
                began=started(1000, archived=1200),
                archive=ArchiveSeen(1100, 900, 0),
                last_pass=PassDone(100, 0),
            ),
            "end",
            "Purged",
            [("Normal", "Purged")],
            {"purged": 100, "skipped": 900, "remaining": 0},
            "100 of 1000 selected archived events of billing purged from the archive; 900 skipped (beyond the limit, "
            "or no queue takes them) stay archived; 200 other archived events were not selected",
            id="end-Purged-beyond-the-limit-skipped",
        ),
        # --- after a walk: look again, or halted ------------------------------------------------------------
        pytest.param(
            observed(began=started(1000), archive=None, last_pass=PassDone(400, 2, 100)),
            "look",
            None,
            [],
            {"replayed": 500, "skipped": 2, "remaining": 498},
            "",
            id="after-a-walk-its-counters-then-look-again",
        ),
        pytest.param(
            observed(began=started(1000), archive=None, last_pass=PassDone(400, 0, 100), halted="stopped"),
            "stop",
            None,
            [],
            {"replayed": 500, "remaining": 500},
            "",
            id="halted-by-stop-resumed-later",
        ),
        pytest.param(
            observed(began=started(3000), archive=None, last_pass=PassDone(512, 0, 100), halted="service deleted"),
            "end",
            "ServiceDeleted",
            [("Warning", "ServiceDeleted")],
            {"replayed": 612, "skipped": 0, "remaining": 2388},
            "612 of 3000 selected archived events of billing sent back to its handler queues, 2388 stay archived",
            id="ServiceDeleted-during-a-walk",
        ),
        pytest.param(
            observed(
                began=started(1000), generation=2, archive=None, last_pass=PassDone(300, 0), halted="spec changed"
            ),
            "end",
            "SpecChanged",
            [("Warning", "SpecChanged")],
            {"replayed": 300, "remaining": 700},
            "nothing more is done; create another",
            id="SpecChanged-during-a-walk",
        ),
    ],
)
def test_what_follows_what_was_observed(
    seen: ReplayObserved,
    action: str,
    why: str | None,
    events: list[tuple[str, str]],
    fields: dict[str, Any],
    text: str,
) -> None:
    step = conclusion.conclude(seen, NOW)
    status = step.decision.status_patch
    assert step.action == action
    assert [(note.type, note.reason) for note in step.decision.events] == events
    assert {key: status.get(key) for key in fields} == fields
    if why is None:
        assert "conditions" not in status, "the condition stays as written"
    else:
        condition = replay_status.succeeded(status)
        assert condition["reason"] == why
        ended = "False" if ("Warning", why) in events else "True"
        assert condition["status"] == (ended if action == "end" else "Unknown")
        assert text in condition["message"]
    if action in ("wait", "look"):
        assert "startTime" not in status, "nothing recorded as started"
        assert "completionTime" not in status, "nor as ended"
    if action == "move":
        assert step.done == fields["replayed"]


@pytest.mark.parametrize(
    ("spec", "began", "done", "limit"),
    [
        pytest.param({}, started(1000), 300, None, id="no-limit-of-its-own-walks-to-the-end"),
        pytest.param({"limit": 500}, started(1000), 300, 200, id="what-the-limit-leaves"),
        pytest.param({"limit": 5000}, started(1000), 300, 700, id="a-limit-beyond-what-matched"),
    ],
)
def test_a_move_takes_at_most_what_its_limit_leaves(
    spec: dict[str, Any], began: replay_status.Started, done: int, limit: int | None
) -> None:
    step = conclusion.conclude(observed(spec, began=began, archive=ArchiveSeen(1000 - done, 1000 - done, 0)), NOW)
    assert (step.action, step.done, step.limit) == ("move", done, limit)


def test_a_begin_says_what_began_and_the_next_look_moves() -> None:
    seen = observed(archive=ArchiveSeen(1600, 1000, 0), written={})
    step = conclusion.conclude(seen, NOW)
    assert step.began == replay_status.Started(STARTED_AT, 1600, 1000, "billing", 1, None)
    then = conclusion.conclude(
        observed(began=step.began, archive=seen.archive, written=step.decision.status_patch), NOW
    )
    assert (then.action, then.done) == ("move", 0)


def test_its_first_count_is_carried_into_what_it_began_with() -> None:
    seen = observed(began=started(None), archive=ArchiveSeen(600, 300, 0, originals=600), last_pass=PassDone(700, 0))
    step = conclusion.conclude(seen, NOW)
    assert step.began == started(1000)
    counted = conclusion.conclude(observed(began=started(1000), archive=ArchiveSeen(600, 300, 0)), NOW)
    assert counted.began is None, "counted before: nothing new to carry"


def test_what_the_log_says() -> None:
    first = conclusion.conclude(observed(slot=TAKEN, written={}), NOW)
    assert first.log.startswith("waits: replay shop/first of the same archive")
    assert not first.warn
    again = conclusion.conclude(observed(slot=TAKEN, written=first.decision.status_patch), NOW)
    assert again.log == "", "a wait is logged when it is new, not at every look"
    refused = conclusion.conclude(observed(replay=INVALID), NOW)
    assert (refused.log, refused.warn) == ("refused: spec.action: purge needs confirm: true", True)
    deleted = conclusion.conclude(observed(service=ServiceMissing(), began=started(10)), NOW)
    assert (deleted.log, deleted.warn) == ("stops: service billing was deleted", True)


@pytest.mark.parametrize(
    ("stopped", "changed", "deleted", "halt"),
    [
        pytest.param(False, False, False, None, id="walks-on"),
        pytest.param(True, True, True, "stopped", id="stopped-first"),
        pytest.param(False, True, True, "spec changed", id="then-the-spec"),
        pytest.param(False, False, True, "service deleted", id="then-the-service"),
    ],
)
def test_what_halts_a_walk(stopped: bool, changed: bool, deleted: bool, halt: str | None) -> None:
    assert conclusion.halted_by(stopped=stopped, spec_changed=changed, service_deleted=deleted) == halt


def test_a_service_without_a_valid_spec_is_not_ready() -> None:
    found = resource(events="none")
    found["status"] = {"conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": ""}]}
    assert conclusion.service_seen(found) == conclusion.ServiceNotReady(("Reconciled", ""))
    assert conclusion.service_seen(resource()) == conclusion.ServiceNotReady(None), "no Ready condition yet"
    ready = service()
    assert isinstance(ready, conclusion.ServiceReady)
    assert ready.service_name == "billing"
