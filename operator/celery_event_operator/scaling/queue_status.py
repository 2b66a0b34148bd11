"""One status-and-scaling pass of a service (I/O): its queue depths, the counters in status, and, with
autoscaling, the workers' replicas through the target's /scale.

Depths come from the broker's one listing of the vhost (shared by every service on it; management API),
or, without a management API, from passive declares of the service's queues (ready messages only).
The workload's desired replicas are read at most every `scale_max_age` seconds and again before any change,
so a thousand services do not read a thousand /scale subresources per interval; the replicas running are
the service's live pods, which the operator indexes anyway. Nothing is decided from
missing data: when the queues cannot be read, replicas stay where they are.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from celery_event_operator.api.models import CeleryEventServiceSpec, ScaleTargetRef
from celery_event_operator.broker.brokers import Broker
from celery_event_operator.errors import BrokerUnavailableError, KubeError, ManagementUnavailableError
from celery_event_operator.injection.settings import SERVICE_LABEL
from celery_event_operator.kubeapi import AsyncKubeApi
from celery_event_operator.scaling import policy
from celery_event_operator.service_status import EventNote
from celery_event_operator.topology import apply, plan

ROLE_COUNTERS = {"events": "queueLength", "retry": "retrying", "archive": "archived"}


@dataclasses.dataclass
class ScalerMemory:
    """What one service's passes remember between them (in the operator's memory only)."""

    history: tuple[policy.Recommendation, ...] | None = None
    last_problem: str | None = None  # why queue lengths are unknown (announced once)
    last_scale_problem: str | None = None  # why the workload's scale cannot be read (announced once)
    scale: int | None = None  # the workload's desired replicas (its /scale), as last read
    scale_read_at: float = -float("inf")


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    queue: str
    role: str
    waiting: int  # ready + unacknowledged (ready only without the management API)
    consumers: int


@dataclasses.dataclass(frozen=True)
class Pass:
    status: dict[str, Any]  # the counter and replica fields of status
    events: tuple[EventNote, ...]
    depths: tuple[QueueDepth, ...] | None  # None: unknown this time


def counters(depths: tuple[QueueDepth, ...]) -> dict[str, int]:
    totals = {"queueLength": 0, "retrying": 0, "archived": 0, "consumers": 0}
    for depth in depths:
        totals[ROLE_COUNTERS[depth.role]] += depth.waiting
        if depth.role == "events":
            totals["consumers"] += depth.consumers
    return totals


async def read_depths(broker: Broker, topology: plan.Topology, max_age: float) -> tuple[tuple[QueueDepth, ...], str]:
    """The service's queue depths, and where they came from; BrokerUnavailableError when unknown."""
    roles = {queue.name: queue.role for queue in topology.queues if queue.role != "monitor"}
    try:
        listed = await broker.listing.queues(max_age)
    except ManagementUnavailableError as exc:
        states = await broker.control.run_async(lambda connection: apply.inspect(connection, topology))
        found = tuple(
            QueueDepth(state.name, roles[state.name], state.messages or 0, state.consumers or 0)
            for state in states
            if state.kind == "queue" and state.present and state.name in roles
        )
        return found, f"ready only ({exc})"
    found = tuple(
        QueueDepth(name, role, counts.ready + counts.unacknowledged, counts.consumers)
        for name, role in roles.items()
        if (counts := listed.get(name)) is not None
    )
    return found, "ready + unacknowledged"


async def run_pass(
    kube: AsyncKubeApi,
    broker: Broker,
    body: dict[str, Any],
    *,
    service: str,
    spec: CeleryEventServiceSpec,
    topology: plan.Topology,
    memory: ScalerMemory,
    now: float,
    scale_max_age: float,
    running: int,
) -> Pass:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    events: list[EventNote] = []
    status: dict[str, Any] = {"selector": f"{SERVICE_LABEL}={service}"}
    try:
        depths, source = await read_depths(broker, topology, spec.status_interval_seconds / 2)
    except BrokerUnavailableError as exc:
        problem = f"queue lengths unknown, replicas left as they are: {exc}"
        if spec.autoscaling.enabled and problem != memory.last_problem:
            events.append(EventNote("Warning", "ScalingPaused", problem))
        memory.last_problem = problem
        return Pass(status, tuple(events), None)
    memory.last_problem = None
    totals = counters(depths)
    status |= totals

    workers = spec.workers
    if workers is None:
        return Pass(status, tuple(events), depths)
    target = workers.scale_target_ref
    try:
        if memory.scale is None or now - memory.scale_read_at > scale_max_age:
            await _read_scale(kube, namespace, target, memory, now=now)
    except KubeError as exc:
        # Worth an Event only when something is to be scaled, and once per distinct problem.
        scaling = spec.autoscaling.enabled or workers.replicas is not None
        if scaling and str(exc) != memory.last_scale_problem:
            events.append(EventNote("Warning", "ScalingPaused", str(exc)))
        memory.last_scale_problem = str(exc)
        return Pass(status, tuple(events), depths)
    memory.last_scale_problem = None
    if memory.scale is None:
        return Pass(status, tuple(events), depths)  # the reconcile reports the missing target
    current = memory.scale
    status["replicas"] = running

    if spec.autoscaling.enabled:
        history = memory.history if memory.history is not None else policy.seed(current, now)
        decision = policy.decide(totals["queueLength"], current, spec.autoscaling, history, now)
        memory.history = decision.history
        desired, why = decision.replicas, f"{decision.reason}; counted {source}"
        status["desiredReplicas"] = decision.recommended
    elif workers.replicas is not None:
        desired, why = workers.replicas, f"spec.workers.replicas of {name} is {workers.replicas}"
        status["desiredReplicas"] = desired
    else:
        return Pass(status, tuple(events), depths)

    if desired != current:
        try:
            if memory.scale_read_at != now:  # read before this pass: decide on the workload's count as it is now
                await _read_scale(kube, namespace, target, memory, now=now)
            if memory.scale is None or memory.scale == desired:
                return Pass(status, tuple(events), depths)
            current = memory.scale
            await kube.call(kube.api.set_scale, namespace, target.kind, target.name, desired)
        except KubeError as exc:
            events.append(EventNote("Warning", "ScalingFailed", str(exc)))
            return Pass(status, tuple(events), depths)
        memory.scale = desired
        status["lastScaleTime"] = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        events.append(EventNote("Normal", "Scaled", f"{target.kind}/{target.name} from {current} to {desired}: {why}"))
    return Pass(status, tuple(events), depths)


async def _read_scale(
    kube: AsyncKubeApi, namespace: str, target: ScaleTargetRef, memory: ScalerMemory, *, now: float
) -> None:
    found = await kube.call(kube.api.read_scale, namespace, target.kind, target.name)
    memory.scale = None if found is None else found[0]
    memory.scale_read_at = now
