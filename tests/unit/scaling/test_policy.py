"""The scaling policy (pure), table-tested and played over time."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.api.models import Autoscaling
from celery_event_operator.core.scaling import policy


def autoscaling(**changes: Any) -> Autoscaling:
    base = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 10,
        "messagesPerReplica": 100,
        "scaleDownStabilizationSeconds": 60,
    }
    return Autoscaling.model_validate({**base, **changes})


@pytest.mark.parametrize(
    ("queue", "current", "changes", "expected"),
    [
        pytest.param(500, 1, {}, 5, id="burst"),
        pytest.param(501, 1, {}, 6, id="rounds-up"),
        pytest.param(50_000, 1, {}, 10, id="capped-at-max"),
        pytest.param(0, 3, {}, 1, id="floored-at-min"),
        pytest.param(0, 3, {"minReplicas": 0}, 0, id="idle-to-zero"),
        pytest.param(5, 0, {"minReplicas": 0, "activationQueueLength": 10}, 0, id="below-activation-stays-at-zero"),
        pytest.param(11, 0, {"minReplicas": 0, "activationQueueLength": 10}, 1, id="above-activation-wakes"),
        pytest.param(5, 2, {"minReplicas": 0, "activationQueueLength": 10}, 1, id="active-service-keeps-a-worker"),
        pytest.param(1, 0, {"minReplicas": 0}, 1, id="one-message-wakes-without-threshold"),
    ],
)
def test_recommend(queue: int, current: int, changes: dict[str, Any], expected: int) -> None:
    assert policy.recommend(queue, current, autoscaling(**changes)) == expected


def play(steps: list[tuple[float, int]], current: int, **changes: Any) -> list[int]:
    """Feed (time, queue length) and apply each decision; returns the replicas after each step."""
    rules = autoscaling(**changes)
    history = policy.seed(current, steps[0][0] - rules.scale_down_stabilization_seconds - 1)
    replicas = []
    for now, queue in steps:
        decision = policy.decide(queue, current, rules, history, now)
        current, history = decision.replicas, decision.history
        replicas.append(current)
    return replicas


def test_drained_queue_holds_through_the_window_then_scales_down() -> None:
    steps = [(0, 500), (15, 0), (30, 0), (59, 0), (61, 0), (76, 0)]
    assert play(steps, current=1) == [5, 5, 5, 5, 1, 1]


def test_flapping_queue_does_not_flap_the_workers() -> None:
    steps = [(t, 500 if t % 30 == 0 else 0) for t in range(0, 300, 15)]
    assert set(play(steps, current=1)) == {5}


def test_bursts_scale_up_at_once_and_down_to_the_window_maximum() -> None:
    steps = [(0, 300), (15, 800), (30, 200), (45, 100), (80, 100)]
    assert play(steps, current=1) == [3, 8, 8, 8, 2]


def test_scale_up_limit_per_interval() -> None:
    steps = [(0, 1000), (15, 1000), (30, 1000)]
    assert play(steps, current=1, scaleUpLimitPerInterval=3) == [4, 7, 10]


def test_scale_to_zero_and_back() -> None:
    steps = [(0, 0), (61, 0), (62, 3), (63, 12), (64, 0), (130, 0)]
    assert play(steps, current=1, minReplicas=0, activationQueueLength=5) == [0, 0, 0, 1, 1, 0]


def test_fresh_history_does_not_scale_down_before_a_window_of_evidence() -> None:
    rules = autoscaling()
    history = policy.seed(6, now=1000)
    decision = policy.decide(0, 6, rules, history, now=1010)
    assert (decision.replicas, decision.recommended) == (6, 1)
    assert "stabilization window" in decision.reason
