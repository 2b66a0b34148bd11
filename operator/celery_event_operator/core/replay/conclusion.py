"""What a replay does next, from what its keeper observed (pure): every decision of the replay flow, and so the one
place of its honesty rules. The keeper (flow/replays.py) gathers the facts in order — its spec, its service, the
broker of its Secret, its turn at the archive, the archive itself — asks `conclude` after each, and does what the
Step says; `look` asks it for the next fact.

- A replay that cannot run as written (`InvalidSpec`), or whose spec changed after it started (`SpecChanged`),
  ends at once; one still waiting for its service, its Secret, the API, its turn or the broker says why in its
  Succeeded condition (Unknown) and touches nothing.
- A replay counts and reports only on an archive it sees whole. Messages another client holds unacknowledged (as
  `archive list` does while it reads) are invisible to a walk: while there are any, the replay waits
  (`ArchiveInUse`, one Event when it starts waiting) — before it starts, when it resumes, and before it ends.
- It begins without a count (`startTime` and the archive's size written first): its first walk moves the selected
  events at its rate and counts them as it goes, and `matched` is known once a walk saw the whole archive (or a
  count after it). What it did is counted on the broker: replayed (or purged) = matched - selected events still
  archived, seen on the whole archive; before `matched` is known, what left the archive of what it held at the
  start (`moved_before`). A resumed replay (after a SIGKILL) therefore counts only what left the archive.
- It ends when nothing it may take is left (all taken, beyond the limit, or no queue takes them); otherwise it
  walks the archive again.
- A started replay whose service is deleted stops (`ServiceDeleted`, one Warning Event); what it moved stays
  counted, the rest stays archived. A stopped one (the operator stops, the resource is deleted) writes its counters
  and is resumed by whichever operator runs next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.archive.messages import Archived
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.replay import replay_spec, replay_status
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import EventNote

ARCHIVE_IN_USE = "ArchiveInUse"
STATISTICS_BEHIND = "StatisticsBehind"
STATISTICS_BEHIND_MESSAGE = (
    "the management API's statistics of the archive of {service} did not agree with the broker's own count, nor were "
    "they refreshed, while asked (a loaded broker refreshes them late): whether another client holds archived events "
    "is not known, so the replay waits and looks again"
)
ARCHIVE_NOT_FOUND = "ArchiveNotFound"
SERVICE_DELETED = "ServiceDeleted"
SPEC_CHANGED = "SpecChanged"

# Why a move returned before its walk's end (the keeper halts it for the first of these it sees).
Halt = Literal["stopped", "spec changed", "service deleted"]


@dataclasses.dataclass(frozen=True)
class ArchiveSeen:
    """One look at the archive, holding nothing while it was counted (or, before a replay begins, its size)."""

    archived: int  # messages the walk saw (before a replay begins: the messages the archive holds)
    selected: int | None  # of which the replay's selection takes; None: not counted (the first walk counts)
    held_elsewhere: int | None  # delivered to other clients, not acknowledged; None: unknown (no management API)
    sample: tuple[Archived, ...] = ()
    originals: int = 0  # of the messages seen, those archived before the replay started (selected or not)
    at: float | None = None  # when its size was read, before a replay begins (unix time): the replay's start
    # The management API's statistics never agreed with the broker's own count while asked: what other clients hold
    # is not known (nothing was counted), and a stale "none" must not let a count go ahead.
    statistics_behind: bool = False


@dataclasses.dataclass(frozen=True)
class PassDone:
    """What the last walk that moved did (or, while it walks, has done so far)."""

    moved: int
    unroutable: int  # selected, no queue took them: they stay archived
    done_before: int = 0  # done before this walk
    first: Mapping[str, Any] | None = None  # the first event the replay took (as status shows it)
    last: Mapping[str, Any] | None = None  # the last event this walk took


@dataclasses.dataclass(frozen=True)
class Problem:
    """Something the replay cannot do yet, with its reason (the API not answering, the Secret unusable)."""

    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class ServiceMissing:
    """No service of that name in the replay's namespace."""


@dataclasses.dataclass(frozen=True)
class ServiceNotReady:
    ready: tuple[Any, Any] | None  # its Ready condition's reason and message, when it has one


@dataclasses.dataclass(frozen=True)
class ServiceReady:
    service_name: str
    spec: CeleryEventServiceSpec


ServiceSeen = ServiceMissing | Problem | ServiceNotReady | ServiceReady


@dataclasses.dataclass(frozen=True)
class SlotSeen:
    """The replay's turn at its archive: `holder` is the replay that has it, None when this one does."""

    holder: str | None
    service_name: str
    broker: str  # the broker's address as shown


@dataclasses.dataclass(frozen=True)
class BrokerFailure:
    message: str
    archive_not_found: bool = False  # the archive does not exist (else: the broker failed or refused)
    # Why it waits: a refusal (a permission, an archive too large) says so.
    reason: str = replay_status.BROKER_UNAVAILABLE


@dataclasses.dataclass(frozen=True)
class ReplayObserved:
    """What the keeper knows of a replay at one moment; None where it has not looked (yet)."""

    replay: replay_spec.Replay | InvalidSpecError
    generation: int | None  # the resource's, now
    began: replay_status.Started | None  # what status says was begun (or was just written)
    written: Mapping[str, Any]  # its status as last written (or as the watch shows it)
    service: ServiceSeen | None = None
    settings: BrokerSettings | Problem | None = None
    slot: SlotSeen | None = None
    broker: BrokerFailure | None = None
    started_at: float | None = None  # the start time the archive was looked at with
    archive: ArchiveSeen | None = None
    last_pass: PassDone | None = None
    halted: Halt | None = None  # why the last move returned early

    @property
    def previous(self) -> list[Mapping[str, Any]]:
        return list(self.written.get("conditions") or [])


@dataclasses.dataclass(frozen=True)
class Step:
    """`look`: write the decision's fields (if any) and gather the next fact; `wait`: write and look again later;
    `begin`: write (and see written) before anything moves, then go on as `began`; `move`: walk the archive with
    `done` already done, taking at most `limit` (with `began`: its first count, written with the counters); `stop`:
    write the counters, the next operator resumes; `end`: write the end, post its Event. `log`: a line for the
    operator's log (a warning when `warn`)."""

    action: Literal["look", "wait", "begin", "move", "stop", "end"]
    decision: replay_status.Decision
    done: int = 0
    limit: int | None = None
    began: replay_status.Started | None = None
    log: str = ""
    warn: bool = False


NOTHING = replay_status.Decision({}, ())


def service_seen(body: Mapping[str, Any]) -> ServiceNotReady | ServiceReady:
    """A service that was found: Ready (with a valid spec) or not."""
    ready = conditions.find_written(body.get("status"), conditions.READY)
    try:
        validated = specs.validate(body)
    except InvalidSpecError:
        validated = None
    if ready.get("status") != "True" or validated is None:
        return ServiceNotReady((ready.get("reason"), ready.get("message")) if ready else None)
    return ServiceReady(validated.service_name, validated.spec)


def halted_by(*, stopped: bool, spec_changed: bool, service_deleted: bool) -> Halt | None:
    """Why a move is to return after the events in hand, the first that holds."""
    if stopped:
        return "stopped"
    if spec_changed:
        return "spec changed"
    if service_deleted:
        return "service deleted"
    return None


def progress(replay: replay_spec.Replay, began: replay_status.Started, walked: PassDone) -> dict[str, Any]:
    """The counters of a walk under way or just returned."""
    return replay_status.progressed(
        replay,
        matched=began.matched,
        done=walked.done_before + walked.moved,
        unroutable=walked.unroutable,
        first=walked.first,
        last=walked.last,
    )


def conclude(observed: ReplayObserved, now: float) -> Step:
    """What follows what the keeper observed: ended by its spec, or by a walk that returned early; waiting for
    what comes before the archive (or a `look` for the next fact); then what the archive shows decides."""
    replay, began, previous = observed.replay, observed.began, observed.previous
    changed = began is not None and replay_status.spec_changed(observed.generation, began)
    if isinstance(replay, InvalidSpecError):
        if changed:
            return Step("end", spec_changed(previous, observed.generation, now=now))
        refusal = replay_status.refused(previous, observed.generation, replay, now=now)
        return Step("end", refusal, log=f"refused: {replay}", warn=True)
    walked = observed.last_pass
    counters = progress(replay, began, walked) if began is not None and walked is not None else {}
    if observed.halted == "stopped":
        return Step("stop", replay_status.Decision(counters, ()))  # resumed by the next operator (or it is gone)
    if changed or observed.halted == "spec changed":
        ended = spec_changed(previous, observed.generation, now=now)
        return Step("end", replay_status.Decision({**counters, **ended.status_patch}, ended.events))
    if observed.halted == "service deleted" and began is not None and walked is not None:
        done = walked.done_before + walked.moved
        seen = observed.archive
        if began.matched is None and seen is None and observed.broker is None:
            # Stopped in its first walk: counted (read only) first.
            return Step("look", replay_status.Decision(counters, ()))
        if began.matched is None and seen is not None and seen.selected is not None and not seen.held_elsewhere:
            began = dataclasses.replace(began, matched=moved_before(began, walked, seen) + seen.selected)
        ended = service_deleted(previous, replay, began, done=done, unroutable=walked.unroutable, now=now)
        return _deleted(replay, replay_status.Decision({**counters, **ended.status_patch}, ended.events))
    ready = _before_the_archive(observed, replay, now=now)
    if isinstance(ready, Step):
        return ready
    if observed.broker is not None:
        if observed.broker.archive_not_found:
            failure = replay_status.failed(
                previous, replay.generation, ARCHIVE_NOT_FOUND, observed.broker.message, now=now
            )
            return Step("end", failure)
        message = f"{observed.broker.message}; trying again (what was done stays done)"
        return _wait(observed, replay, observed.broker.reason, message, now=now)
    if observed.archive is None or observed.started_at is None:
        return Step("look", replay_status.Decision(counters, ()))  # after a walk: its counters, then the archive again
    service_name = began.service_name if began is not None else ready.service_name
    return _from_the_archive(observed, replay, service_name, observed.archive, observed.started_at, now=now)


def _before_the_archive(observed: ReplayObserved, replay: replay_spec.Replay, *, now: float) -> Step | ServiceReady:
    """Waiting for (or, when started, ended by the loss of) its service, its Secret, its turn; a `look` while a fact
    is missing; its Ready service once it may look at the archive."""
    service, began = observed.service, observed.began
    if service is None:
        return Step("look", NOTHING)
    if isinstance(service, ServiceMissing):
        if began is not None:
            done = observed.written.get(replay.done_field)
            ended = service_deleted(
                observed.previous, replay, began, done=done if isinstance(done, int) else 0, unroutable=0, now=now
            )
            return _deleted(replay, ended)
        message = (
            f"there is no CeleryEventService {replay.service} in namespace {replay.namespace} (a replay acts on a "
            "service of its own namespace); it starts when there is one"
        )
        return _wait(observed, replay, replay_status.SERVICE_NOT_FOUND, message, now=now)
    if isinstance(service, Problem):  # the API's fault (not answering, a missing permission): its own reason
        return _wait(observed, replay, service.reason, service.message, now=now)
    if isinstance(service, ServiceNotReady):
        why = f" ({service.ready[0]}: {service.ready[1]})" if service.ready is not None else ""
        message = f"service {replay.service} is not Ready{why}; the replay starts once it is"
        return _wait(observed, replay, replay_status.SERVICE_NOT_READY, message, now=now)
    if observed.settings is None:
        return Step("look", NOTHING)
    if isinstance(observed.settings, Problem):  # the Secret unusable, or the Kubernetes API not answering
        return _wait(observed, replay, observed.settings.reason, observed.settings.message, now=now)
    slot = observed.slot
    if slot is None:
        return Step("look", NOTHING)
    if slot.holder is not None:
        message = (
            f"replay {slot.holder} of the same archive ({slot.service_name}:archived at {slot.broker}) goes first: "
            "one replay of an archive runs at a time"
        )
        return _wait(observed, replay, replay_status.WAITING_FOR_REPLAY, message, now=now)
    return service


def _from_the_archive(
    observed: ReplayObserved,
    replay: replay_spec.Replay,
    service_name: str,
    seen: ArchiveSeen,
    started_at: float,
    *,
    now: float,
) -> Step:
    began, previous, last_pass = observed.began, observed.previous, observed.last_pass
    if seen.statistics_behind:  # no Event: a loaded broker's moment
        message = STATISTICS_BEHIND_MESSAGE.format(service=service_name)
        message += "; what was done stays done" if began is not None else ""
        return _waiting(
            previous, replay_status.waiting(previous, replay, STATISTICS_BEHIND, message, began=began, now=now)
        )
    if seen.held_elsewhere:
        decision = archive_in_use(previous, replay, service_name, began, seen.held_elsewhere, now=now)
        return _waiting(previous, decision)
    if began is None:
        decision = replay_status.begun(
            previous,
            replay,
            service_name=service_name,
            started_at=started_at,
            archived=seen.archived,
            matched=seen.selected,
        )
        started = replay_status.Started(started_at, seen.archived, seen.selected, service_name, replay.generation, None)
        return Step("begin", decision, began=started)
    running = replay_status.running_again(previous, replay, began.service_name, now=now)
    if seen.selected is None:  # just begun, not counted: its first walk counts what it selects as it goes
        counters = replay_status.progressed(replay, matched=None, done=0, unroutable=0, first=None, last=None)
        return Step("move", replay_status.Decision(counters | running, ()), 0, replay.spec.limit)
    counted = None
    matched = began.matched
    if matched is None:  # the first count since it began: what it did, and what is still archived
        matched = moved_before(began, last_pass, seen) + seen.selected
        began = counted = dataclasses.replace(began, matched=matched)
    if replay.spec.dry_run:
        decision = replay_status.dry_run_ended(
            previous,
            replay,
            service_name=began.service_name,
            matched=matched,
            preview=seen.sample,
            now=now,
        )
        return Step("end", decision)
    done = replay_status.done_before(matched, seen.selected)
    unroutable = last_pass.unroutable if last_pass is not None else 0
    left = min(replay.target(matched) - done, seen.selected - unroutable)
    if left > 0 and (last_pass is None or last_pass.moved > 0):
        counters = replay_status.progressed(
            replay, matched=matched, done=done, unroutable=0, first=began.first_message, last=None
        )
        # Without a limit of its own it walks to the end: what it takes is what its selection takes, and a walk
        # over all of the archive is what lets it end without looking again (ReplayBroker.seen_after_move).
        limit = None if replay.spec.limit is None else max(0, replay.target(matched) - done)
        return Step("move", replay_status.Decision(counters | running, ()), done, limit, began=counted)
    decision = replay_status.ended(
        previous,
        replay,
        service_name=began.service_name,
        archived=began.archived,
        matched=matched,
        done=done,
        last=None,
        now=now,
    )
    return Step("end", decision, done)


def moved_before(began: replay_status.Started, last_pass: PassDone | None, seen: ArchiveSeen) -> int:
    """What a replay that began without a count moved before its first count: what its walks did, as this keeper
    saw them; resumed (after a restart, a lost connection), the messages archived before its start that are no
    longer archived — only moves take them (an event that expires or is pushed out meanwhile counts as moved)."""
    if last_pass is not None:
        return last_pass.done_before + last_pass.moved
    return max(0, began.archived - seen.originals)


def _wait(observed: ReplayObserved, replay: replay_spec.Replay, reason: str, message: str, *, now: float) -> Step:
    previous = observed.previous
    return _waiting(previous, replay_status.waiting(previous, replay, reason, message, began=observed.began, now=now))


def _waiting(previous: Sequence[Mapping[str, Any]], decision: replay_status.Decision) -> Step:
    """A wait, logged when its reason or message is new."""
    condition = replay_status.succeeded({"conditions": decision.status_patch.get("conditions") or []})
    current = replay_status.succeeded({"conditions": list(previous)})
    new = (current.get("reason"), current.get("message")) != (condition.get("reason"), condition.get("message"))
    return Step("wait", decision, log=f"waits: {condition.get('message')}" if new else "")


def _deleted(replay: replay_spec.Replay, decision: replay_status.Decision) -> Step:
    return Step("end", decision, log=f"stops: service {replay.service} was deleted", warn=True)


def spec_changed(
    previous: Sequence[Mapping[str, Any]], generation: int | None, *, now: float
) -> replay_status.Decision:
    message = "the spec changed after the replay started (it is immutable): nothing more is done; create another"
    return replay_status.failed(previous, generation, SPEC_CHANGED, message, now=now)


def archive_in_use(
    previous: Sequence[Mapping[str, Any]],
    replay: replay_spec.Replay,
    service_name: str,
    began: replay_status.Started | None,
    held: int,
    *,
    now: float,
) -> replay_status.Decision:
    """Waiting to see the whole archive; the Event only when it starts waiting for that."""
    message = (
        f"{held} archived events of {service_name} are held unacknowledged by another client (as `archive list` "
        "holds them while it reads): the replay cannot count or take them, and waits until they are back"
    )
    if began is not None:
        message += "; what was done stays done"
    waiting = replay_status.waiting(previous, replay, ARCHIVE_IN_USE, message, began=began, now=now)
    if replay_status.succeeded({"conditions": list(previous)}).get("reason") == ARCHIVE_IN_USE:
        return waiting
    return replay_status.Decision(waiting.status_patch, (EventNote("Normal", ARCHIVE_IN_USE, message),))


def service_deleted(
    previous: Sequence[Mapping[str, Any]],
    replay: replay_spec.Replay,
    began: replay_status.Started,
    *,
    done: int,
    unroutable: int,
    now: float,
) -> replay_status.Decision:
    """Its service was deleted while it ran: stopped; what it moved counted, the rest left archived."""
    where = "purged" if replay.purge else "sent back to its handler queues"
    if began.matched is None:  # stopped before its first walk counted them
        counted = f"{done} selected archived events of {began.service_name} {where}, the others stay archived"
    else:
        left = max(0, began.matched - done)
        counted = (
            f"{done} of {began.matched} selected archived events of {began.service_name} {where}, {left} stay archived"
        )
    message = f"service {replay.service} was deleted: the replay stopped; {counted}"
    failed = replay_status.failed(previous, replay.generation, SERVICE_DELETED, message, now=now)
    counters = replay_status.progressed(
        replay, matched=began.matched, done=done, unroutable=unroutable, first=None, last=None
    )
    return replay_status.Decision({**counters, **failed.status_patch}, failed.events)
