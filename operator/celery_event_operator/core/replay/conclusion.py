"""What a replay does next, from what it saw of the archive (pure): the one place of its honesty rules.

- A replay counts and reports only on an archive it sees whole. Messages another client holds unacknowledged (as
  `archive list` does while it reads) are invisible to a walk: while there are any, the replay waits
  (`ArchiveInUse`, one Event when it starts waiting) — before it starts, when it resumes, and before it ends.
- What it did is counted on the broker: replayed (or purged) = matched - selected events still archived, seen on
  the whole archive. A resumed replay (after a SIGKILL) therefore counts only what left the archive.
- It ends when nothing it may take is left (all taken, beyond the limit, or no queue takes them); otherwise it
  walks the archive again.
- A started replay whose service is deleted stops (`ServiceDeleted`, one Warning Event); what it moved stays
  counted, the rest stays archived.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from celery_event_operator.core.archive.messages import Archived
from celery_event_operator.core.replay import plan
from celery_event_operator.core.service.conclusion import EventNote

ARCHIVE_IN_USE = "ArchiveInUse"
SERVICE_DELETED = "ServiceDeleted"


@dataclasses.dataclass(frozen=True)
class ArchiveSeen:
    """One look at the archive, holding nothing while it was counted."""

    archived: int  # messages the walk saw
    selected: int  # of which the replay's selection takes
    held_elsewhere: int | None  # delivered to other clients, not acknowledged; None: unknown (no management API)
    sample: tuple[Archived, ...] = ()


@dataclasses.dataclass(frozen=True)
class PassDone:
    """What the last walk that moved did."""

    moved: int
    unroutable: int  # selected, no queue took them: they stay archived


@dataclasses.dataclass(frozen=True)
class Step:
    """`wait`: write and look again later; `begin`: write (and see written) before anything moves; `move`: walk the
    archive with `done` already done; `end`: write the end, post its Event."""

    action: Literal["wait", "begin", "move", "end"]
    decision: plan.Decision
    done: int = 0


def conclude(
    previous: Sequence[Mapping[str, Any]],
    replay: plan.Replay,
    *,
    service_name: str,
    began: plan.Started | None,
    started_at: float,
    seen: ArchiveSeen,
    last_pass: PassDone | None,
    now: float,
) -> Step:
    if seen.held_elsewhere:
        return Step("wait", archive_in_use(previous, replay, service_name, began, seen.held_elsewhere, now=now))
    if began is None:
        decision = plan.begun(
            previous,
            replay,
            service_name=service_name,
            started_at=started_at,
            archived=seen.archived,
            matched=seen.selected,
        )
        return Step("begin", decision)
    if replay.spec.dry_run:
        decision = plan.dry_run_ended(
            previous,
            replay,
            service_name=began.service_name,
            matched=began.matched,
            preview=seen.sample,
            now=now,
        )
        return Step("end", decision)
    done = plan.done_before(began.matched, seen.selected)
    unroutable = last_pass.unroutable if last_pass is not None else 0
    left = min(replay.target(began.matched) - done, seen.selected - unroutable)
    if left > 0 and (last_pass is None or last_pass.moved > 0):
        counters = plan.progressed(
            replay, matched=began.matched, done=done, unroutable=0, first=began.first_message, last=None
        )
        return Step("move", plan.Decision(counters, ()), done)
    decision = plan.ended(
        previous,
        replay,
        service_name=began.service_name,
        archived=began.archived,
        matched=began.matched,
        done=done,
        last=None,
        now=now,
    )
    return Step("end", decision, done)


def archive_in_use(
    previous: Sequence[Mapping[str, Any]],
    replay: plan.Replay,
    service_name: str,
    began: plan.Started | None,
    held: int,
    *,
    now: float,
) -> plan.Decision:
    """Waiting to see the whole archive; the Event only when it starts waiting for that."""
    message = (
        f"{held} archived events of {service_name} are held unacknowledged by another client (as `archive list` "
        "holds them while it reads): the replay cannot count or take them, and waits until they are back"
    )
    if began is not None:
        message += "; what was done stays done"
    waiting = plan.waiting(previous, replay, ARCHIVE_IN_USE, message, began=began, now=now)
    if plan.succeeded({"conditions": list(previous)}).get("reason") == ARCHIVE_IN_USE:
        return waiting
    return plan.Decision(waiting.status_patch, (EventNote("Normal", ARCHIVE_IN_USE, message),))


def service_deleted(
    previous: Sequence[Mapping[str, Any]],
    replay: plan.Replay,
    began: plan.Started,
    *,
    done: int,
    unroutable: int,
    now: float,
) -> plan.Decision:
    """Its service was deleted while it ran: stopped; what it moved counted, the rest left archived."""
    left = max(0, began.matched - done)
    where = "purged" if replay.purge else "sent back to its handler queues"
    message = (
        f"service {replay.service} was deleted: the replay stopped; {done} of {began.matched} selected archived "
        f"events of {began.service_name} {where}, {left} stay archived"
    )
    failed = plan.failed(previous, replay.generation, SERVICE_DELETED, message, now=now)
    counters = plan.progressed(replay, matched=began.matched, done=done, unroutable=unroutable, first=None, last=None)
    return plan.Decision({**counters, **failed.status_patch}, failed.events)
