"""What a reconcile concludes, as pure functions of the resource body, the outcome and the time.

Handlers (handlers/) call these and only carry the results to the API: the status patch, and the
Kubernetes Events worth posting (one per change of a failure, one per recovery, never one per
resync of an unchanged failure).
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

from celery_event_operator.api import conditions, models
from celery_event_operator.api.models import (
    GROUP,
    CeleryEventServiceSpec,
    ConditionStatus,
    effective_service_name,
    parse_spec,
)
from celery_event_operator.errors import InvalidSpecError
from celery_event_operator.injection import outcome as injection
from celery_event_operator.topology.declared import Declared
from celery_event_operator.topology.outcome import Outcome

BROKER_REACHABLE = "BrokerReachable"
TOPOLOGY_READY = "TopologyReady"
WORKERS_CONFIGURED = "WorkersConfigured"
MONITORING_READY = "MonitoringReady"
T = TypeVar("T")
# The entities last declared for the service, so that what the spec drops can be removed later.
DECLARED_ANNOTATION = f"{GROUP}/declared-entities"
# The immutable fields as the operator first accepted them: checked again by the operator itself, for API
# servers that do not enforce the CRD's transition rules (and the emulated one).
ACCEPTED_IMMUTABLE_ANNOTATION = f"{GROUP}/accepted-immutable-fields"
_IMMUTABLE_PATHS = tuple(models.immutable_paths())  # read from the models once, not at every reconcile


@dataclasses.dataclass(frozen=True)
class EventNote:
    """A Kubernetes Event to post about the resource."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class Validated:
    spec: CeleryEventServiceSpec
    service_name: str


@dataclasses.dataclass(frozen=True)
class Decision:
    status_patch: dict[str, Any]
    events: tuple[EventNote, ...]
    annotations: dict[str, str]


class GenerationCache(Generic[T]):
    """What was worked out from a resource's spec, per (uid, generation): the spec of a generation never changes.

    Bounded: the oldest entries go first (one per resource is what is used).
    """

    def __init__(self, size: int = 20_000) -> None:
        self._size = size
        self._found: collections.OrderedDict[tuple[str, int], T] = collections.OrderedDict()

    def get(self, body: Mapping[str, Any], work: Callable[[], T]) -> T:
        meta = body.get("metadata") or {}
        uid, generation = meta.get("uid"), meta.get("generation")
        if not isinstance(uid, str) or not isinstance(generation, int):
            return work()
        key = (uid, generation)
        if key in self._found:
            self._found.move_to_end(key)
            return self._found[key]
        found = self._found[key] = work()
        while len(self._found) > self._size:
            self._found.popitem(last=False)
        return found


def validate(body: Mapping[str, Any]) -> Validated:
    """The spec as the operator will act on it; InvalidSpecError with a readable message otherwise."""
    spec = parse_spec(body.get("spec") or {})
    return Validated(spec, effective_service_name(spec, body.get("metadata", {}).get("name", "")))


def immutable_values(body: Mapping[str, Any]) -> dict[str, Any]:
    """`{"broker.vhost": ..., "queueType": ...}`: the spec's immutable fields as written (None when absent)."""
    values: dict[str, Any] = {}
    for path in _IMMUTABLE_PATHS:
        value: Any = body.get("spec") or {}
        for part in path:
            value = value.get(part) if isinstance(value, Mapping) else None
        values[".".join(path)] = value
    return values


def immutable_changes(body: Mapping[str, Any]) -> tuple[dict[str, Any], InvalidSpecError | None]:
    """The immutable fields to remember, and the error when one changed since the operator accepted them."""
    current = immutable_values(body)
    raw = (body.get("metadata", {}).get("annotations") or {}).get(ACCEPTED_IMMUTABLE_ANNOTATION)
    try:
        accepted = json.loads(raw) if raw else None
    except ValueError:
        accepted = None  # hand-edited: start again from what is there now
    if not isinstance(accepted, dict):
        return current, None
    changed = [
        f"{field} is immutable: it was {accepted.get(field)!r} when the resource was accepted and is {value!r} now"
        for field, value in current.items()
        if field in accepted and accepted[field] != value
    ]
    if not changed:
        return current, None
    return accepted, InvalidSpecError("; ".join(changed) + " (set it back, or create a new resource)")


def declared_entities(body: Mapping[str, Any]) -> Declared:
    raw = (body.get("metadata", {}).get("annotations") or {}).get(DECLARED_ANNOTATION)
    return Declared.from_json(raw) if raw else Declared()


class _Conditions:
    """Accumulates condition updates and the Events their transitions deserve."""

    def __init__(self, previous: Sequence[Mapping[str, Any]], generation: int | None, now: datetime.datetime):
        self.previous = list(previous)
        self.current: list[dict[str, Any]] = [dict(c) for c in previous]
        self.generation = generation
        self.now = now
        self.events: list[EventNote] = []

    def set(self, type: str, status: ConditionStatus, reason: str, message: str, *, announce: bool = True) -> None:
        before = conditions.find(self.previous, type) or {}
        self.current = conditions.updated(
            self.current,
            type=type,
            status=status,
            reason=reason,
            message=message,
            generation=self.generation,
            now=self.now,
        )
        if not announce:
            return
        if status == "False" and (before.get("status"), before.get("reason"), before.get("message")) != (
            "False",
            reason,
            message,
        ):
            self.events.append(EventNote("Warning", reason, message))
        elif status == "True" and before.get("status") == "False":
            self.events.append(EventNote("Normal", reason, message))


def _sorted_conditions(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    order = {conditions.READY: 0, BROKER_REACHABLE: 1, TOPOLOGY_READY: 2, WORKERS_CONFIGURED: 3, MONITORING_READY: 4}
    return sorted(items, key=lambda c: order.get(c["type"], 5))


def _previous(body: Mapping[str, Any], previous: Sequence[Mapping[str, Any]] | None) -> Sequence[Mapping[str, Any]]:
    """The conditions to start from: the caller's (what it last wrote), else what the body shows."""
    return previous if previous is not None else (body.get("status") or {}).get("conditions") or []


def _workers(state: _Conditions, workers: injection.Outcome) -> None:
    """WorkersConfigured: the settings exist, and how many pods run with the current ones."""
    if workers.configmap_error is not None:
        state.set(WORKERS_CONFIGURED, "False", "ConfigMapFailed", workers.configmap_error)
        return
    if workers.stamped is not None:
        state.events.append(
            EventNote("Normal", "RolloutStarted", f"settings {workers.config_hash} stamped on {workers.stamped}")
        )
    if workers.target_error is not None:
        state.set(WORKERS_CONFIGURED, "False", "ScaleTargetNotFound", workers.target_error)
    elif workers.pods_current < workers.pods:
        state.set(
            WORKERS_CONFIGURED,
            "False",
            "RolloutPending",
            f"{workers.pods_current}/{workers.pods} pods run with settings {workers.config_hash}"
            + (
                f"; the other {workers.pods - workers.pods_current} are evicted one at a time after "
                f"{workers.heal_after_seconds} s without them"
                if workers.heal_after_seconds is not None
                else ""
            ),
            announce=False,
        )
    else:
        state.set(
            WORKERS_CONFIGURED,
            "True",
            "SettingsCurrent",
            f"{workers.pods}/{workers.pods} pods run with settings {workers.config_hash}",
            announce=False,
        )


def conclude_invalid(
    body: Mapping[str, Any],
    error: InvalidSpecError,
    now: datetime.datetime,
    previous: Sequence[Mapping[str, Any]] | None = None,
    reason: str = "InvalidSpec",
) -> Decision:
    meta = body.get("metadata", {})
    state = _Conditions(_previous(body, previous), meta.get("generation"), now)
    state.set(conditions.READY, "False", reason, str(error))
    return Decision(
        {"observedGeneration": meta.get("generation"), "conditions": _sorted_conditions(state.current)},
        tuple(state.events),
        {},
    )


def conclude(
    body: Mapping[str, Any],
    outcome: Outcome,
    now: datetime.datetime,
    workers: injection.Outcome | None = None,
    previous: Sequence[Mapping[str, Any]] | None = None,
) -> Decision:
    """Status, Events and the remembered entities after a topology sync (and a workers sync)."""
    meta = body.get("metadata", {})
    state = _Conditions(_previous(body, previous), meta.get("generation"), now)
    status: dict[str, Any] = {"observedGeneration": meta.get("generation")}
    annotations: dict[str, str] = {}
    if workers is not None:
        _workers(state, workers)

    if outcome.failure in ("BrokerRefused", "UnsupportedOperation"):
        state.set(BROKER_REACHABLE, "True", "Connected", f"connected to {outcome.broker}")
        state.set(TOPOLOGY_READY, "False", outcome.failure, outcome.failure_message)
        state.set(conditions.READY, "False", outcome.failure, outcome.failure_message, announce=False)
    elif outcome.failure is not None or outcome.report is None:
        reason = outcome.failure or "BrokerUnreachable"
        state.set(BROKER_REACHABLE, "False", reason, outcome.failure_message)
        state.set(
            TOPOLOGY_READY, "Unknown", "BrokerUnreachable", "not checked: the broker cannot be reached", announce=False
        )
        state.set(conditions.READY, "False", reason, outcome.failure_message, announce=False)
    else:
        report = outcome.report
        state.set(BROKER_REACHABLE, "True", "Connected", f"connected to {outcome.broker}")
        if report.problems:
            message = "; ".join(problem.message for problem in report.problems)
            state.set(TOPOLOGY_READY, "False", "ArgumentMismatch", message)
            state.set(conditions.READY, "False", "TopologyMismatch", message, announce=False)
        elif workers is not None and workers.configmap_error is not None:
            state.set(TOPOLOGY_READY, "True", "Declared", f"{len(outcome.topology.queues)} queues declared")
            state.set(conditions.READY, "False", "WorkersNotConfigured", workers.configmap_error, announce=False)
        else:
            topology = outcome.topology
            message = f"{len(topology.queues)} queues and {len(topology.exchanges)} exchanges declared"
            if report.kept:
                waiting = ", ".join(f"{q.name} ({q.messages} messages)" for q in report.kept)
                message += f"; no longer planned, removed once empty: {waiting}"
            state.set(TOPOLOGY_READY, "True", "Declared", message)
            state.set(
                conditions.READY, "True", "Reconciled", f"service {topology.service!r}: {message}", announce=False
            )
        if report.recreated:
            state.events.append(
                EventNote("Normal", "Recreated", "recreated with the planned arguments: " + ", ".join(report.recreated))
            )
        if report.removed:
            state.events.append(
                EventNote("Normal", "Removed", "no longer planned and empty, removed: " + ", ".join(report.removed))
            )
        declared = declared_entities(body)
        remembered = report.remembered(outcome.topology, declared)
        if remembered != declared:
            annotations[DECLARED_ANNOTATION] = remembered.to_json()

    status["conditions"] = _sorted_conditions(state.current)
    return Decision(status, tuple(state.events), annotations)


def conclude_monitoring(
    previous: Sequence[Mapping[str, Any]],
    generation: int | None,
    now: datetime.datetime,
    *,
    enabled: bool,
    problem: str | None,
    announce: bool,
) -> tuple[list[dict[str, Any]], tuple[EventNote, ...]]:
    """MonitoringReady: is the service's events consumer live? (`problem` None: it is). `announce` False for
    problems another condition already announces (the broker unreachable) or that pass by themselves."""
    state = _Conditions(previous, generation, now)
    if not enabled:
        state.current = [c for c in state.current if c.get("type") != MONITORING_READY]
    elif problem is None:
        state.set(MONITORING_READY, "True", "Consuming", "the service's Celery events are consumed", announce=announce)
    else:
        state.set(MONITORING_READY, "False", "EventsNotConsumed", problem, announce=announce)
    return _sorted_conditions(state.current), tuple(state.events)


def conclude_deletion(outcome: Outcome) -> tuple[EventNote, ...]:
    """Events for a deletion with `deletionPolicy: delete`."""
    if outcome.failure is not None or outcome.report is None:
        return (
            EventNote(
                "Warning",
                outcome.failure or "BrokerUnreachable",
                f"the service's queues were not removed: {outcome.failure_message}",
            ),
        )
    notes = []
    if outcome.report.removed:
        notes.append(EventNote("Normal", "Removed", "removed: " + ", ".join(outcome.report.removed)))
    if outcome.report.kept:
        kept = ", ".join(f"{q.name} ({q.messages} messages)" for q in outcome.report.kept)
        notes.append(EventNote("Warning", "KeptNonEmpty", f"kept because they hold messages: {kept}"))
    return tuple(notes)
