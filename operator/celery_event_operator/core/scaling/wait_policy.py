"""How many workers keep a task's wait within a target (pure).

A task published now waits for the backlog ahead of it to start (backlog * runtime / slots: every slot that frees
takes the next one), then, as any task of a steady stream, for a slot: M/M/c's queueing delay, whose 95th percentile
follows from Erlang C — P(wait > t) = C(c, a) * exp(-(c / runtime - arrivals) * t), a = arrivals * runtime. The fewest
pods whose estimate is within the target is recommended; the workers go up to it at once, and down only to a count
that would meet it with DOWN_HEADROOM times the arrivals (a count that barely meets it now misses it at the next
jitter of the arrivals — near a full pool the wait grows steeply —, and it would go up again) and only as far as the
stabilization window allows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from celery_event_operator.core.api.models import Autoscaling, AutoscalingStatus
from celery_event_operator.core.scaling.load import Load
from celery_event_operator.core.scaling.policy import Decision, Recommendation

PERCENTILE = 0.95
# Poisson arrivals counted over 15 s at 4/s vary by ±13 % (one sigma): a count kept must hold two sigmas more.
DOWN_HEADROOM = 1.25
# Erlang B's recursion is O(servers): the pods * slots it walks are capped (more than this is past any target).
MAX_SERVERS = 100_000


# A runtime below this is taken as this (a task of 0 s, as rounded, would make a slot's rate infinite).
MIN_RUNTIME = 0.001


@dataclasses.dataclass(frozen=True)
class WaitObservations:
    load: Load | None  # None: not measured yet
    runtime: float | None  # the mean runtime (the last one known when none ended lately); None: never seen
    slots: int  # tasks one pod runs at once
    queue_length: int  # ready + held, for activation
    running: int = 0  # tasks running now
    events_consumed: bool = True  # False: no arrivals are seen, only the backlog


@dataclasses.dataclass(frozen=True)
class WaitEstimate:
    """What status.autoscaling and the Scaled Event say of a decision."""

    wait: float | None  # the estimated p95 wait at the replicas decided (inf: the load exceeds them); None: unknown
    arrivals: float | None
    runtime: float | None
    slots: int
    backlog: int | None
    basis: str = "estimated"  # or what it could not be estimated for: status shows a change of it at once


def waits(load: Load, runtime: float, slots: int, counts: range) -> Iterator[tuple[int, float]]:
    """(pods, the p95 wait a task published now has with that many pods) for each count, ascending, in one pass of
    Erlang B's recursion."""
    arrivals = load.arrivals
    offered = arrivals * runtime
    blocking, servers = 1.0, 0  # Erlang B with 0 servers
    for pods in counts:
        wanted = min(pods * slots, MAX_SERVERS)
        while servers < wanted:
            servers += 1
            blocking = offered * blocking / (servers + offered * blocking)
        if servers == 0 or offered >= servers:
            yield pods, math.inf if (load.backlog or arrivals) else 0.0
            continue
        drain = load.backlog * runtime / servers
        waiting_share = servers * blocking / (servers - offered * (1 - blocking))  # Erlang C
        if waiting_share <= 1 - PERCENTILE:
            yield pods, drain
        else:
            yield pods, drain + math.log(waiting_share / (1 - PERCENTILE)) / (servers / runtime - arrivals)


def _fewest(load: Load, runtime: float, slots: int, *, lowest: int, highest: int, within: float) -> tuple[int, float]:
    """The fewest pods from `lowest` whose wait is within `within`, with that wait; else `highest` and its wait."""
    found = (highest, math.inf)
    for pods, wait in waits(load, runtime, slots, range(lowest, highest + 1)):
        found = (pods, wait)
        if wait <= within:
            break
    return found


def decide(
    observed: WaitObservations,
    current: int,
    policy: Autoscaling,
    history: tuple[Recommendation, ...],
    now: float,
) -> tuple[Decision, WaitEstimate]:
    assert policy.target_wait_seconds is not None
    target = float(policy.target_wait_seconds)
    load, slots = observed.load, observed.slots
    runtime = None if observed.runtime is None else max(MIN_RUNTIME, observed.runtime)
    lowest, highest = policy.min_replicas, policy.max_replicas
    unknown = WaitEstimate(None, None if load is None else load.arrivals, runtime, slots, observed.queue_length)
    if current == 0 and observed.queue_length <= policy.activation_queue_length:
        wanted, hold, estimate = max(0, lowest), max(0, lowest), dataclasses.replace(unknown, basis="inactive")
        reason = f"queue length {observed.queue_length}: inactive at or below {policy.activation_queue_length}"
    elif not observed.events_consumed:
        wanted = hold = _for_the_backlog(observed, current, policy, runtime)
        estimate = WaitEstimate(None, None, runtime, slots, observed.queue_length, basis="no events")
        reason = (
            f"the service's events are not consumed (no arrivals seen): sized for the {observed.queue_length} waiting"
            " alone, never down"
        )
    elif load is not None and observed.queue_length == 0 and load.arrivals == 0 and observed.running == 0:
        wanted = hold = lowest
        estimate = WaitEstimate(0.0, 0.0, runtime, slots, 0, basis="idle")
        reason = "no tasks arrived in the last minute, none wait and none run"
    elif load is None or runtime is None:
        wanted = hold = min(max(current, 1, lowest), highest)
        estimate = dataclasses.replace(unknown, basis="no runtime")
        reason = "waiting for the first tasks to end: their runtime is not known yet"
    else:
        start = max(1, lowest)
        wanted, wait = _fewest(load, runtime, slots, lowest=start, highest=highest, within=target)
        more = dataclasses.replace(load, arrivals=load.arrivals * DOWN_HEADROOM)
        hold, _ = _fewest(more, runtime, slots, lowest=wanted, highest=highest, within=target)
        estimate = WaitEstimate(wait, load.arrivals, runtime, slots, load.backlog)
        seen = f"{_figure(load.arrivals)} tasks/s of {_figure(runtime)}s, {load.backlog} waiting, {slots} slots a pod"
        if math.isinf(wait):
            reason = f"{seen}: even with {_pods(wanted)} (maxReplicas) more arrive than they run"
        else:
            limited = " (maxReplicas)" if wait > target else ""
            reason = f"{seen}: with {_pods(wanted)}{limited} a task waits {_seconds(wait)} (p95; target {target:g}s)"
        if current != wanted:
            reason += f"; with {current}: {_seconds(_wait_with(load, runtime, slots, current))}"
    window_start = now - policy.scale_down_stabilization_seconds
    history = (*(r for r in history if r.at >= window_start), Recommendation(now, hold))
    if wanted > current:
        step = policy.scale_up_limit_per_interval
        replicas = min(wanted, current + step) if step else wanted
        if replicas < wanted:
            reason += f"; at most {step} more per interval"
    elif hold < current:
        replicas = min(current, max(r.replicas for r in history))
        if replicas > hold:
            reason += f"; held at {replicas} for the {policy.scale_down_stabilization_seconds}s stabilization window"
    else:
        replicas = current
    if replicas != wanted and estimate.wait is not None and load is not None and runtime is not None:
        estimate = dataclasses.replace(estimate, wait=_wait_with(load, runtime, slots, replicas))
    return Decision(replicas, wanted, history, reason), estimate


def _for_the_backlog(observed: WaitObservations, current: int, policy: Autoscaling, runtime: float | None) -> int:
    """Without arrivals (no events): the pods that start what waits within the target, never fewer than now."""
    wanted = max(current, policy.min_replicas)
    if runtime is not None and observed.queue_length:
        backlog = Load(0.0, runtime, observed.queue_length)
        assert policy.target_wait_seconds is not None
        drained, _ = _fewest(
            backlog, runtime, observed.slots, lowest=1, highest=policy.max_replicas, within=policy.target_wait_seconds
        )
        wanted = max(wanted, drained)
    return min(wanted, policy.max_replicas)


def _wait_with(load: Load, runtime: float, slots: int, pods: int) -> float:
    return next(waits(load, runtime, slots, range(pods, pods + 1)))[1]


def _pods(count: int) -> str:
    return f"{count} pod" if count == 1 else f"{count} pods"


def _figure(value: float) -> str:
    """Two significant figures, as a person reads a rate or a runtime."""
    return f"{value:.2g}" if value < 100 else f"{value:.0f}"


def _seconds(wait: float) -> str:
    return "unbounded" if math.isinf(wait) else f"{_figure(wait)}s"


def shown(
    estimate: WaitEstimate, measured: tuple[float, int] | None, target: int, reason: str, at: str
) -> AutoscalingStatus:
    """status.autoscaling: every field always there (a merge patch leaves no stale one behind)."""
    runtime = estimate.runtime
    if measured is None:
        measured_text = "none measured in the last minute"
    else:
        bound, count = measured
        within = "past the last bucket" if math.isinf(bound) else f"within {_figure(bound)}s"
        measured_text = f"{within} (p95 of {count} in the last minute)"
    return AutoscalingStatus(
        target_wait_seconds=target,
        estimated_wait="unknown" if estimate.wait is None else _seconds(estimate.wait),
        measured_wait=measured_text,
        arrivals="unknown" if estimate.arrivals is None else f"{_figure(estimate.arrivals)}/s",
        runtime="unknown" if runtime is None else f"{_figure(runtime)}s",
        slots_per_pod=estimate.slots,
        capacity_per_pod="unknown" if not runtime else f"{_figure(estimate.slots / runtime)} tasks/s",
        backlog=max(0, estimate.backlog or 0),
        reason=reason[:1000],
        decided_at=at,
    )
