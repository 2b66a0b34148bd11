"""The I/O steps of a service's passes: each asks the broker or the Kubernetes API one thing (through the
ports) and returns what it observed, never raising for a failure the status should show."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from celery_event_operator.api.metadata import SERVICE_LABEL
from celery_event_operator.errors import BrokerUnavailableError, KubeError, OperatorError
from celery_event_operator.flow.ports import ClusterAccess, ServiceBroker
from celery_event_operator.injection import healing
from celery_event_operator.monitoring.events_connection import Subscription
from celery_event_operator.scaling import policy
from celery_event_operator.scaling.depths import counters
from celery_event_operator.service.observations import (
    Evicted,
    MonitoringSeen,
    QueuesSeen,
    Scaled,
    ScalingSeen,
)
from celery_event_operator.service.pods import WorkerPod
from celery_event_operator.service.spec import Understood
from celery_event_operator.topology.declared import Declared
from celery_event_operator.topology.outcome import DeclareOutcome
from celery_event_operator.topology.plan import Topology


@dataclasses.dataclass
class ScalerMemory:
    """What one service's scaling remembers between passes (in the operator's memory only)."""

    history: tuple[policy.Recommendation, ...] | None = None  # the autoscaler's recommendations
    scale: int | None = None  # the workload's desired replicas (its /scale), as last read
    scale_read_at: float = -float("inf")


async def declare(
    broker: ServiceBroker | None,
    unusable: OperatorError | None,
    topology: Topology,
    declared: Declared,
    *,
    remove: bool = False,
) -> DeclareOutcome:
    """The topology applied (or removed) on the broker; the failure when there is no usable broker."""
    if broker is None:
        return DeclareOutcome(topology, failure=unusable)
    try:
        report = await broker.declare(topology, declared, remove=remove)
    except OperatorError as exc:
        return DeclareOutcome(topology, broker.display, exc)
    return DeclareOutcome(topology, broker.display, report=report)


async def queues(broker: ServiceBroker, topology: Topology, max_age: float) -> QueuesSeen:
    try:
        depths, source = await broker.depths(topology, max_age)
    except BrokerUnavailableError as exc:
        return QueuesSeen(None, problem=str(exc))
    return QueuesSeen(depths, source)


async def scale_workers(
    cluster: ClusterAccess,
    namespace: str,
    understood: Understood,
    *,
    queues: QueuesSeen,
    running: int,
    memory: ScalerMemory,
    now: float,
    scale_max_age: float,
) -> ScalingSeen:
    """The workers' replicas: the workload's scale read (at most every `scale_max_age` seconds, and again before
    any change), the wish of the autoscaler or of spec.workers.replicas, and the change made. Nothing is decided
    from missing data: when the queues cannot be read, replicas stay where they are."""
    seen = ScalingSeen(selector=f"{SERVICE_LABEL}={understood.service}", workload=memory.scale)
    workers = understood.spec.workers
    if queues.depths is None or workers is None:
        return seen
    target = workers.scale_target_ref
    try:
        if memory.scale is None or now - memory.scale_read_at > scale_max_age:
            await _read_scale(cluster, namespace, understood, memory, now)
    except KubeError as exc:
        return dataclasses.replace(seen, scale_problem=str(exc))
    seen = dataclasses.replace(seen, scale_checked=True, workload=memory.scale)
    if memory.scale is None:
        return seen  # the reconcile reports the missing target
    current = memory.scale
    queue_length = counters(queues.depths)["queueLength"]
    wish = policy.wish(understood.spec, queue_length, current, memory.history, now, counted=queues.source)
    seen = dataclasses.replace(seen, replicas=running)
    if wish is None:
        return seen
    memory.history = wish.history
    seen = dataclasses.replace(seen, desired=wish.recommended)
    if wish.replicas == current:
        return seen
    try:
        if memory.scale_read_at != now:  # read before this pass: decide on the workload's count as it is now
            await _read_scale(cluster, namespace, understood, memory, now)
        if memory.scale is None or memory.scale == wish.replicas:
            return dataclasses.replace(seen, workload=memory.scale)
        current = memory.scale
        await cluster.set_scale(namespace, target, wish.replicas)
    except KubeError as exc:
        return dataclasses.replace(seen, failed=str(exc))
    memory.scale = wish.replicas
    at = datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    scaled = Scaled(f"{target.kind}/{target.name}", current, wish.replicas, wish.why, at)
    return dataclasses.replace(seen, workload=wish.replicas, scaled=scaled)


async def _read_scale(
    cluster: ClusterAccess, namespace: str, understood: Understood, memory: ScalerMemory, now: float
) -> None:
    assert understood.spec.workers is not None
    memory.scale = await cluster.read_scale(namespace, understood.spec.workers.scale_target_ref)
    memory.scale_read_at = now


def monitoring(enabled: bool, subscription: Subscription | None, broker: ServiceBroker | None) -> MonitoringSeen:
    """Whether the service's events are consumed, and whether a failure is the consumer's own."""
    if broker is None:
        return MonitoringSeen(enabled, "no usable broker settings (see BrokerReachable)")
    problem = subscription.problem if subscription is not None else None
    own = problem is not None and problem not in (broker.events.problem, Subscription.CONNECTING)
    return MonitoringSeen(enabled, problem, own)


async def heal(
    cluster: ClusterAccess,
    namespace: str,
    memory: healing.HealingMemory,
    pods: list[WorkerPod],
    config_hash: str,
    *,
    heal_old: bool,
    grace_seconds: int,
    now: float,
    logger: logging.Logger | Any,
) -> Evicted | None:
    """Evict the next pod that runs without the current settings, if one is due."""
    step = healing.next_step(
        memory,
        [(pod.name, pod.config_hash) for pod in pods],
        config_hash,
        heal_old=heal_old,
        now=now,
        grace_seconds=grace_seconds,
    )
    if step.evict is None:
        return None
    try:
        evicted = await cluster.evict_pod(namespace, step.evict)
    except KubeError as exc:
        healing.refused(memory)
        logger.warning("%s", exc)
        return None
    if not evicted:
        healing.refused(memory)
        logger.info("eviction of pod %s refused for now (a PodDisruptionBudget); trying again", step.evict)
        return None
    return Evicted(step.evict, step.why)
