"""The replicas a service's workers should have now, by whichever rule its spec names (pure)."""

from __future__ import annotations

import dataclasses

from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.scaling import policy, wait_policy
from celery_event_operator.core.scaling.policy import Recommendation
from celery_event_operator.core.scaling.wait_policy import WaitEstimate, WaitObservations


@dataclasses.dataclass(frozen=True)
class Wish:
    """The replicas a service's workers should have now, and why."""

    replicas: int  # what the target should have now
    recommended: int  # status.desiredReplicas
    why: str
    history: tuple[Recommendation, ...] | None  # the autoscaler's, to keep for the next decision
    estimate: WaitEstimate | None = None  # a wait target's figures (status.autoscaling)


def wish(
    spec: CeleryEventServiceSpec,
    queue_length: int,
    current: int,
    history: tuple[Recommendation, ...] | None,
    now: float,
    *,
    counted: str,
    observed: WaitObservations | None = None,
) -> Wish | None:
    """The autoscaler's decision (by the wait target when the spec sets one and `observed` is given, else by the
    queue length), else spec.workers.replicas; None when nothing is to be scaled."""
    autoscaling = spec.autoscaling
    if autoscaling.enabled and autoscaling.target_wait_seconds is not None:
        if observed is None:
            return None  # nothing to judge the wait by (no metrics of the service yet): nothing changes
        decision, estimate = wait_policy.decide(
            observed, current, autoscaling, history or policy.seed(current, now), now
        )
        return Wish(decision.replicas, decision.recommended, decision.reason, decision.history, estimate)
    if autoscaling.enabled:
        decision = policy.decide(queue_length, current, autoscaling, history or policy.seed(current, now), now)
        return Wish(decision.replicas, decision.recommended, f"{decision.reason}; counted {counted}", decision.history)
    if spec.workers is not None and spec.workers.replicas is not None:
        replicas = spec.workers.replicas
        return Wish(replicas, replicas, f"spec.workers.replicas is {replicas}", history)
    return None
