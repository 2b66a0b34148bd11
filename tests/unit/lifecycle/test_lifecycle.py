"""The workers' lifecycle decisions (pure): which pod holds which consumer, what a pod's deletion cost is, which
pods are stuck."""

from __future__ import annotations

import pytest

from celery_event_operator.core.lifecycle import consumers, costs
from celery_event_operator.core.lifecycle.consumers import Consumer
from celery_event_operator.core.lifecycle.stuck import StuckMemory, judge
from celery_event_operator.core.monitoring.running import RunningTasks
from celery_event_operator.core.naming import pod_connection_name
from celery_event_operator.core.service.pods import WorkerPod

HANDLERS = frozenset({"billing.order", "billing.refund"})


@pytest.mark.parametrize(
    ("listed", "pods", "expected"),
    [
        pytest.param(
            [Consumer("billing.order", "10.0.0.1", None), Consumer("billing.order", "10.0.0.2", None)],
            [WorkerPod("a", "h", ip="10.0.0.1"), WorkerPod("b", "h", ip="10.0.0.2")],
            {"a": True, "b": True},
            id="by-address",
        ),
        pytest.param(
            [Consumer("billing.order", "10.0.0.1", None), Consumer("other.queue", "10.0.0.2", None)],
            [WorkerPod("a", "h", ip="10.0.0.1"), WorkerPod("b", "h", ip="10.0.0.2")],
            {"a": True, "b": False},
            id="another-queue-counts-for-nothing",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", pod_connection_name("shop", "a"))],
            [WorkerPod("a", "h", ip="127.0.0.1"), WorkerPod("b", "h", ip="127.0.0.1")],
            {"a": True, "b": False},
            id="by-connection-name-on-a-shared-address",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", None)],
            [WorkerPod("a", "h", ip="127.0.0.1"), WorkerPod("b", "h", ip="127.0.0.1")],
            {"a": None, "b": None},
            id="shared-address-unnamed-unknown",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", pod_connection_name("other-namespace", "a"))],
            [WorkerPod("a", "h")],
            {"a": False},
            id="a-name-of-another-namespace",
        ),
        pytest.param([], [WorkerPod("a", "h")], {"a": False}, id="no-consumers"),
    ],
)
def test_consumers_are_mapped_to_pods(
    listed: list[Consumer], pods: list[WorkerPod], expected: dict[str, bool | None]
) -> None:
    assert consumers.consuming(listed, HANDLERS, pods, "shop") == expected


@pytest.mark.parametrize(
    ("running", "cost"),
    [
        pytest.param([], 0, id="idle"),
        pytest.param([3.0, 9.9], 0, id="short-tasks-finish-in-the-soft-shutdown"),
        pytest.param([10.0], 1, id="ten-seconds"),
        pytest.param([1.0, 400.0], 3, id="longest-counts"),
        pytest.param([3 * 3600.0], 5, id="hours"),
    ],
)
def test_deletion_cost_steps(running: list[float], cost: int) -> None:
    assert costs.deletion_cost(running) == cost


def test_only_changed_costs_are_written_costliest_first_and_bounded() -> None:
    wanted = {"a": 0, "b": 3, "c": 1, "d": 0, "e": 2}
    current: dict[str, str | None] = {"a": None, "b": "3", "c": "0", "d": "2", "e": None}
    assert costs.costs_to_write(wanted, current, limit=2) == {"e": 2, "c": 1}
    assert costs.costs_to_write(wanted, current, limit=10) == {"e": 2, "c": 1, "d": 0}
    assert costs.costs_to_write({"a": 0}, {"a": None}, limit=10) == {}, "an idle pod without annotation: no write"


def test_running_tasks_are_tracked_per_worker_and_bounded() -> None:
    running = RunningTasks(limit=3)
    running.started("t1", "a", 0.0)
    running.started("t2", "a", 5.0)
    running.started("t3", "b", 6.0)
    assert {worker: sorted(times) for worker, times in running.elapsed(10.0).items()} == {"a": [5.0, 10.0], "b": [4.0]}
    running.ended("t1")
    running.started("t4", "b", 7.0)
    running.started("t5", "b", 8.0)  # over the limit: the oldest start goes
    assert sorted(running.elapsed(10.0)) == ["b"]
    running.forget("b")
    assert running.elapsed(10.0) == {}


THRESHOLD = 30.0
PODS = ["a", "b", "c"]


def judged(memory: StuckMemory, now: float, **facts: object) -> list[str]:
    """Three pods, heard and consuming unless told otherwise; what is found stuck (or why nothing was judged)."""
    arguments: dict[str, object] = {
        "last_heard": dict.fromkeys(PODS, now),
        "consuming": dict.fromkeys(PODS, True),
        "waiting": 10,
        "heartbeats_known": True,
    } | facts
    found = judge(memory, PODS, now=now, threshold=THRESHOLD, **arguments)  # type: ignore[arg-type]
    if found.unchecked is not None:
        return [f"not judged: {found.unchecked}"]
    return [f"{worker.pod}: {worker.why}" + ("" if worker.replace else " (kept)") for worker in found.stuck]


def test_a_worker_that_heartbeats_but_consumes_nothing_while_messages_wait_is_stuck_after_the_threshold() -> None:
    memory = StuckMemory()
    b_idle = {"a": True, "b": False, "c": True}
    assert judged(memory, 0.0) == []
    assert judged(memory, 10.0, consuming=b_idle) == []
    assert judged(memory, 39.0, consuming=b_idle) == []
    assert judged(memory, 41.0, consuming=b_idle) == [
        "b: heartbeats but consumes from no handler queue for over 30 s while messages wait"
    ]
    assert judged(memory, 42.0, consuming=b_idle, waiting=0) == [], "nothing waits: not stuck"
    assert judged(memory, 43.0, consuming={"a": True, "b": None, "c": True}) == [], "unknown is not stuck"
    assert judged(memory, 44.0, consuming=None) == [], "consumers not listed"


def test_a_worker_whose_heartbeats_stop_while_running_is_stuck_after_the_threshold() -> None:
    memory = StuckMemory()
    assert judged(memory, 0.0) == []
    assert judged(memory, 55.0, last_heard={"a": 55.0, "b": 35.0, "c": 55.0}) == []
    found = judged(memory, 70.0, last_heard={"a": 70.0, "b": 35.0, "c": 70.0})
    assert found == ["b: no heartbeat for over 30 s while Running"]
    assert judged(memory, 90.0, last_heard={"a": 90.0, "b": 35.0, "c": 90.0}) == found, "stable: no rewrite per pass"


def test_silence_is_counted_only_while_heartbeats_are_known_and_from_when_they_were_known_again() -> None:
    memory = StuckMemory()
    assert judged(memory, 0.0, last_heard={}) == []
    assert judged(memory, 100.0, last_heard={}, heartbeats_known=False) == [], "the events consumer is down"
    assert judged(memory, 110.0, last_heard={"a": 110.0, "b": 0.0, "c": 110.0}) == [], "known again: a fresh window"
    heard = {"a": 165.0, "b": 0.0, "c": 165.0}
    assert judged(memory, 165.0, last_heard=heard) == [], "workers reconnect with their own backoff"
    assert judged(memory, 171.0, last_heard=heard) == ["b: no heartbeat for over 30 s while Running"]


def test_workers_silent_all_at_once_are_not_judged_the_broker_or_the_network_is_likelier() -> None:
    memory = StuckMemory()
    judged(memory, 0.0)
    found = judged(memory, 70.0, last_heard={"a": 70.0, "b": 1.0, "c": 1.0})
    assert found == [
        "not judged: 2 of 3 workers stopped heartbeating at once: more likely the broker or the network than the "
        "workers; none is replaced"
    ]


def test_a_pod_never_heard_is_reported_but_not_replaced() -> None:
    memory = StuckMemory()
    judged(memory, 0.0)
    assert judged(memory, 70.0, last_heard={"a": 70.0, "c": 70.0}) == [
        "b: never heard since it runs (is its Celery hostname …@<pod name>?); reported, not replaced (kept)"
    ]


def test_a_new_pod_gets_the_threshold_from_when_it_was_first_seen_running() -> None:
    memory = StuckMemory()
    judge(memory, ["a"], last_heard={"a": 0.0}, consuming=None, waiting=0, heartbeats_known=True, now=0.0, threshold=30)
    found = judge(
        memory,
        ["a", "b"],
        last_heard={"a": 50.0},
        consuming=None,
        waiting=0,
        heartbeats_known=True,
        now=50.0,
        threshold=30,
    )
    assert found.stuck == ()
