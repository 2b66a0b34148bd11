"""One status-and-scaling pass for a service (I/O): read its queues, refresh the counters, and,
with autoscaling, set the workers' replicas through the target's /scale.

The counters and replica fields are this pass's alone (conditions belong to the reconcile handler:
a merge patch replaces a whole list, so two writers of `conditions` would undo each other). Nothing
is decided from missing data: when the queues cannot be read, replicas stay where they are.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from celery_event_operator.api.models import CeleryEventServiceSpec
from celery_event_operator.broker import management
from celery_event_operator.broker.connections import BrokerRegistry, BrokerUnavailableError
from celery_event_operator.injection.settings import SERVICE_LABEL
from celery_event_operator.kubeapi import KubeApi, KubeError, SecretError
from celery_event_operator.monitoring.state import ServiceMetrics
from celery_event_operator.reconcile import EventNote
from celery_event_operator.scaling import policy
from celery_event_operator.topology import apply, plan
from celery_event_operator.topology.sync import broker_address


@dataclasses.dataclass
class ScalerMemory:
    """What one service's passes remember between them (in the operator's memory only)."""

    history: tuple[policy.Recommendation, ...] | None = None
    last_problem: str | None = None


@dataclasses.dataclass(frozen=True)
class Pass:
    status: dict[str, Any]
    events: tuple[EventNote, ...]


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    queue: str
    role: str
    waiting: int  # ready + unacknowledged (ready only without the management API)
    consumers: int


def _depths(topology: plan.Topology, states: list[apply.EntityState], unacked: dict[str, int]) -> list[QueueDepth]:
    roles = {queue.name: queue.role for queue in topology.queues if queue.role != "monitor"}
    return [QueueDepth(state.name, roles[state.name], (state.messages or 0) + unacked.get(state.name, 0),
                       state.consumers or 0)
            for state in states if state.kind == "queue" and state.present and state.name in roles]


def _counters(depths: list[QueueDepth]) -> dict[str, int]:
    totals = {"queueLength": 0, "retrying": 0, "archived": 0, "consumers": 0}
    for depth in depths:
        totals[{"events": "queueLength", "retry": "retrying", "archive": "archived"}[depth.role]] += depth.waiting
        if depth.role == "events":
            totals["consumers"] += depth.consumers
    return totals


def _read_queues(kube: KubeApi, brokers: BrokerRegistry, namespace: str, service: str,
                 spec: CeleryEventServiceSpec) -> tuple[list[QueueDepth], str]:
    """The counters, and where the numbers came from; raises on what makes them unknown."""
    address = broker_address(kube, namespace, spec)
    topology = plan.plan(service, spec)
    states = brokers.get(address).run(lambda connection: apply.inspect(connection, topology))
    try:
        unacked = management.unacknowledged(address, spec.broker.management_url)
        source = "ready + unacknowledged"
    except management.ManagementUnavailableError as exc:
        unacked, source = {}, f"ready only ({exc})"
    return _depths(topology, states, unacked), source


def run_pass(kube: KubeApi, brokers: BrokerRegistry, body: dict[str, Any], *, service: str,
             spec: CeleryEventServiceSpec, memory: ScalerMemory, now: float,
             metrics: ServiceMetrics | None = None) -> Pass:
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    events: list[EventNote] = []
    status: dict[str, Any] = {"selector": f"{SERVICE_LABEL}={service}"}
    try:
        depths, source = _read_queues(kube, brokers, namespace, service, spec)
    except (SecretError, BrokerUnavailableError) as exc:
        problem = f"queue lengths unknown, replicas left as they are: {exc}"
        if problem != memory.last_problem:
            events.append(EventNote("Warning", "ScalingPaused", problem))
        memory.last_problem = problem
        return Pass(status, tuple(events))
    memory.last_problem = None
    counters = _counters(depths)
    status |= counters
    if metrics is not None:  # celery_queue_length / celery_queue_consumers
        metrics.queue_length = {(depth.queue, depth.role): depth.waiting for depth in depths}
        metrics.queue_consumers = {depth.queue: depth.consumers for depth in depths if depth.role == "events"}

    workers = spec.workers
    if workers is None:
        return Pass(status, tuple(events))
    target = workers.scale_target_ref
    try:
        scale = kube.read_scale(namespace, target.kind, target.name)
    except KubeError as exc:
        events.append(EventNote("Warning", "ScalingPaused", str(exc)))
        return Pass(status, tuple(events))
    if scale is None:
        return Pass(status, tuple(events))  # the reconcile reports the missing target
    current, running = scale
    status["replicas"] = running

    if spec.autoscaling.enabled:
        history = memory.history if memory.history is not None else policy.seed(current, now)
        decision = policy.decide(counters["queueLength"], current, spec.autoscaling, history, now)
        memory.history = decision.history
        desired, why = decision.replicas, f"{decision.reason}; counted {source}"
        status["desiredReplicas"] = decision.recommended
    elif workers.replicas is not None:
        desired, why = workers.replicas, f"spec.workers.replicas of {name} is {workers.replicas}"
        status["desiredReplicas"] = desired
    else:
        return Pass(status, tuple(events))

    if desired != current:
        try:
            kube.set_scale(namespace, target.kind, target.name, desired)
        except KubeError as exc:
            events.append(EventNote("Warning", "ScalingFailed", str(exc)))
            return Pass(status, tuple(events))
        status["lastScaleTime"] = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        events.append(EventNote("Normal", "Scaled", f"{target.kind}/{target.name} from {current} to {desired}: {why}"))
    return Pass(status, tuple(events))
