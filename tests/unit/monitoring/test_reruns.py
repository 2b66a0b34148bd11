"""Tasks run twice, counted per task name and cause from the workers' events (pure), and exported."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.adapters.monitoring.collector import MetricsRegistry
from celery_event_operator.core.monitoring import reruns
from tests.unit.monitoring.test_state import samples, value

TASK = "orders.order.created"


def event(kind: str, worker: str, uuid: str = "t-1", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "hostname": f"celery@{worker}", "uuid": uuid, "timestamp": 1.0, **fields}


def run(registry: MetricsRegistry, *steps: tuple[float, str, str] | tuple[float, str, str, dict[str, Any]]) -> None:
    """(now, kind, worker[, fields]) events of the task t-1 of the service shop/billing."""
    metrics = registry.service("shop", "billing")
    metrics.live_pods = lambda: ["pod-a", "pod-b"]
    metrics.ack_timeout_seconds = 1800.0
    for step in steps:
        now, kind, worker, *more = step
        fields = more[0] if more else {}
        if kind == "deleted":
            metrics.forget_worker(worker, now)
        elif kind.startswith("worker-"):
            metrics.ingest({"type": kind, "hostname": f"celery@{worker}", "active": 1, **fields}, now)
        else:
            metrics.ingest(
                event(f"task-{kind}", worker, **({"name": TASK} if kind == "received" else {}), **fields), now
            )


@pytest.mark.parametrize(
    ("steps", "cause", "first_run"),
    [
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (1801.0, "started", "pod-b")],
            "ack_timeout",
            1801.0,
            id="delivered-again-after-the-acknowledgement-timeout-while-it-ran",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (60.0, "started", "pod-b")],
            "worker_lost",
            60.0,
            id="delivered-again-early-while-it-ran-a-lost-connection",
        ),
        # worker-offline comes when the warm shutdown begins: the run goes on until its process ends, which the task's
        # delivery again (once the process's connection closed) or its pod's deletion shows.
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (30.0, "worker-offline", "pod-a"),
             (31.0, "started", "pod-b")],
            "pod_stopped",
            31.0,
            id="its-worker-shut-down-before-it-ended",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (3.0, "worker-offline", "pod-a"),
             (41.0, "deleted", "pod-a"), (55.0, "started", "pod-b")],
            "pod_stopped",
            41.0,
            id="its-worker-shut-down-and-was-killed-after-the-grace-period",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (40.0, "deleted", "pod-a"),
             (41.0, "started", "pod-b")],
            "pod_stopped",
            40.0,
            id="its-pod-was-deleted-sigkill-after-the-grace-period",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"),
             (5.0, "failed", "pod-a", {"exception": "WorkerLostError('Worker exited prematurely: signal 9')"}),
             (6.0, "started", "pod-a")],
            "worker_lost",
            5.0,
            id="its-process-died",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (9.0, "worker-online", "pod-a"),
             (10.0, "started", "pod-a")],
            "worker_lost",
            9.0,
            id="its-worker-restarted",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (1801.0, "worker-offline", "pod-a"),
             (1801.5, "worker-online", "pod-a"), (1802.0, "started", "pod-b")],
            "ack_timeout",
            1801.0,
            id="the-broker-closed-its-channel-at-the-timeout-and-its-worker-restarted-its-consumer",
        ),
    ],
)  # fmt: skip
def test_a_task_started_again_is_a_rerun_with_its_cause(
    steps: list[Any], cause: reruns.Cause, first_run: float
) -> None:
    registry = MetricsRegistry()
    run(registry, *steps)
    metrics = registry.service("shop", "billing")
    [rerun] = metrics.reruns.since(0.0)
    assert (rerun.task, rerun.cause, rerun.first_run_seconds) == (TASK, cause, first_run)
    assert value(samples(registry), "celery_event_operator_task_reruns_total", name=TASK, cause=cause) == 1


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param([(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (5.0, "succeeded", "pod-a")], id="once"),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (5.0, "retried", "pod-a"),
             (7.0, "started", "pod-b"), (9.0, "succeeded", "pod-b")],
            id="a-retry-on-the-broker-is-no-rerun",
        ),
        pytest.param(
            [(0.0, "received", "pod-a"), (0.0, "started", "pod-a"), (5.0, "succeeded", "pod-a"),
             (6.0, "worker-offline", "pod-a"), (7.0, "deleted", "pod-a")],
            id="a-rollout-after-it-ended",
        ),
    ],
)  # fmt: skip
def test_runs_that_ended_are_no_reruns(steps: list[Any]) -> None:
    registry = MetricsRegistry()
    run(registry, *steps)
    assert registry.service("shop", "billing").reruns.since(0.0) == []
    assert not [key for key in samples(registry) if key[0] == "celery_event_operator_task_reruns_total"]


def test_the_memory_of_cut_runs_is_bounded() -> None:
    found = reruns.Reruns()
    for number in range(reruns.RUNS_CUT_KEPT + 5):
        found.cut(f"t-{number}", "pod_stopped", TASK, 0.0, 1.0, ack_timeout=None)
    assert found.started("t-0", TASK, None, 2.0, None) is None, "the oldest cut runs are forgotten first"
    assert found.started(f"t-{reruns.RUNS_CUT_KEPT}", TASK, None, 2.0, None) is not None


def test_a_task_started_again_after_its_run_outlasted_the_acknowledgement_timeout() -> None:
    """The solo pool's events come once the task ended: the first run's start and end arrive together, then the
    broker's second delivery starts it again (the worker measured the first run: 1,850 s)."""
    registry = MetricsRegistry()
    run(
        registry,
        (1850.0, "received", "pod-a"),
        (1850.0, "started", "pod-a"),
        (1850.0, "succeeded", "pod-a", {"runtime": 1850.0}),
        (1851.0, "started", "pod-b"),
    )
    [rerun] = registry.service("shop", "billing").reruns.since(0.0)
    assert (rerun.task, rerun.cause, rerun.first_run_seconds) == (TASK, "ack_timeout", 1850.0)
