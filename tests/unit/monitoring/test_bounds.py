"""Bounds on label values and on the memory of tasks in flight, and the report of what overflowed (pure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from celery_event_operator.core.monitoring import bounds, report, state
from celery_event_operator.core.monitoring.bounds import OVERFLOW, DistinctCount, SeriesSettings, TaskBudget
from celery_event_operator.core.monitoring.state import SERVICE_WIDE, ServiceMetrics
from tests.unit.monitoring.test_state import event

W = SERVICE_WIDE


def received(metrics: ServiceMetrics) -> dict[str, int]:
    """name → task-received count."""
    found: dict[str, int] = {}
    for (kind, name, _, _, _), count in metrics.counters.items():
        if kind == "received":
            found[name] = found.get(name, 0) + count
    return found


def test_generated_task_names_are_bounded_counted_reported_once_and_cost_another_service_nothing() -> None:
    budget = TaskBudget()
    flooded = ServiceMetrics("shop", "billing", settings=SeriesSettings(max_task_names=100), budget=budget)
    flooded.handler_queues = {"orders.created": "billing.orders.created"}
    other = ServiceMetrics("shop", "shipping", budget=budget)
    for number in range(5_000):
        flooded.ingest(event("task-received", uuid=f"u{number}", name=f"generated.{number}"), 1.0)
        if number % 100 == 0:
            other.ingest(event("task-received", uuid=f"s{number}", name="ship"), 1.0)
    flooded.ingest(event("task-received", uuid="h", name="orders.created"), 1.0)  # a handler's: always kept

    counted = received(flooded)
    assert len(counted) == 100 + 2, "100 generated names, the handler's, and the overflow"
    assert counted[OVERFLOW] == 4_900
    assert counted["orders.created"] == 1
    assert sum(counted.values()) == 5_001, "totals stay exact"
    assert flooded.overflows["name"].events == 4_900
    refused, kept = flooded.overflowing()["name"]
    assert kept == 100
    assert 4_900 * 0.95 < refused < 4_900 * 1.05
    assert received(other) == {"ship": 50}
    assert not other.overflows

    reported, message = report.overflow_note(frozenset(), flooded.overflowing())
    assert message is not None
    assert "100 kept" in message
    assert "__overflow__" in message
    assert report.overflow_note(reported, flooded.overflowing()) == (reported, None), "reported once"


def test_exception_classes_queues_and_hostnames_are_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "MAX_WORKERS_OUTSIDE_PODS", 3)  # no pods known: pod-a is one of them
    metrics = ServiceMetrics("shop", "billing", settings=SeriesSettings(per_pod=True))
    for number in range(bounds.MAX_EXCEPTIONS_PER_TASK + 5):
        metrics.ingest(event("task-failed", uuid=f"f{number}", name="n", exception=f"Error{number}('x')"), 1.0)
    for number in range(bounds.MAX_QUEUES + 5):
        metrics.ingest(event("task-sent", "web", uuid=f"q{number}", name="n", queue=f"queue-{number}"), 1.0)
    for number in range(4):
        metrics.ingest(event("worker-heartbeat", f"laptop-{number}"), 1.0)
    exceptions = {key[4] for key in metrics.counters if key[0] == "failed"} - {""}
    assert len(exceptions) == bounds.MAX_EXCEPTIONS_PER_TASK + 1
    assert metrics.counters[("failed", "n", "pod-a", "celery", OVERFLOW)] == 5
    queues = {key[3] for key in metrics.counters if key[0] == "sent"}
    assert len(queues) == bounds.MAX_QUEUES + 1
    assert metrics.counters[("sent", "n", state.GENERIC_WORKER, OVERFLOW, "")] == 5
    assert set(metrics.worker_up) == {"laptop-0", "laptop-1"}
    assert set(metrics.last_heard) == {"pod-a", "laptop-0", "laptop-1"}
    assert {label: o.events for label, o in metrics.overflows.items()} == {
        "exception": 5,
        "queue_name": 5,
        "hostname": 2,
    }
    _, note = report.overflow_note(frozenset(), metrics.overflowing())
    assert note is not None
    assert [part.split(" seen")[0] for part in note.split("; ")] == [
        "Metrics of this service: about 25 exception classes",
        "about 55 queue names of tasks without a handler",
        "about 5 worker hostnames",
    ]


def test_live_pods_are_always_kept_and_read_again_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "MAX_WORKERS_OUTSIDE_PODS", 1)
    pods = ["pod-a"]
    reads: list[float] = []
    metrics = ServiceMetrics("shop", "billing")

    def live() -> list[str]:
        reads.append(1.0)
        return list(pods)

    metrics.live_pods = live
    metrics.ingest(event("worker-heartbeat", "pod-b"), 10.0)  # not indexed yet: taken for an outsider
    pods.append("pod-b")
    pods.append("pod-c")
    metrics.ingest(event("worker-heartbeat", "pod-c"), 10.5)  # the pods were read half a second ago: refused
    assert set(metrics.worker_up) == {"pod-b"}
    for number in range(50):
        metrics.ingest(event("worker-heartbeat", f"forged-{number}"), 10.6)
    assert len(reads) == 1, "a flood of forged hostnames reads the pods at most once a second"
    metrics.ingest(event("worker-heartbeat", "pod-c"), 11.5)
    metrics.ingest(event("worker-heartbeat", "laptop"), 11.6)  # pod-b is a pod after all: its outsider place is free
    assert set(metrics.worker_up) == {"pod-b", "pod-c", "laptop"}
    assert len(reads) == 2


def test_new_settings_start_the_task_series_afresh_and_the_same_change_nothing() -> None:
    metrics = ServiceMetrics("shop", "billing")
    metrics.ingest(event("task-received", uuid="a", name="n"), 1.0)
    version = metrics.version
    metrics.configure(SeriesSettings())
    assert metrics.version == version
    metrics.configure(SeriesSettings(per_pod=True))
    assert metrics.counters == {}
    assert metrics.version != version
    metrics.ingest(event("task-started", uuid="a"), 1.0)
    assert metrics.counters[("started", "n", "pod-a", "celery", "")] == 1, "the tasks in flight are remembered"


def test_a_pods_deletion_keeps_the_service_wide_series_and_they_still_count_its_late_tasks() -> None:
    metrics = ServiceMetrics("shop", "billing")
    metrics.ingest(event("worker-heartbeat"), 1.0)
    metrics.ingest(event("task-received", uuid="a", name="n"), 1.0)
    metrics.forget_worker("pod-a", 2.0)
    metrics.ingest(event("task-succeeded", uuid="a", runtime=0.5), 3.0)  # it finished while terminating
    metrics.ingest(event("worker-heartbeat"), 3.0)
    assert metrics.counters[("received", "n", W, "celery", "")] == 1
    assert metrics.counters[("succeeded", "n", W, "celery", "")] == 1
    assert metrics.worker_up == {}, "the deleted pod's own series stay gone"
    assert "pod-a" not in metrics.last_heard


@pytest.mark.parametrize("count", [0, 1, 10, 300, 5_000, 100_000])
def test_distinct_counts_are_estimated_closely(count: int) -> None:
    distinct = DistinctCount()
    for number in range(count):
        distinct.add(f"value-{number}")
        distinct.add(f"value-{number}")  # twice: counted once
    assert abs(distinct.estimate() - count) <= max(1, 0.05 * count)


def test_small_distinct_counts_are_exact_whatever_the_hash_seed() -> None:
    """Up to EXACT_UP_TO they are counted exactly: with registers alone, two of five values sharing one (a process in
    a hundred, by its hash seed) read as four. Each seed in its own process: the hash is fixed at start-up."""
    script = (
        "from celery_event_operator.core.monitoring.bounds import DistinctCount\n"
        "counts = []\n"
        "for size in (2, 5, 55, 64):\n"
        "    distinct = DistinctCount()\n"
        "    for number in range(size):\n"
        "        distinct.add(f'queue-{number}')\n"
        "    counts.append(distinct.estimate())\n"
        "print(counts)\n"
    )
    for seed in (49, 359):  # seeds under which the registers alone miscounted 5 or 55 of these
        run = subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        )
        assert run.stdout.strip() == "[2, 5, 55, 64]", f"PYTHONHASHSEED={seed}"


def test_task_memory_is_shared_fairly_between_services() -> None:
    budget = TaskBudget(limit=1_000)
    flooded = ServiceMetrics("shop", "flooded", budget=budget)
    quiet = ServiceMetrics("shop", "quiet", budget=budget)
    for number in range(300):
        quiet.ingest(event("task-sent", "web", uuid=f"q{number}", name="n", timestamp=1.0), 1.0)
    for number in range(20_000):  # never finished: a producer of uuids
        flooded.ingest(event("task-sent", "web", uuid=f"f{number}", name="n", timestamp=1.0), 1.0)
    assert budget.total == flooded.tasks_remembered() + quiet.tasks_remembered() <= 1_000
    assert quiet.tasks_remembered() == 300, "the flood is paid for by the service that floods"
    assert flooded.tasks_forgotten > 19_000
    assert quiet.tasks_forgotten == 0
    for number in range(300):
        quiet.ingest(event("task-started", uuid=f"q{number}", timestamp=2.0), 2.0)
    assert quiet.queue_wait.counts[("n", W, "celery")][bounds_index(quiet, 1.0)] == 300, "every wait measured"
    flooded.close()
    assert budget.total == quiet.tasks_remembered()


def bounds_index(metrics: ServiceMetrics, seconds: float) -> int:
    return metrics.queue_wait.bounds.index(seconds)


def test_a_finished_task_gives_its_memory_back() -> None:
    budget = TaskBudget(limit=10)
    metrics = ServiceMetrics("shop", "billing", budget=budget)
    for number in range(100):
        for kind in ("task-sent", "task-received", "task-started", "task-succeeded"):
            metrics.ingest_message(json.dumps(event(kind, uuid=f"t{number}", name="n", runtime=0.1)).encode(), 1.0)
    assert (budget.total, metrics.tasks_remembered(), metrics.tasks_forgotten) == (0, 0, 0)
