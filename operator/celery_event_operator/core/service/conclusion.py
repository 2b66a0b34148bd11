"""The whole status of a service concluded from what one pass observed (pure): its conditions, counters and
replicas, the Events worth posting, and the annotations to remember.

One function, `conclude`, is the only author of status. Events follow transitions, not passes: one Warning per
change of a failure, one Normal per recovery, never one per resync of an unchanged failure; the few Events that
are not transitions of a condition (a queue length unknown while autoscaling, an unreadable /scale) are posted
once per distinct problem, which `Announced` remembers between passes.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.metadata import DECLARED_ANNOTATION
from celery_event_operator.core.api.models import CeleryEventServiceStatus, Condition, ConditionStatus
from celery_event_operator.core.broker.alarms import Alarm, describe
from celery_event_operator.core.errors import BrokerRefusedError, KubeUnavailableError, UnsupportedOperationError
from celery_event_operator.core.injection.outcome import WorkersOutcome
from celery_event_operator.core.lifecycle.grace import Grace
from celery_event_operator.core.lifecycle.long_tasks import RunOnce
from celery_event_operator.core.lifecycle.stuck import healthy_message
from celery_event_operator.core.monitoring import report
from celery_event_operator.core.scaling.depths import counters
from celery_event_operator.core.service import ownership
from celery_event_operator.core.service.next_steps import Rhythm, with_next_step
from celery_event_operator.core.service.observations import (
    LifecycleSeen,
    MonitoringSeen,
    Observations,
    OwnershipSeen,
    QueuesSeen,
    ScalingSeen,
)
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.outcome import DeclareOutcome

BROKER_REACHABLE = "BrokerReachable"
TOPOLOGY_READY = "TopologyReady"
WORKERS_CONFIGURED = "WorkersConfigured"
WORKERS_HEALTHY = "WorkersHealthy"
TASKS_RUN_ONCE = "TasksRunOnce"
MONITORING_READY = "MonitoringReady"
BROKER_ALARM = "BrokerAlarm"
# A condition names this many stuck pods, the rest counted; so many WorkerStuck Events at most per pass.
STUCK_NAMED = 10
STUCK_EVENTS_PER_PASS = 5
_ORDER = {
    conditions.READY: 0,
    BROKER_REACHABLE: 1,
    TOPOLOGY_READY: 2,
    WORKERS_CONFIGURED: 3,
    WORKERS_HEALTHY: 4,
    TASKS_RUN_ONCE: 5,
    MONITORING_READY: 6,
}


@dataclasses.dataclass(frozen=True)
class EventNote:
    """A Kubernetes Event to post about the resource."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


# How a keeper posts the Events of its conclusions (kopf's, against the resource it keeps).
PostEvents = Callable[[tuple[EventNote, ...]], None]


@dataclasses.dataclass(frozen=True)
class Announced:
    """The problems already announced by an Event that is no condition's transition (kept between passes)."""

    queues_problem: str | None = None  # why queue lengths are unknown
    scale_problem: str | None = None  # why the workload's /scale cannot be read
    scaling_failure: str | None = None  # why the last change of replicas was refused
    monitoring_failure: bool = False  # the events consumer's own failure
    stuck: frozenset[str] = frozenset()  # the pods announced stuck (one Event each, per episode)
    paused: str | None = None  # the pause of the replacing announced (one Event per pause)
    rerun_causes: frozenset[str] = frozenset()  # the causes of re-runs announced (one Event each, per episode)
    overflowed: frozenset[str] = frozenset()  # the metric labels announced past their bound (one Event in all)
    settings_unavailable: str | None = None  # the Secret has not been readable for long (the API's fault)


@dataclasses.dataclass(frozen=True)
class Conclusion:
    status: CeleryEventServiceStatus
    events: tuple[EventNote, ...]
    annotations: dict[str, str]
    announced: Announced
    resync: bool = False  # a reconcile should conclude the conditions afresh now (a broker alarm cleared)
    cleared: frozenset[str] = frozenset()  # status fields (as the API names them) to remove: no longer true

    @functools.cached_property
    def patch(self) -> dict[str, Any]:
        """The status as the API has it, with the fields to remove as nulls (a merge patch removes them); made once
        (a settled conclusion is written again every pass), not to be changed."""
        return patch_of(self.status) | dict.fromkeys(self.cleared)

    @property
    def ready(self) -> bool:
        found = conditions.find(self.status.conditions, conditions.READY)
        return found is not None and found.status == "True"


@dataclasses.dataclass(frozen=True)
class Settled:
    """A conclusion that changed nothing it started from: no field, no condition, no Event, nothing newly announced.
    Concluded again from an equal start and equal observations it would be the same (`now` only stamps a condition's
    transition), so it is not worked out again: at a thousand services at rest, concluding was a tenth of the
    operator's CPU."""

    seen: Observations
    rhythm: Rhythm
    conclusion: Conclusion

    def answers(
        self, previous: CeleryEventServiceStatus, seen: Observations, announced: Announced, rhythm: Rhythm
    ) -> bool:
        """Whether concluding from these would give this conclusion again: the same rhythm, and the status, the
        announcements and the observations equal to those it settled on (the cheap comparisons first)."""
        return (
            rhythm == self.rhythm
            and announced == self.conclusion.announced
            and previous == self.conclusion.status
            and seen == self.seen
        )


def settled(
    previous: CeleryEventServiceStatus, seen: Observations, announced: Announced, rhythm: Rhythm, conclusion: Conclusion
) -> Settled | None:
    """The conclusion as a settled one, when it changed nothing of `previous` and `announced`; else None."""
    unchanged = not (conclusion.events or conclusion.resync or conclusion.cleared or conclusion.annotations)
    if unchanged and conclusion.announced == announced and conclusion.status == previous:
        return Settled(seen, rhythm, conclusion)
    return None


def status_of(body: Mapping[str, Any]) -> CeleryEventServiceStatus:
    """The status a resource shows, typed; a field that does not fit the schema (hand-edited) is left out."""
    raw = body.get("status") or {}
    try:
        return CeleryEventServiceStatus.model_validate(raw)
    except ValidationError:
        fitting = {}
        for field, value in raw.items():
            try:
                CeleryEventServiceStatus.model_validate({field: value})
            except ValidationError:
                continue
            fitting[field] = value
        return CeleryEventServiceStatus.model_validate(fitting)


def patch_of(status: CeleryEventServiceStatus) -> dict[str, Any]:
    """The status as the API has it (camelCase, no unset fields)."""
    return status.model_dump(by_alias=True, exclude_none=True, mode="json")


def conclude(
    previous: CeleryEventServiceStatus,
    seen: Observations,
    announced: Announced,
    now: datetime.datetime,
    rhythm: Rhythm,
) -> Conclusion:
    """The status after what `seen` observed, starting from `previous` (what was last written, else what the
    resource shows), with the Events worth posting and the annotations to change; `rhythm`: when the operator
    looks again (said in every condition that is not True)."""
    state = _Conditions(previous.conditions, seen.generation, now, rhythm)
    if seen.ownership is not None and not seen.ownership.claim.ours:
        return _conflict(previous, state, seen.ownership)
    if seen.ownership is not None and _was_conflict(state):
        claimed = f"serviceName {seen.ownership.service!r} is this resource's now: its owner is gone"
        state.events.append(EventNote("Normal", ownership.CLAIMED_REASON, claimed))
    fields: dict[str, Any] = {}
    annotations: dict[str, str] = {}
    if seen.invalid is not None:
        state.set(conditions.READY, "False", seen.invalid.reason, str(seen.invalid))
        fields["observed_generation"] = seen.generation
    if seen.workers is not None:
        _workers(state, seen.workers)
    if seen.topology is not None:
        if not _unread(state, seen.topology):
            fields["observed_generation"] = seen.generation
        annotations |= _topology(state, seen.topology, seen.workers, seen.declared, seen.alarms)
        announced = _settings_unavailable(state, seen.settings_unavailable, announced)
    resync = _alarms_seen(state, seen)
    if seen.queues is not None:
        announced = _queues(fields, state, seen.queues, announced, autoscaling=_autoscaling(seen))
    if seen.scaling is not None:
        announced = _scaling(fields, state, seen.scaling, announced, scaling_wanted=_scaling_wanted(seen))
    if seen.lifecycle is not None:
        announced = _lifecycle(state, seen.lifecycle, announced, replacing=_replacing(seen))
    elif seen.spec is not None and seen.spec.workers is None:
        state.remove(WORKERS_HEALTHY)  # no workers to keep (any more)
        fields |= {"grace_period_seconds": None, "grace_period_basis": None}
    if seen.grace is not None:
        fields |= _grace(previous, seen.grace)
    if seen.run_once is not None:
        announced = _run_once(state, seen.run_once, announced)
    elif seen.spec is not None and not seen.spec.monitoring.enabled:
        state.remove(TASKS_RUN_ONCE)  # no events: nothing known of the runs
    if seen.evicted is not None:
        state.events.append(EventNote("Normal", "PodEvicted", f"evicted pod {seen.evicted.pod}: {seen.evicted.why}"))
    if seen.monitoring is not None:
        announced = _monitoring(state, seen.monitoring, announced)
    if seen.overflowing is not None:
        # A label no longer past its bound (the series started afresh) is announced again when it is.
        still = announced.overflowed & frozenset(seen.overflowing)
        overflowed, message = report.overflow_note(still, seen.overflowing)
        if message is not None:
            state.events.append(EventNote("Warning", report.OVERFLOW_REASON, message))
        announced = dataclasses.replace(announced, overflowed=overflowed)
    cleared = _autoscaling_cleared(fields, previous, seen)
    fields["conditions"] = sorted(state.current, key=lambda c: _ORDER.get(c.type, len(_ORDER)))
    return Conclusion(
        previous.model_copy(update=fields), tuple(state.events), annotations, announced, resync, cleared=cleared
    )


# What a resource that does not own its service's topology shows none of: it declares, consumes and counts nothing.
_NOT_OWNED_CONDITIONS = (TOPOLOGY_READY, WORKERS_CONFIGURED, WORKERS_HEALTHY, TASKS_RUN_ONCE, MONITORING_READY)
_NOT_OWNED_FIELDS = {
    "queue_length": "queueLength",
    "retrying": "retrying",
    "archived": "archived",
    "consumers": "consumers",
    "replicas": "replicas",
    "desired_replicas": "desiredReplicas",
    "last_scale_time": "lastScaleTime",
    "grace_period_seconds": "gracePeriodSeconds",
    "grace_period_basis": "gracePeriodBasis",
    "autoscaling": "autoscaling",
}


def _conflict(previous: CeleryEventServiceStatus, state: _Conditions, seen: OwnershipSeen) -> Conclusion:
    """Another resource owns the service's topology: Ready=False naming it (one Warning per change of owner), and
    nothing said of queues, workers or events this resource does not keep (what was announced of them is
    forgotten: announced again once it keeps them)."""
    holder = seen.claim.holder
    assert holder is not None
    state.set(BROKER_REACHABLE, "True", "Connected", f"connected to {seen.broker}", announce=False)
    message = ownership.conflict_message(seen.service, seen.claimant, holder)
    state.set(conditions.READY, "False", ownership.CONFLICT_REASON, message)
    for kept_by_owner in _NOT_OWNED_CONDITIONS:
        state.remove(kept_by_owner)
    fields: dict[str, Any] = dict.fromkeys(_NOT_OWNED_FIELDS)
    fields["observed_generation"] = state.generation
    fields["conditions"] = sorted(state.current, key=lambda c: _ORDER.get(c.type, len(_ORDER)))
    cleared = frozenset(_NOT_OWNED_FIELDS.values())
    return Conclusion(previous.model_copy(update=fields), tuple(state.events), {}, Announced(), cleared=cleared)


def _was_conflict(state: _Conditions) -> bool:
    found = conditions.find(state.previous, conditions.READY)
    return found is not None and found.reason == ownership.CONFLICT_REASON


def conclude_unclaimed_deletion(service: str) -> tuple[EventNote, ...]:
    """`deletionPolicy: delete` of a resource that never claimed its service name: it owns none of the entities."""
    message = (
        f"nothing removed: serviceName {service!r} was claimed by no resource on this broker (this one never owned "
        "it); its entities stay"
    )
    return (EventNote("Warning", ownership.UNCLAIMED_REASON, message),)


def conclude_deletion(
    outcome: DeclareOutcome, claimant: ownership.Claimant, holder: ownership.Holder | None = None, *, removing: bool
) -> tuple[EventNote, ...]:
    """Events for a deletion: what `deletionPolicy: delete` (`removing`) removed and kept, or that nothing was
    removed because another resource (`holder`) owns the service, or why the claim could not be released."""
    service = outcome.topology.service
    if holder is not None:
        message = f"nothing removed: serviceName {service!r} belongs to {holder.describe(claimant)}"
        return (EventNote("Warning", ownership.CONFLICT_REASON, message),)
    if outcome.failure is not None and (outcome.report is not None or not removing):
        message = f"the claim on serviceName {service!r} was not released: {outcome.failure}"
        return (EventNote("Warning", outcome.failure.reason, message),)
    if not removing:
        return ()
    if outcome.failure is not None or outcome.report is None:
        reason = outcome.failure.reason if outcome.failure is not None else "BrokerUnreachable"
        return (EventNote("Warning", reason, f"the service's queues were not removed: {outcome.failure}"),)
    notes = []
    if outcome.report.removed:
        notes.append(EventNote("Normal", "Removed", "removed: " + ", ".join(outcome.report.removed)))
    if outcome.report.kept:
        kept = ", ".join(f"{q.name} ({q.messages} messages)" for q in outcome.report.kept)
        notes.append(EventNote("Warning", "KeptNonEmpty", f"kept because they hold messages: {kept}"))
    return tuple(notes)


class _Conditions:
    """Accumulates condition updates and the Events their transitions deserve."""

    def __init__(
        self, previous: Sequence[Condition], generation: int | None, now: datetime.datetime, rhythm: Rhythm
    ) -> None:
        self.previous = list(previous)
        self.current = list(previous)
        self.generation = generation
        self.now = now
        self.rhythm = rhythm
        self.events: list[EventNote] = []

    def set(self, type: str, status: ConditionStatus, reason: str, message: str, *, announce: bool = True) -> None:
        """The condition as concluded; one that is not True says what happens next (next_steps.py)."""
        if status != "True":
            message = with_next_step(message, reason, self.rhythm)
        before = conditions.find(self.previous, type)
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
        was = (before.status, before.reason, before.message) if before is not None else None
        if status == "False" and was != ("False", reason, message):
            self.events.append(EventNote("Warning", reason, message))
        elif status == "True" and was is not None and was[0] == "False":
            self.events.append(EventNote("Normal", reason, message))

    def remove(self, type: str) -> None:
        self.current = [c for c in self.current if c.type != type]


def _autoscaling(seen: Observations) -> bool:
    return seen.spec is not None and seen.spec.autoscaling.enabled


def _autoscaling_cleared(
    fields: dict[str, Any], previous: CeleryEventServiceStatus, seen: Observations
) -> frozenset[str]:
    """status.autoscaling removed when the spec sets no wait target (any more)."""
    spec = seen.spec
    if previous.autoscaling is None or spec is None:
        return frozenset()
    if spec.autoscaling.enabled and spec.autoscaling.target_wait_seconds is not None:
        return frozenset()
    fields["autoscaling"] = None
    return frozenset({"autoscaling"})


def _replacing(seen: Observations) -> bool:
    """Stuck workers are replaced (workers.replaceStuckWorkers)."""
    workers = seen.spec.workers if seen.spec is not None else None
    return workers is not None and workers.replace_stuck_workers


def _scaling_wanted(seen: Observations) -> bool:
    """Something is to be scaled: by the autoscaler, or to spec.workers.replicas."""
    workers = seen.spec.workers if seen.spec is not None else None
    return _autoscaling(seen) or (workers is not None and workers.replicas is not None)


def _workers(state: _Conditions, workers: WorkersOutcome) -> None:
    """WorkersConfigured: the settings exist, and how many pods run with the current ones. When the Kubernetes API
    did not answer, the condition stays as the last pass found it (a blip the next pass absorbs is no change)."""
    if workers.unavailable is not None:
        if conditions.find(state.current, WORKERS_CONFIGURED) is None:
            state.set(WORKERS_CONFIGURED, "Unknown", KubeUnavailableError.reason, workers.unavailable, announce=False)
        return
    if workers.configmap_error is not None:
        state.set(WORKERS_CONFIGURED, "False", "ConfigMapFailed", workers.configmap_error)
        return
    if workers.stamped is not None:
        state.events.append(
            EventNote("Normal", "RolloutStarted", f"settings {workers.config_hash} stamped on {workers.stamped}")
        )
    if workers.target_error is not None:
        state.set(WORKERS_CONFIGURED, "False", workers.target_reason, workers.target_error)
    elif workers.pods_current < workers.pods and workers.mounted_from is not None:
        message = (
            f"{workers.pods - workers.pods_current}/{workers.pods} pods carry no stamp of the current settings "
            f"{workers.config_hash}: with no webhook they mount ConfigMap {workers.mounted_from} themselves, and which "
            "settings they run is not checked"
        )
        state.set(WORKERS_CONFIGURED, "Unknown", "SettingsNotInjected", message, announce=False)
    elif workers.pods_current < workers.pods:
        healing = (
            f"; the other {workers.pods - workers.pods_current} are evicted one at a time after "
            f"{workers.heal_after_seconds} s without them"
            if workers.heal_after_seconds is not None
            else "; the others get them when they are created again (a rollout, a restart)"
        )
        message = f"{workers.pods_current}/{workers.pods} pods run with settings {workers.config_hash}{healing}"
        state.set(WORKERS_CONFIGURED, "False", "RolloutPending", message, announce=False)
    else:
        message = f"{workers.pods}/{workers.pods} pods run with settings {workers.config_hash}"
        state.set(WORKERS_CONFIGURED, "True", "SettingsCurrent", message, announce=False)


def _topology(
    state: _Conditions,
    outcome: DeclareOutcome,
    workers: WorkersOutcome | None,
    declared: Declared,
    alarms: tuple[Alarm, ...] | None,
) -> dict[str, str]:
    """BrokerReachable, TopologyReady and Ready after a declare (and the broker's alarms); the entities to
    remember."""
    failure = outcome.failure
    if _unread(state, outcome):
        return {}  # the Secret could not be read this time (the API's fault): nothing changed that is known
    if isinstance(failure, BrokerRefusedError | UnsupportedOperationError):
        state.set(BROKER_REACHABLE, "True", "Connected", f"connected to {outcome.broker}")
        state.set(TOPOLOGY_READY, "False", failure.reason, str(failure))
        state.set(conditions.READY, "False", failure.reason, str(failure), announce=False)
        return {}
    if failure is not None or outcome.report is None:
        reason, message = (failure.reason, str(failure)) if failure is not None else ("BrokerUnreachable", "")
        state.set(BROKER_REACHABLE, "False", reason, message)
        not_checked = "not checked: the broker cannot be reached"
        state.set(TOPOLOGY_READY, "Unknown", "BrokerUnreachable", not_checked, announce=False)
        state.set(conditions.READY, "False", reason, message, announce=False)
        return {}
    report, topology = outcome.report, outcome.topology
    if not alarms:
        state.set(BROKER_REACHABLE, "True", "Connected", f"connected to {outcome.broker}")
    ready: tuple[ConditionStatus, str, str]
    if report.problems:
        message = "; ".join(problem.message for problem in report.problems)
        state.set(TOPOLOGY_READY, "False", "ArgumentMismatch", message)
        ready = ("False", "TopologyMismatch", message)
    elif (configmap_error := _configmap_error(state, workers)) is not None:
        state.set(TOPOLOGY_READY, "True", "Declared", f"{len(topology.queues)} queues declared")
        ready = ("False", "WorkersNotConfigured", configmap_error)
    else:
        message = f"{len(topology.queues)} queues and {len(topology.exchanges)} exchanges declared"
        if report.kept:
            waiting = ", ".join(f"{q.name} ({q.messages} messages)" for q in report.kept)
            message += f"; no longer planned, removed once empty: {waiting}"
        state.set(TOPOLOGY_READY, "True", "Declared", message)
        ready = ("True", "Reconciled", f"service {topology.service!r}: {message}")
    if alarms:
        _alarmed(state, alarms)
    else:
        state.set(conditions.READY, *ready, announce=False)
    if report.recreated:
        state.events.append(
            EventNote("Normal", "Recreated", "recreated with the planned arguments: " + ", ".join(report.recreated))
        )
    if report.removed:
        state.events.append(
            EventNote("Normal", "Removed", "no longer planned and empty, removed: " + ", ".join(report.removed))
        )
    remembered = report.remembered(topology, declared)
    return {DECLARED_ANNOTATION: remembered.to_json()} if remembered != declared else {}


def _grace(previous: CeleryEventServiceStatus, grace: Grace) -> dict[str, Any]:
    """The grace period's fields. The basis says what set the grace: while the grace stays, so does it (what decides
    may alternate within a step — a task running now, then the runtimes of the last hour — and each would be a
    status write)."""
    same = previous.grace_period_seconds == grace.seconds and previous.grace_period_basis is not None
    return {
        "grace_period_seconds": grace.seconds,
        "grace_period_basis": previous.grace_period_basis if same else grace.basis,
    }


def _alarmed(state: _Conditions, alarms: tuple[Alarm, ...]) -> None:
    """The broker blocks publishers: BrokerReachable and Ready say which alarm (one Warning); the topology and the
    consumers are as they were."""
    message = describe(alarms)
    state.set(BROKER_REACHABLE, "False", BROKER_ALARM, message)
    state.set(conditions.READY, "False", BROKER_ALARM, message, announce=False)


def _alarms_seen(state: _Conditions, seen: Observations) -> bool:
    """The alarms a status pass saw; True when they cleared (a reconcile should conclude afresh)."""
    if seen.topology is not None or seen.alarms is None:
        return False
    if seen.alarms:
        _alarmed(state, seen.alarms)
        return False
    return _alarms_cleared(state)


def _alarms_cleared(state: _Conditions) -> bool:
    """The alarm the status shows is no longer in effect: a reconcile concludes the conditions afresh."""
    found = conditions.find(state.current, BROKER_REACHABLE)
    return found is not None and found.reason == BROKER_ALARM


def _unread(state: _Conditions, outcome: DeclareOutcome) -> bool:
    """The Secret of a service that was reachable could not be read this time (the API did not answer): nothing
    was done, and the status stays as it was — its observedGeneration too."""
    if not isinstance(outcome.failure, KubeUnavailableError):
        return False
    found = conditions.find(state.previous, BROKER_REACHABLE)
    return found is not None and found.status == "True"


def _configmap_error(state: _Conditions, workers: WorkersOutcome | None) -> str | None:
    """Why the workers' settings are not written: this pass's failure, or the last pass's while the API did not
    answer this time."""
    if workers is None:
        return None
    if workers.unavailable is None:
        return workers.configmap_error
    found = conditions.find(state.current, WORKERS_CONFIGURED)
    return found.message if found is not None and found.reason == "ConfigMapFailed" else None


def _settings_unavailable(state: _Conditions, problem: str | None, announced: Announced) -> Announced:
    """The broker Secret has not been readable for long: the settings last read are still used (nothing else
    changes), said once per episode."""
    if problem is not None and announced.settings_unavailable is None:
        state.events.append(EventNote("Warning", KubeUnavailableError.reason, problem))
    return dataclasses.replace(announced, settings_unavailable=problem)


def _queues(
    fields: dict[str, Any], state: _Conditions, queues: QueuesSeen, announced: Announced, *, autoscaling: bool
) -> Announced:
    """The counters (kept as they were when the depths are unknown: no numbers from missing data)."""
    if queues.depths is None:
        problem = f"queue lengths unknown, replicas left as they are: {queues.problem}"
        if autoscaling and problem != announced.queues_problem:
            state.events.append(EventNote("Warning", "ScalingPaused", problem))
        return dataclasses.replace(announced, queues_problem=problem)
    totals = counters(queues.depths)
    fields |= {
        "queue_length": totals["queueLength"],
        "retrying": totals["retrying"],
        "archived": totals["archived"],
        "consumers": totals["consumers"],
    }
    return dataclasses.replace(announced, queues_problem=None)


def _scaling(
    fields: dict[str, Any], state: _Conditions, scaling: ScalingSeen, announced: Announced, *, scaling_wanted: bool
) -> Announced:
    fields["selector"] = scaling.selector
    if scaling.scale_problem is not None:
        # Worth an Event only when something is to be scaled, and once per distinct problem.
        if scaling_wanted and scaling.scale_problem != announced.scale_problem:
            state.events.append(EventNote("Warning", "ScalingPaused", scaling.scale_problem))
        return dataclasses.replace(announced, scale_problem=scaling.scale_problem)
    if scaling.replicas is not None:
        fields["replicas"] = scaling.replicas
    if scaling.desired is not None:
        fields["desired_replicas"] = scaling.desired
    if scaling.autoscaling is not None:
        fields["autoscaling"] = scaling.autoscaling
    if scaling.failed is not None and scaling.failed != announced.scaling_failure:
        state.events.append(EventNote("Warning", "ScalingFailed", scaling.failed))  # once per distinct refusal
    if scaling.scaled is not None:
        scaled = scaling.scaled
        fields["last_scale_time"] = scaled.at
        message = f"{scaled.target} from {scaled.before} to {scaled.after}: {scaled.why}"
        state.events.append(EventNote("Normal", "Scaled", message))
    if not scaling.scale_checked:
        return announced  # the workload was not looked at: what was announced stays announced
    return dataclasses.replace(announced, scale_problem=None, scaling_failure=scaling.failed)


def _lifecycle(state: _Conditions, lifecycle: LifecycleSeen, announced: Announced, *, replacing: bool) -> Announced:
    """WorkersHealthy: does each Running worker work (what was checked, said as such)? One Warning per pod found
    stuck, one when replacing pauses; `replacing`: workers.replaceStuckWorkers (what happens next)."""
    if lifecycle.unchecked is not None:
        state.set(WORKERS_HEALTHY, "Unknown", "NotChecked", lifecycle.unchecked, announce=False)
        return announced
    judgement = lifecycle.judgement
    if not judgement.stuck:
        state.set(WORKERS_HEALTHY, "True", "WorkersHealthy", healthy_message(judgement, lifecycle.threshold))
        return dataclasses.replace(announced, stuck=frozenset(), paused=None)
    stuck = judgement.stuck
    message = "; ".join(f"{worker.pod}: {worker.why}" for worker in stuck[:STUCK_NAMED])
    if len(stuck) > STUCK_NAMED:
        message += f"; and {len(stuck) - STUCK_NAMED} more (celery_event_operator_stuck_workers)"
    if judgement.paused is not None:
        message = f"{judgement.paused}. {message}"
        if announced.paused is None:
            state.events.append(EventNote("Warning", "ReplacementPaused", judgement.paused))
    elif not replacing:
        message += "; none is replaced (workers.replaceStuckWorkers is off)"
    elif any(worker.replace for worker in stuck):
        message += '; each not said "not replaced" is evicted, one at a time, and its replacement watched'
    state.set(WORKERS_HEALTHY, "False", "WorkersStuck", message, announce=False)
    new = [worker for worker in stuck if worker.pod not in announced.stuck]
    for worker in new[:STUCK_EVENTS_PER_PASS]:
        state.events.append(EventNote("Warning", "WorkerStuck", f"worker pod {worker.pod}: {worker.why}"))
    # The pods not announced yet (beyond the pass's Events) are announced in the next passes.
    announced_now = {worker.pod for worker in stuck if worker.pod in announced.stuck}
    announced_now |= {worker.pod for worker in new[:STUCK_EVENTS_PER_PASS]}
    return dataclasses.replace(announced, stuck=frozenset(announced_now), paused=judgement.paused)


def _run_once(state: _Conditions, run_once: RunOnce, announced: Announced) -> Announced:
    """TasksRunOnce: one Warning per cause of re-runs (per episode), and one when the broker's acknowledgement timeout
    is about to run tasks twice (as any change of a failure)."""
    if run_once.status:
        state.set(TASKS_RUN_ONCE, "True", run_once.reason, run_once.message, announce=False)
        return dataclasses.replace(announced, rerun_causes=frozenset())
    new = run_once.causes - announced.rerun_causes
    state.set(TASKS_RUN_ONCE, "False", run_once.reason, run_once.message, announce=not run_once.causes)
    if new:
        state.events.append(EventNote("Warning", run_once.reason, run_once.message))
    return dataclasses.replace(announced, rerun_causes=announced.rerun_causes | new)


def _monitoring(state: _Conditions, monitoring: MonitoringSeen, announced: Announced) -> Announced:
    """MonitoringReady: is the service's events consumer live? Only the consumer's own failures are Events (a
    broker that cannot be reached is announced by BrokerReachable, a consumer still connecting is no problem),
    and a recovery only after an announced failure."""
    if not monitoring.enabled:
        state.remove(MONITORING_READY)
        return dataclasses.replace(announced, monitoring_failure=False)
    if monitoring.problem is None:
        message = "the service's Celery events are consumed"
        state.set(MONITORING_READY, "True", "Consuming", message, announce=announced.monitoring_failure)
        return dataclasses.replace(announced, monitoring_failure=False)
    state.set(MONITORING_READY, "False", "EventsNotConsumed", monitoring.problem, announce=monitoring.own_failure)
    return dataclasses.replace(announced, monitoring_failure=monitoring.own_failure or announced.monitoring_failure)
