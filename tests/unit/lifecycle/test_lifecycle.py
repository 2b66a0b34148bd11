"""The workers' lifecycle decisions (pure): what the broker says of each pod, what a pod's deletion cost is, which
pods are busy, silent, without heartbeats or stuck, and when replacing them would loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from celery_event_operator.core.lifecycle import consumers, costs
from celery_event_operator.core.lifecycle.consumers import Consumer, Holding, OnBroker
from celery_event_operator.core.lifecycle.stuck import (
    LOOP_SECONDS,
    PodFacts,
    StuckMemory,
    StuckWorker,
    evicted,
    healthy_message,
    judge,
    task_limit,
    unchecked_because,
)
from celery_event_operator.core.monitoring.running import RunningTask, RunningTasks
from celery_event_operator.core.naming import pod_connection_name
from celery_event_operator.core.service.pods import WorkerPod

HANDLERS = frozenset({"billing.order", "billing.refund"})
CONTROL = "billing:control"


@pytest.mark.parametrize(
    ("listed", "pods", "expected"),
    [
        pytest.param(
            [Consumer("billing.order", "10.0.0.1", None), Consumer("billing.order", "10.0.0.2", None)],
            [WorkerPod("a", "h", ip="10.0.0.1"), WorkerPod("b", "h", ip="10.0.0.2")],
            {"a": OnBroker(True), "b": OnBroker(True)},
            id="by-address",
        ),
        pytest.param(
            [Consumer("billing.order", "10.0.0.1", None), Consumer("other.queue", "10.0.0.2", None)],
            [WorkerPod("a", "h", ip="10.0.0.1"), WorkerPod("b", "h", ip="10.0.0.2")],
            {"a": OnBroker(True), "b": OnBroker(False)},
            id="another-queue-counts-for-nothing",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", pod_connection_name("shop", "a"))],
            [WorkerPod("a", "h", ip="127.0.0.1"), WorkerPod("b", "h", ip="127.0.0.1")],
            {"a": OnBroker(True), "b": OnBroker(False)},
            id="by-connection-name-on-a-shared-address",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", None)],
            [WorkerPod("a", "h", ip="127.0.0.1"), WorkerPod("b", "h", ip="127.0.0.1")],
            {"a": OnBroker(None), "b": OnBroker(None)},
            id="shared-address-unnamed-unknown",
        ),
        pytest.param(
            [Consumer("billing.order", "127.0.0.1", pod_connection_name("other-namespace", "a"))],
            [WorkerPod("a", "h")],
            {"a": OnBroker(False)},
            id="a-name-of-another-namespace",
        ),
        pytest.param([], [WorkerPod("a", "h")], {"a": OnBroker(False)}, id="no-consumers"),
        pytest.param(
            [
                Consumer("celery@a.billing:control.pidbox", "127.0.0.1", pod_connection_name("shop", "a")),
                Consumer("celery@laptop.billing:control.pidbox", "127.0.0.1", pod_connection_name("shop", "b")),
                Consumer("celery@c.other:control.pidbox", "127.0.0.1", pod_connection_name("shop", "c")),
            ],
            [WorkerPod("a", "h"), WorkerPod("b", "h"), WorkerPod("c", "h")],
            {
                "a": OnBroker(False, frozenset({"celery@a"})),
                "b": OnBroker(False, frozenset({"celery@laptop"})),
                "c": OnBroker(False),
            },
            id="hostnames-from-the-remote-control-queues-of-the-services-own-exchange",
        ),
    ],
)
def test_what_the_broker_says_of_each_pod(
    listed: list[Consumer], pods: list[WorkerPod], expected: dict[str, OnBroker]
) -> None:
    assert consumers.on_broker(consumers.ByConnection(listed), HANDLERS, pods, "shop", CONTROL) == expected


def test_the_deliveries_a_pod_holds_are_summed_over_its_channels() -> None:
    pods = [WorkerPod("a", "h", ip="10.0.0.1"), WorkerPod("b", "h", ip="10.0.0.2"), WorkerPod("c", "h", ip="10.0.0.2")]
    holdings = [
        Holding(1, "10.0.0.1", None),
        Holding(2, "10.0.0.1", pod_connection_name("shop", "a")),
        Holding(0, "10.0.0.2", pod_connection_name("shop", "b")),
        Holding(3, "10.0.0.2", None),  # unnamed, from the address b and c share
    ]
    assert consumers.unacknowledged(consumers.ByConnection(holdings), pods, "shop") == {"a": 3, "b": None, "c": None}


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


HOLD = costs.LOWER_AFTER_SECONDS


@pytest.mark.parametrize(
    ("wanted", "written", "hung", "since", "kept", "since_after"),
    [
        pytest.param(1, "0", False, None, 1, None, id="up-at-once"),
        pytest.param(2, "1", False, 100.0 - HOLD / 2, 2, None, id="up-at-once-its-lowering-forgotten"),
        pytest.param(0, "1", False, None, 1, 100.0, id="lower-now-kept-and-timed"),
        pytest.param(0, "1", False, 100.0 - HOLD / 2, 1, 100.0 - HOLD / 2, id="lower-a-while-still-kept"),
        pytest.param(0, "1", False, 100.0 - HOLD, 0, 100.0 - HOLD, id="lower-long-enough-lowered"),
        pytest.param(1, "3", False, 100.0 - HOLD, 1, 100.0 - HOLD, id="lowered-a-step-not-to-0"),
        pytest.param(0, "2", True, None, 0, None, id="a-hung-task-lowered-at-once"),
        pytest.param(0, None, False, None, 0, None, id="never-written-nothing-to-time"),
        pytest.param(0, "0", False, 50.0, 0, None, id="lowered-its-time-forgotten"),
        pytest.param(0, "x", False, None, 0, None, id="an-annotation-not-a-number-counts-0"),
    ],
)
def test_a_cost_falls_only_once_the_lower_one_has_held_a_while(
    wanted: int, written: str | None, hung: bool, since: float | None, kept: int, since_after: float | None
) -> None:
    result = costs.held(
        {"p": wanted}, {"p": written}, {"p"} if hung else set(), {} if since is None else {"p": since}, 100.0
    )
    assert result == ({"p": kept}, {} if since_after is None else {"p": since_after})


def test_running_tasks_are_tracked_per_worker_and_bounded_the_forgotten_still_counted_busy() -> None:
    running = RunningTasks(limit=3)
    running.started("t1", "a", 0.0)
    running.started("t2", "a", 5.0)
    running.started("t3", "b", 6.0)
    assert {worker: sorted(times) for worker, times in running.elapsed(10.0).items()} == {"a": [5.0, 10.0], "b": [4.0]}
    running.ended("t1")
    running.started("t4", "b", 7.0)
    running.started("t5", "b", 8.0)  # over the limit: the oldest start goes, counted as a task not seen starting
    assert running.workers() == {"a", "b"}
    assert running.unseen("a") == (1, 5.0, 5.0)
    assert [task.uuid for task in running.tasks("a")] == []
    running.ended("t-unknown", "a")  # a task of a not seen starting ended: it runs nothing more
    assert running.workers() == {"b"}
    running.forget("b")
    assert running.elapsed(10.0) == {}


def test_what_a_worker_runs_is_known_from_its_heartbeats_and_believed_from_its_deletion_cost() -> None:
    running = RunningTasks()
    running.started("t1", "a", 0.0)
    running.active("a", 3, 10.0)  # it says 3: two were not seen starting (an operator restart)
    assert running.unseen("a") == (2, 10.0, 10.0)
    running.active("a", 1, 12.0)
    assert running.unseen("a") is None
    assert [task.uuid for task in running.tasks("a")] == ["t1"]
    running.active("a", 0, 14.0)
    assert running.workers() == set()
    running.assume_busy("b", 3.0)  # its deletion cost, written before a restart
    assert running.elapsed(20.0) == {"b": [17.0]}
    running.active("b", 0, 21.0)
    assert running.workers() == set()
    running.holds("c", 1, since=30.0, now=36.0)  # a delivery held: a task begun after it was last heard (at 30)
    assert running.unseen("c") == (1, 30.0, 36.0), "about since 30 (its cost), surely since 36 (what is judged)"
    running.holds("c", 0, since=30.0, now=40.0)
    assert running.workers() == set()


THRESHOLD = 30.0
LIMIT = task_limit(90, None)


def pod(name: str, now: float, **facts: Any) -> PodFacts:
    """A pod heard (and heartbeating) now, consuming, running nothing, unless told otherwise."""
    defaults: dict[str, Any] = {
        "last_heard": now,
        "first_heard": 0.0,
        "last_heartbeat": now,
        "broker": OnBroker(True, frozenset({f"celery@{name}"})),
        "unacknowledged": 0,
    }
    return PodFacts(name, **(defaults | facts))


def judged(memory: StuckMemory, now: float, *pods: PodFacts, **given: Any) -> list[str]:
    """What is found stuck (or why nothing was judged)."""
    arguments: dict[str, Any] = {"waiting": 10, "heartbeats_known": True, "limit": LIMIT} | given
    found = judge(memory, pods, now=now, threshold=THRESHOLD, **arguments)
    if found.unchecked is not None:
        return [f"not judged: {found.unchecked}"]
    return [f"{worker.pod}: {worker.why}" + ("" if worker.replace else " (kept)") for worker in found.stuck]


def three(now: float, **b: Any) -> tuple[PodFacts, ...]:
    return pod("a", now), pod("b", now, **b), pod("c", now)


def test_a_worker_that_consumes_nothing_while_messages_wait_is_stuck_after_the_threshold() -> None:
    memory = StuckMemory()
    b_idle = {"broker": OnBroker(False)}
    assert judged(memory, 0.0, *three(0.0)) == []
    assert judged(memory, 10.0, *three(10.0, **b_idle)) == []
    assert judged(memory, 39.0, *three(39.0, **b_idle)) == []
    assert judged(memory, 41.0, *three(41.0, **b_idle)) == [
        "b: consumes from no handler queue for over 30 s while messages wait"
    ]
    assert judged(memory, 42.0, *three(42.0, **b_idle), waiting=0) == [], "nothing waits: not stuck"
    assert judged(memory, 43.0, *three(43.0, broker=OnBroker(None))) == [], "unknown is not stuck"
    assert judged(memory, 44.0, *three(44.0, broker=None)) == [], "consumers not listed"


def test_an_idle_worker_whose_heartbeats_stop_is_stuck_after_the_threshold() -> None:
    memory = StuckMemory()
    assert judged(memory, 0.0, *three(0.0)) == []
    assert judged(memory, 55.0, *three(55.0, last_heard=35.0)) == []
    found = judged(memory, 70.0, *three(70.0, last_heard=35.0))
    assert found == [
        "b: no heartbeat or event for over 30 s, and it runs no task (it sends heartbeats otherwise, and it holds no "
        "delivery on the broker)"
    ]
    assert judged(memory, 90.0, *three(90.0, last_heard=35.0)) == found, "stable: no rewrite per pass"
    assert judged(memory, 91.0, *three(91.0, last_heard=35.0, unacknowledged=None)) == [
        "b: no heartbeat or event for over 30 s, and it runs no task (it sends heartbeats otherwise); not replaced: "
        "the broker's channels cannot be listed to confirm it holds no task (kept)"
    ]
    assert judged(memory, 92.0, *three(92.0, last_heard=35.0, unacknowledged=1)) == [], (
        "it holds a delivery: a task that blocks its heartbeats (the solo pool's)"
    )


def test_silence_shorter_than_the_brokers_statistics_can_prove_is_not_judged() -> None:
    """The management API's figures lag: a pod that holds no delivery in them may have just begun a task."""
    memory = StuckMemory()
    judge(memory, [pod("a", 0.0)], waiting=1, heartbeats_known=True, now=0.0, threshold=5.0)
    quiet = [pod("a", 40.0, last_heard=34.0)]
    assert judge(memory, quiet, waiting=1, heartbeats_known=True, now=40.0, threshold=5.0).stuck == ()
    quiet = [pod("a", 45.0, last_heard=34.0)]
    [silent] = judge(memory, quiet, waiting=1, heartbeats_known=True, now=45.0, threshold=5.0).stuck
    assert silent.replace


@pytest.mark.parametrize(
    "busy",
    [
        pytest.param({"tasks": (RunningTask("t-1", 1.0, "orders.created"),)}, id="a-task-seen-starting"),
        pytest.param({"unseen_since": 1.0}, id="a-task-not-seen-starting"),
    ],
)
def test_a_busy_worker_is_never_silent_whatever_its_pool(busy: dict[str, Any]) -> None:
    """The solo pool sends no heartbeat while it runs a task; a pod's deletion cost may say it is busy."""
    memory = StuckMemory()
    assert judged(memory, 0.0, *three(0.0)) == []
    assert judged(memory, 80.0, *three(80.0, last_heard=2.0, **busy)) == []
    assert judged(memory, 85.0, *three(85.0, last_heard=2.0, broker=OnBroker(False), **busy), limit=None) == [], (
        "nor judged on its consumers"
    )


def test_a_task_past_its_limit_is_reported_with_its_name_age_and_limit_and_replaced_if_the_broker_confirms() -> None:
    memory = StuckMemory()
    running = {"tasks": (RunningTask("0123456789ab", 0.0, "orders.created"),), "last_heard": 0.0}
    assert judged(memory, 0.0, *three(0.0, **running)) == []
    assert judged(memory, 90.0, *three(90.0, **running, unacknowledged=1)) == []
    hung = "b: task orders.created (01234567) has run 95.0 s, past its limit of 90 s (workers.maxTaskRuntimeSeconds)"
    assert judged(memory, 95.0, *three(95.0, **running, unacknowledged=1)) == [hung]
    assert judged(memory, 99.0, *three(99.0, **running, unacknowledged=1)) == [hung], "the age when found: stable"
    assert judged(memory, 100.0, *three(100.0, **running, unacknowledged=0)) == [
        hung + "; not replaced: the broker shows no delivery held by the pod (the task may have ended unseen) (kept)"
    ]
    assert judged(memory, 101.0, *three(101.0, **running, unacknowledged=None)) == [
        hung + "; not replaced: the broker's channels cannot be listed to confirm it still holds the task's message "
        "(kept)"
    ]


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        pytest.param((None, None), None, id="none"),
        pytest.param((None, 60), (90.0, "celery.timeLimitSeconds 60 s + 30 s"), id="celery-time-limit-and-a-margin"),
        pytest.param((40, 60), (40.0, "workers.maxTaskRuntimeSeconds"), id="the-users-own"),
    ],
)
def test_the_limit_of_a_task(limit: tuple[int | None, int | None], expected: tuple[float, str] | None) -> None:
    found = task_limit(*limit)
    assert (found.seconds, found.source) == expected if found is not None else expected is None


def test_without_a_limit_a_long_task_is_never_judged_and_the_condition_says_so() -> None:
    memory = StuckMemory()
    running = {"tasks": (RunningTask("t-1", 0.0, "orders.created"),), "last_heard": 0.0}
    judge(memory, three(0.0, **running), waiting=1, heartbeats_known=True, now=0.0, threshold=THRESHOLD)
    found = judge(memory, three(3600.0, **running), waiting=1, heartbeats_known=True, now=3600.0, threshold=THRESHOLD)
    assert found.stuck == ()
    assert found.long_unlimited == ("b",)
    assert healthy_message(found, THRESHOLD) == (
        "3 running workers: 3 send heartbeats, 3 consume from the handler queues; b runs a task for over 30 s: not "
        "judged on how long tasks run, no limit is set (workers.maxTaskRuntimeSeconds or "
        "workers.celery.timeLimitSeconds)"
    )


def test_silence_is_counted_only_while_heartbeats_are_known_and_from_when_they_were_known_again() -> None:
    memory = StuckMemory()
    assert judged(memory, 0.0, *three(0.0)) == []
    assert judged(memory, 100.0, *three(100.0, last_heard=0.0), heartbeats_known=False) == [], "events not consumed"
    assert judged(memory, 110.0, *three(110.0, last_heard=0.0)) == [], "known again: a fresh window"
    assert judged(memory, 165.0, *three(165.0, last_heard=0.0)) == [], "workers reconnect with their own backoff"
    assert judged(memory, 171.0, *three(171.0, last_heard=0.0)) == [
        "b: no heartbeat or event for over 30 s, and it runs no task (it sends heartbeats otherwise, and it holds no "
        "delivery on the broker)"
    ]


def test_idle_workers_silent_all_at_once_are_not_judged_a_shared_cause_is_likelier() -> None:
    memory = StuckMemory()
    judged(memory, 0.0, *three(0.0))
    found = judged(memory, 70.0, pod("a", 70.0), pod("b", 70.0, last_heard=1.0), pod("c", 70.0, last_heard=1.0))
    assert found == [
        "not judged: 2 of 3 idle workers that send heartbeats stopped at once: a cause they share (their network to "
        "the broker, their node) is likelier than each one hanging; none is replaced (judged again once they "
        "heartbeat)"
    ]


def test_workers_without_heartbeats_are_never_judged_on_silence_only_on_consumers() -> None:
    """`--without-heartbeat`: heard only through task events, or seen only on the broker under its own hostname."""
    memory = StuckMemory()
    no_heartbeat = {"last_heartbeat": None}
    pods = [pod("a", 0.0, **no_heartbeat, last_heard=None), pod("b", 0.0, **no_heartbeat, last_heard=5.0)]
    assert judged(memory, 0.0, *pods) == []
    found = judge(memory, pods, waiting=0, heartbeats_known=True, now=500.0, threshold=THRESHOLD)
    assert (found.stuck, found.heartbeatless, found.heartbeating) == ((), ("a", "b"), 0)
    message = healthy_message(found, THRESHOLD)
    assert message.startswith(
        "2 running workers: 0 send heartbeats, 2 consume from the handler queues; silence is not judged for a, b: it "
        "sends no heartbeats (--without-heartbeat, or CELERY_WORKER_WITHOUT_HEARTBEAT)"
    )
    assert "broker" not in message
    idle_b = dataclasses.replace(pods[1], broker=OnBroker(False))
    judged(memory, 501.0, pods[0], idle_b)
    assert judged(memory, 540.0, pods[0], idle_b) == [
        "b: consumes from no handler queue for over 30 s while messages wait"
    ]


@pytest.mark.parametrize(
    ("broker", "unacknowledged", "expected"),
    [
        pytest.param(
            OnBroker(True, frozenset({"celery@laptop"})),
            0,
            "b: its worker answers as celery@laptop, not …@b: its events cannot be told from another pod's (keep "
            "Celery's default hostname, or -n celery@$(POD_NAME)); reported, not replaced (kept)",
            id="another-hostname",
        ),
        pytest.param(
            OnBroker(False),
            0,
            "b: never heard, and it holds no consumer on the broker: its worker is not running, or not connected to "
            "this broker; reported, not replaced (kept)",
            id="not-on-the-broker",
        ),
        pytest.param(
            None,
            None,
            "b: never heard since it runs: heartbeats off (--without-heartbeat) and no task run yet, or a Celery "
            "hostname other than …@<pod name> (its consumers cannot be listed to tell which); reported, not replaced "
            "(kept)",
            id="consumers-not-listed",
        ),
        pytest.param(OnBroker(True, frozenset({"celery@b"})), 0, None, id="its-own-hostname-heartbeats-off"),
        pytest.param(OnBroker(True, frozenset({"celery@b"})), 1, None, id="busy-with-a-task-not-seen-starting"),
    ],
)
def test_a_pod_never_heard_is_told_apart_by_what_the_broker_says_and_never_replaced(
    broker: OnBroker | None, unacknowledged: int | None, expected: str | None
) -> None:
    memory = StuckMemory()
    judged(memory, 0.0, *three(0.0))
    unheard = {"last_heard": None, "first_heard": None, "last_heartbeat": None}
    found = judged(memory, 70.0, *three(70.0, **unheard, broker=broker, unacknowledged=unacknowledged))
    assert found == ([expected] if expected is not None else [])


def test_a_new_pod_gets_the_threshold_from_when_it_was_first_seen_running() -> None:
    memory = StuckMemory()
    assert judged(memory, 0.0, pod("a", 0.0)) == []
    assert judged(memory, 50.0, pod("a", 50.0), pod("b", 50.0, last_heard=None, last_heartbeat=None)) == []


def test_a_replacement_stuck_for_the_same_reason_pauses_the_replacing_until_the_pods_change() -> None:
    memory = StuckMemory()
    hung_task = {"tasks": (RunningTask("t-1", 0.0, "orders.created"),), "unacknowledged": 1}
    judged(memory, 0.0, pod("a", 0.0, template="v1"))
    found = judge(memory, [pod("a", 100.0, template="v1", **hung_task)], waiting=1, heartbeats_known=True, now=100.0,
                  threshold=THRESHOLD, limit=LIMIT)  # fmt: skip
    [stuck] = found.stuck
    assert stuck.replace
    evicted(memory, stuck, 100.0)
    pending = judge(memory, [], waiting=1, heartbeats_known=True, now=105.0, threshold=THRESHOLD, limit=LIMIT)
    assert [(w.pod, w.replace) for w in pending.stuck] == [("a", False)], "said until its replacement runs"
    assert pending.stuck[0].why.endswith("; its replacement is not running yet")

    replacement = {"tasks": (RunningTask("t-1", 110.0, "orders.created"),), "unacknowledged": 1}
    judge(memory, [pod("b", 110.0, template="v1")], waiting=1, heartbeats_known=True, now=110.0, threshold=THRESHOLD)
    found = judge(memory, [pod("b", 205.0, template="v1", **replacement)], waiting=1, heartbeats_known=True,
                  now=205.0, threshold=THRESHOLD, limit=LIMIT)  # fmt: skip
    assert [(w.pod, w.replace) for w in found.stuck] == [("b", False)]
    assert found.paused is not None
    assert found.paused.startswith(
        "replacing paused: b started after a was evicted for the same reason less than 10 minutes ago, and is stuck "
        "too (task orders.created (t-1) has run 95.0 s"
    )
    again = judge(memory, [pod("b", 300.0, template="v1", **replacement)], waiting=1, heartbeats_known=True, now=300.0,
                  threshold=THRESHOLD, limit=LIMIT)  # fmt: skip
    assert again.paused == found.paused, "kept while the pods stay the same"
    pods = [pod("b", 310.0, template="v1", **replacement), pod("c", 310.0, template="v2")]
    lifted = judge(memory, pods, waiting=1, heartbeats_known=True, now=310.0, threshold=THRESHOLD, limit=LIMIT)
    assert lifted.paused is None, "a new pod template: the pods changed"
    assert [(w.pod, w.replace) for w in lifted.stuck] == [("b", True)]


def test_another_pod_stuck_for_the_same_reason_is_no_loop() -> None:
    """Only a pod that started after the eviction is its replacement: two pods hung at once are both replaced."""
    memory = StuckMemory()
    hung_task = {"tasks": (RunningTask("t-1", 0.0, "orders.created"),), "unacknowledged": 1}
    judged(memory, 0.0, pod("a", 0.0), pod("b", 0.0))
    found = judge(memory, [pod("a", 100.0, **hung_task), pod("b", 100.0, **hung_task)], waiting=1,
                  heartbeats_known=True, now=100.0, threshold=THRESHOLD, limit=LIMIT)  # fmt: skip
    evicted(memory, found.stuck[0], 100.0)
    found = judge(memory, [pod("b", 120.0, **hung_task)], waiting=1, heartbeats_known=True, now=120.0,
                  threshold=THRESHOLD, limit=LIMIT)  # fmt: skip
    assert found.paused is None
    assert [(w.pod, w.replace) for w in found.stuck if w.pod == "b"] == [("b", True)]
    assert LOOP_SECONDS == 600.0


def test_a_stuck_worker_is_stable() -> None:
    assert StuckWorker("a", "why") == StuckWorker("a", "why", "", replace=True)


@pytest.mark.parametrize(
    ("unlisted", "said"),
    [
        pytest.param(None, "no management API", id="no-reason-given"),
        pytest.param(
            "management API at http://rabbit:15672: its statistics are off on the broker",
            "management API at http://rabbit:15672: its statistics are off on the broker",
            id="statistics-off",
        ),
    ],
)
def test_what_the_broker_did_not_list_is_said_with_why(unlisted: str | None, said: str) -> None:
    unseen = [dataclasses.replace(found, broker=None, unacknowledged=None) for found in three(0.0)]
    found = judge(
        StuckMemory(), unseen, waiting=0, heartbeats_known=True, now=0.0, threshold=THRESHOLD, unlisted=unlisted
    )
    assert found.consuming is None
    assert f"3 send heartbeats, consumers not listed ({said}): not judged on them" in healthy_message(found, THRESHOLD)


ALARM_TEXT = (
    "the broker blocks publishers (a resource alarm, see BrokerReachable): no worker can heartbeat (judged again "
    "once the alarm clears)"
)
MONITORING_OFF = "monitoring is off: the workers' heartbeats are not consumed (judged once monitoring.enabled is true)"


@pytest.mark.parametrize(
    ("facts", "why"),
    [
        ({}, None),
        ({"monitored": False}, MONITORING_OFF),
        ({"queues_problem": "HTTP 503"}, "queue lengths unknown: HTTP 503 (judged once they are counted again)"),
        ({"settings_known": False}, "the workers' settings are not known yet (judged once they are written)"),
        (
            {"events_consumed": False},
            "the service's Celery events are not consumed (see MonitoringReady; judged once they are)",
        ),
        ({"alarmed": True}, ALARM_TEXT),
        ({"monitored": False, "alarmed": True}, MONITORING_OFF),
    ],
    ids=["judged", "monitoring-off", "queues-unknown", "settings-unknown", "not-consumed", "alarm", "first-wins"],
)
def test_why_the_workers_are_not_judged(facts: dict[str, Any], why: str | None) -> None:
    known: dict[str, Any] = {"monitored": True, "queues_problem": None, "settings_known": True}
    assert unchecked_because(**{**known, "events_consumed": True, "alarmed": False, **facts}) == why
