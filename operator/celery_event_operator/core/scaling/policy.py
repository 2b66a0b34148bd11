"""How many workers a queue length asks for, with a stabilization window (pure).

    desired = clamp(ceil(queueLength / messagesPerReplica), minReplicas, maxReplicas)

From zero, the service becomes active only above activationQueueLength (a trickle does not wake a
scaled-to-zero service); scaling up may be capped per decision; scaling down goes only to the highest
recommendation of the last scaleDownStabilizationSeconds, so a queue that drains between bursts does
not make the workers flap. The history of recommendations is plain data the caller keeps.
"""

from __future__ import annotations

import dataclasses
import math

from celery_event_operator.core.api.models import DEFAULT_MESSAGES_PER_REPLICA, Autoscaling


@dataclasses.dataclass(frozen=True)
class Recommendation:
    at: float  # seconds on the caller's clock
    replicas: int


@dataclasses.dataclass(frozen=True)
class Decision:
    replicas: int  # what the target should have now
    recommended: int  # what the queue alone asks for (status.desiredReplicas)
    history: tuple[Recommendation, ...]
    reason: str


def recommend(queue_length: int, current: int, policy: Autoscaling) -> int:
    if queue_length <= policy.activation_queue_length and (current == 0 or queue_length == 0):
        wanted = 0  # inactive: at or below the activation threshold nothing wakes a service at zero
    else:
        wanted = max(1, math.ceil(queue_length / (policy.messages_per_replica or DEFAULT_MESSAGES_PER_REPLICA)))
    return min(max(wanted, policy.min_replicas), policy.max_replicas)


def decide(
    queue_length: int, current: int, policy: Autoscaling, history: tuple[Recommendation, ...], now: float
) -> Decision:
    recommended = recommend(queue_length, current, policy)
    window_start = now - policy.scale_down_stabilization_seconds
    history = (*(r for r in history if r.at >= window_start), Recommendation(now, recommended))
    if recommended > current:
        step = policy.scale_up_limit_per_interval
        replicas = min(recommended, current + step) if step else recommended
        reason = f"queue length {queue_length} asks for {recommended}"
        if replicas < recommended:
            reason += f" (at most {step} more per interval)"
    elif recommended < current:
        replicas = min(current, max(r.replicas for r in history))
        reason = f"queue length {queue_length} asks for {recommended}" + (
            ""
            if replicas == recommended
            else f"; held at {replicas} for the {policy.scale_down_stabilization_seconds}s stabilization window"
        )
    else:
        replicas, reason = current, f"queue length {queue_length} asks for {recommended}"
    return Decision(replicas, recommended, history, reason)


def seed(current: int, now: float) -> tuple[Recommendation, ...]:
    """A fresh history (e.g. after an operator restart): the current replicas count as recommended now,
    so no scale-down happens before a full window of evidence."""
    return (Recommendation(now, current),)
