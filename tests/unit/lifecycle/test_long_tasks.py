"""Long tasks against the broker's acknowledgement timeout, and whether tasks run once (pure)."""

from __future__ import annotations

import pytest

from celery_event_operator.core.lifecycle.long_tasks import AckTimeout, ack_timeout, run_once, version_of
from celery_event_operator.core.monitoring.reruns import Rerun

BROKERS = AckTimeout(1800.0, "consumer_timeout 1800 s of RabbitMQ 3.10.8", per_consumer=False)


@pytest.mark.parametrize(
    ("version", "asked", "expected"),
    [
        pytest.param("3.10.8", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 3.10.8", False), id="3.10-its-own"),
        pytest.param("3.11.14", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 3.11.14", False), id="3.11.14"),
        pytest.param("3.11.15", 3660, (3660.0, "x-consumer-timeout 3660 s, asked by the workers", True), id="3.11.15"),
        pytest.param("4.1.0", 3660, (3660.0, "x-consumer-timeout 3660 s, asked by the workers", True), id="4.x"),
        pytest.param(None, 3660, (1800.0, "consumer_timeout 1800 s of the broker", False), id="version-unknown"),
        pytest.param("4.1.0", None, (1800.0, "consumer_timeout 1800 s of RabbitMQ 4.1.0", False), id="no-workers"),
    ],
)
def test_the_timeout_in_effect(version: str | None, asked: int | None, expected: tuple[float, str, bool]) -> None:
    found = ack_timeout(version, 1800, asked)
    assert (found.seconds, found.source, found.per_consumer) == expected


def test_versions() -> None:
    assert version_of("3.10.8") == (3, 10, 8)
    assert version_of("4.0.0-rc.1") == (4, 0, 0)
    assert version_of("") is None


def test_tasks_that_ran_once() -> None:
    found = run_once([], timeout=BROKERS, observed=512.0, grace=600)
    assert (found.status, found.reason, found.message) == (
        True,
        "RunOnce",
        "no task was started again in the last hour",
    )


def test_tasks_about_to_outlast_the_brokers_timeout_are_said_before_they_run_twice() -> None:
    found = run_once([], timeout=BROKERS, observed=2048.0, grace=3600)
    assert (found.status, found.reason, found.causes) == (False, "AckTimeoutTooShort", frozenset())
    assert found.message == (
        "tasks will run twice: 99 % of the tasks of the last hour ran within 2048 s, near or past the broker's "
        "acknowledgement timeout (consumer_timeout 1800 s of RabbitMQ 3.10.8), after which it gives a task's message "
        "to another worker while the first still runs it (the broker's timeout applies: consumer_timeout 1800 s of "
        "RabbitMQ 3.10.8; raise consumer_timeout in rabbitmq.conf above the longest task, or run RabbitMQ 3.11.15 or "
        "later, where the workers ask for their own)"
    )


def test_reruns_are_said_per_cause_with_what_to_change() -> None:
    reruns = [
        Rerun("orders.created", "ack_timeout", 1805.0, 10.0),
        Rerun("orders.created", "ack_timeout", 1801.0, 20.0),
        Rerun("reports.build", "pod_stopped", 640.0, 30.0),
    ]
    found = run_once(reruns, timeout=BROKERS, observed=None, grace=600)
    assert (found.status, found.reason, found.causes) == (
        False,
        "TasksRerun",
        frozenset({"ack_timeout", "pod_stopped"}),
    )
    assert found.message.startswith(
        "in the last hour, tasks ran twice — 2 started again after the broker's acknowledgement timeout delivered it "
        "again while it ran: orders.created (2); the longest first run lasted 1805 s (the broker's timeout applies"
    )
    assert (
        "1 started again after its pod stopped while it ran (a rollout, a scale-in or an eviction): reports.build "
        "(1); the longest first run lasted 640 s (the grace period, 600 s, was shorter: raise "
        "workers.maxGracePeriodSeconds)"
    ) in found.message
