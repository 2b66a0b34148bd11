"""What a CeleryEventReplay's status says, from its start to its end: pure functions of its body, its counts and
the time.

A replay runs once, to completion, as a Job does. Its state is one condition, `Succeeded` (the convention
Knative and Tekton follow for runs): Unknown while it waits or runs, the reason saying which; True or False
once it ended, kept until the resource is deleted.

Only events archived before the replay started are taken (`status.startTime`): a replayed event that fails
again is archived again and must not be replayed a second time. What a started replay must survive — a
restart, a SIGKILL, a lost broker connection — it survives through what is written before anything moves:
`startTime` and `archived` (the messages the archive held then). Its first walk counts what the filter selects
as it moves them (a count first would walk the whole archive before the first event moves), and `matched` is
written once known. A replay that resumes counts the selected events still archived, on an archive it sees whole
(replay/conclusion.py): the others are gone, so replayed (or purged) = matched - still archived; resumed before
`matched` was written (in another process, or after a lost connection), what it moved is what left the archive of
what it held at the start (`archived` - those still archived that were archived before `startTime`: exact unless an
unselected one left otherwise, as by expiry). Either holds whatever the last status write had time to say, and it
goes on with the rest.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.models import SHOWN_EXCEPTION_LENGTH, Condition, ConditionStatus
from celery_event_operator.core.archive.messages import Archived
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.replay.replay_spec import Replay, describe_filter, parse_time
from celery_event_operator.core.service.conclusion import EventNote

SUCCEEDED = "Succeeded"
# Why a replay waits (Succeeded Unknown); each is retried, none touches the archive.
SERVICE_NOT_FOUND = "ServiceNotFound"
SERVICE_NOT_READY = "ServiceNotReady"
WAITING_FOR_REPLAY = "WaitingForReplay"
BROKER_UNAVAILABLE = "BrokerUnavailable"
RUNNING = "Running"

# A spec can be wrong in a thousand places (a filter of 1,000 task ids), a service's own message can be long: what
# status and the Events say is bounded (kopf cuts an Event's message at 1,024 characters).
MAX_REFUSAL_LENGTH = 900
MAX_CONDITION_MESSAGE_LENGTH = 2000


@dataclasses.dataclass(frozen=True)
class Decision:
    """The status fields a replay writes, and the Events to post."""

    status_patch: dict[str, Any]
    events: tuple[EventNote, ...]


def _bounded(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def timestamp(seconds: float) -> str:
    return conditions.timestamp(datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC))


def start_time(now: float) -> float:
    """The millisecond a replay starts at: what `status.startTime` says exactly (read back, the same number). A
    whole second would make events archived in the second before its size was read count as arrivals although
    `archived` holds them (and a resume count them as moved)."""
    moment = datetime.datetime.fromtimestamp(now, tz=datetime.UTC)
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000).timestamp()


def start_timestamp(started_at: float) -> str:
    """`status.startTime`: RFC 3339 to the millisecond."""
    moment = datetime.datetime.fromtimestamp(started_at, tz=datetime.UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


@dataclasses.dataclass(frozen=True)
class Started:
    """What the status of a started replay says (written before anything moved; `matched` once counted)."""

    started_at: float
    archived: int
    matched: int | None
    service_name: str
    generation: int | None
    first_message: Mapping[str, Any] | None


def started(status: Mapping[str, Any]) -> Started | None:
    began = parse_time(status.get("startTime"))
    matched, archived, service = status.get("matched"), status.get("archived"), status.get("serviceName")
    if began is None or not isinstance(archived, int) or not isinstance(service, str):
        return None
    counted = matched if isinstance(matched, int) else None
    return Started(began, archived, counted, service, status.get("observedGeneration"), status.get("firstMessage"))


def succeeded(status: Mapping[str, Any]) -> Mapping[str, Any]:
    return conditions.find_written(status, SUCCEEDED)


def finished(status: Mapping[str, Any] | None) -> bool:
    """Ended (Succeeded True or False): nothing more is done; the resource stays until deleted."""
    return succeeded(status or {}).get("status") in ("True", "False")


def spec_changed(generation: int | None, begun: Started) -> bool:
    """The spec changed after the replay started (the CRD forbids it; an API server without CEL does not)."""
    return generation is not None and begun.generation is not None and generation != begun.generation


def done_before(matched: int, still_selected: int) -> int:
    """What a resumed replay already did: the selected events no longer archived."""
    return max(0, matched - still_selected)


def message_view(item: Archived | None) -> dict[str, Any] | None:
    """An archived event as status shows it: names, ids and its exception's class — never its arguments, nor the
    exception's message, which may echo them (whoever may view the namespace reads a replay's status)."""
    if item is None:
        return None
    view: dict[str, Any] = {"event": item.event[:255]}
    if item.task_id is not None:
        view["taskId"] = item.task_id[:255]
    exception = item.exception_type or (item.exception.split(":", 1)[0] if item.exception else None)
    if exception:
        view["exception"] = exception[:SHOWN_EXCEPTION_LENGTH]
    if item.archived_at is not None:
        view["archivedAt"] = timestamp(item.archived_at)
    return view


def _conditions(
    previous: Sequence[Mapping[str, Any]],
    generation: int | None,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    now: float,
) -> list[dict[str, Any]]:
    updated = conditions.updated(
        _typed(previous),
        type=SUCCEEDED,
        status=status,
        reason=reason,
        message=_bounded(message, MAX_CONDITION_MESSAGE_LENGTH),
        generation=generation,
        now=datetime.datetime.fromtimestamp(now, tz=datetime.UTC),
    )
    return [condition.model_dump(by_alias=True, exclude_none=True) for condition in updated]


def _typed(written: Sequence[Mapping[str, Any]]) -> list[Condition]:
    """The conditions as written (one that does not fit the schema, hand-edited, is left out)."""
    typed = []
    for condition in written:
        try:
            typed.append(Condition.model_validate(condition))
        except ValidationError:
            continue
    return typed


def waiting(
    previous: Sequence[Mapping[str, Any]],
    replay: Replay,
    reason: str,
    message: str,
    *,
    began: Started | None,
    now: float,
) -> Decision:
    """Held, with the reason; nothing is touched. Before it starts, its spec may still change (observedGeneration
    follows); once started, observedGeneration stays the generation it started with."""
    status: dict[str, Any] = {
        "conditions": _conditions(previous, replay.generation, "Unknown", reason, message, now=now)
    }
    if began is None:
        status["observedGeneration"] = replay.generation
    return Decision(status, ())


def refused(
    previous: Sequence[Mapping[str, Any]], generation: int | None, error: InvalidSpecError, *, now: float
) -> Decision:
    """A replay that cannot run as written: it ends at once, nothing touched, one Warning Event."""
    message = f"{_bounded(str(error), MAX_REFUSAL_LENGTH)}; nothing was touched"
    status = {
        "observedGeneration": generation,
        "conditions": _conditions(previous, generation, "False", "InvalidSpec", message, now=now),
    }
    return Decision(status, (EventNote("Warning", "InvalidSpec", message),))


def begun(
    previous: Sequence[Mapping[str, Any]],
    replay: Replay,
    *,
    service_name: str,
    started_at: float,
    archived: int,
    matched: int | None,
) -> Decision:
    """Not yet moved: written (and seen written) before anything moves; the start's Event. `matched` None: not
    counted yet (the first walk counts what it selects as it goes)."""
    dry = " (dry run)" if replay.spec.dry_run else ""
    status: dict[str, Any] = {
        "observedGeneration": replay.generation,
        "serviceName": service_name,
        "startTime": start_timestamp(started_at),
        "archived": archived,
        replay.done_field: 0,
        "skipped": 0,
    }
    if matched is None:
        message = f"{replay.spec.action}{dry} of archived events of {service_name} started"
        note = (
            f"{replay.spec.action}{dry} of {service_name}'s archive started: {archived} archived events, those "
            f"selected ({describe_filter(replay.spec)}) counted as they are taken"
        )
    else:
        target = replay.target(matched)
        status |= {"matched": matched, "remaining": target}
        message = f"{replay.spec.action}{dry} of {target} archived events of {service_name} started"
        note = (
            f"{replay.spec.action}{dry} of {service_name}'s archive started: {matched} of {archived} archived "
            f"events selected ({describe_filter(replay.spec)}), {target} to take"
        )
    status["conditions"] = _conditions(previous, replay.generation, "Unknown", RUNNING, message, now=started_at)
    return Decision(status, (EventNote("Normal", "Started", note),))


def running_again(
    previous: Sequence[Mapping[str, Any]], replay: Replay, service_name: str, *, now: float
) -> dict[str, Any]:
    """Its Running condition back when it moves again after a wait (which wrote its own reason); nothing when the
    condition says Running."""
    if succeeded({"conditions": list(previous)}).get("reason") == RUNNING:
        return {}
    message = f"{replay.spec.action} of archived events of {service_name} goes on"
    return {"conditions": _conditions(previous, replay.generation, "Unknown", RUNNING, message, now=now)}


def progressed(
    replay: Replay,
    *,
    matched: int | None,
    done: int,
    unroutable: int,
    first: Mapping[str, Any] | None,
    last: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The counters while it runs (the condition stays as `begun` wrote it: no write per message); what remains
    once it was counted."""
    status: dict[str, Any] = {replay.done_field: done, "skipped": unroutable}
    if matched is not None:
        status |= {"matched": matched, "remaining": max(0, replay.target(matched) - done - unroutable)}
    if first is not None:
        status["firstMessage"] = first
    if last is not None:
        status["lastMessage"] = last
    return status


def dry_run_ended(
    previous: Sequence[Mapping[str, Any]],
    replay: Replay,
    *,
    service_name: str,
    matched: int,
    preview: Sequence[Archived],
    now: float,
) -> Decision:
    target = replay.target(matched)
    verb = "purge" if replay.purge else "replay"
    message = f"would {verb} {target} of {matched} selected archived events of {service_name}; nothing was changed"
    if preview:
        message += f" (the first {len(preview)} in status.preview)"
    status: dict[str, Any] = {
        "remaining": 0,
        "preview": [message_view(item) for item in preview],
        "completionTime": timestamp(now),
        "conditions": _conditions(previous, replay.generation, "True", "DryRun", message, now=now),
    }
    return Decision(status, (EventNote("Normal", "DryRun", message),))


def ended(
    previous: Sequence[Mapping[str, Any]],
    replay: Replay,
    *,
    service_name: str,
    archived: int,
    matched: int,
    done: int,
    last: Mapping[str, Any] | None,
    now: float,
) -> Decision:
    """All selected events taken (or left, counted as skipped): Succeeded True and the end's Event."""
    skipped = max(0, matched - done)
    where = "purged from the archive" if replay.purge else "sent back to its handler queues"
    message = f"{done} of {matched} selected archived events of {service_name} {where}"
    if skipped:
        message += f"; {skipped} skipped (beyond the limit, or no queue takes them) stay archived"
    others = archived - matched
    if others > 0:
        message += f"; {others} other archived events were not selected"
    status: dict[str, Any] = {
        "matched": matched,
        replay.done_field: done,
        "skipped": skipped,
        "remaining": 0,
        "completionTime": timestamp(now),
        "conditions": _conditions(
            previous, replay.generation, "True", "Purged" if replay.purge else "Replayed", message, now=now
        ),
    }
    if last is not None:
        status["lastMessage"] = last
    return Decision(status, (EventNote("Normal", "Purged" if replay.purge else "Replayed", message),))


def failed(
    previous: Sequence[Mapping[str, Any]], generation: int | None, reason: str, message: str, *, now: float
) -> Decision:
    """Ended without finishing (the archive is gone, the spec changed under it): what it did stays counted."""
    status = {
        "completionTime": timestamp(now),
        "conditions": _conditions(previous, generation, "False", reason, message, now=now),
    }
    return Decision(status, (EventNote("Warning", reason, message),))
