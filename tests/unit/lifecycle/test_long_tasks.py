"""Long tasks against the broker's acknowledgement timeout, and whether tasks run once (pure)."""

from __future__ import annotations

import pytest

from celery_event_operator.core.lifecycle.long_tasks import AckTimeout, ack_timeout, run_once
from celery_event_operator.core.monitoring.reruns import Rerun

BROKERS = AckTimeout(1800.0, "consumer_timeout 1800 s of RabbitMQ 3.10.8", per_consumer=False)


ASKED = (3660.0, "x-consumer-timeout 3660 s, asked by the workers", True)


@pytest.mark.parametrize(
    ("version", "queue_type", "asked", "expected"),
    [
        pytest.param(
            "3.10.8", "classic", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 3.10.8", False), id="3.10"
        ),
        pytest.param(
            "3.11.15", "quorum", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 3.11.15", False), id="3.11"
        ),
        # Measured on 4.0.5: the consumer's argument is accepted and ignored, on both queue types.
        pytest.param("4.0.5", "quorum", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 4.0.5", False), id="4.0"),
        pytest.param("4.2.9", "classic", 3660, (1800.0, "consumer_timeout 1800 s of RabbitMQ 4.2.9", False), id="4.2"),
        pytest.param("4.3.6", "quorum", 3660, ASKED, id="4.3-quorum-its-own"),
        pytest.param("4.4.0", "quorum", 3660, ASKED, id="later-quorum"),
        pytest.param(
            "4.3.6",
            "classic",
            3660,
            (None, "none: RabbitMQ 4.3.6 enforces no acknowledgement timeout on classic queues", False),
            id="4.3-classic-none",
        ),
        pytest.param(
            "4.3.6", "quorum", None, (1800.0, "consumer_timeout 1800 s of RabbitMQ 4.3.6", False), id="4.3-no-workers"
        ),
        pytest.param(None, "quorum", 3660, (1800.0, "consumer_timeout 1800 s of the broker", False), id="unknown"),
    ],
)
def test_the_timeout_in_effect(
    version: str | None, queue_type: str, asked: int | None, expected: tuple[float | None, str, bool]
) -> None:
    found = ack_timeout(version, 1800, asked, queue_type)
    assert (found.seconds, found.source, found.per_consumer) == expected


def test_no_warning_where_the_broker_enforces_no_timeout() -> None:
    """RabbitMQ 4.3's classic queues: however long the tasks, none is given out again by a timeout."""
    none = ack_timeout("4.3.6", 1800, 3660, "classic")
    found = run_once([], timeout=none, observed=100_000.0, grace=600)
    assert (found.status, found.reason) == (True, "RunOnce")
    assert "RabbitMQ 4.3.6 enforces no acknowledgement timeout on classic queues" in found.message


def test_tasks_that_ran_once() -> None:
    found = run_once([], timeout=BROKERS, observed=512.0, grace=600)
    assert (found.status, found.reason, found.message) == (
        True,
        "RunOnce",
        "no task was started again in the last hour "
        "(acknowledgement timeout: consumer_timeout 1800 s of RabbitMQ 3.10.8)",
    )


def test_tasks_about_to_outlast_the_brokers_timeout_are_said_before_they_run_twice() -> None:
    found = run_once([], timeout=BROKERS, observed=2048.0, grace=3600)
    assert (found.status, found.reason, found.causes) == (False, "AckTimeoutTooShort", frozenset())
    assert found.message == (
        "tasks will run twice: 99 % of the tasks of the last hour ran within 2048 s, near or past the broker's "
        "acknowledgement timeout (consumer_timeout 1800 s of RabbitMQ 3.10.8), after which it gives a task's message "
        "to another worker while the first still runs it (the broker's timeout applies: consumer_timeout 1800 s of "
        "RabbitMQ 3.10.8; raise consumer_timeout in rabbitmq.conf above the longest task — or a consumer-timeout "
        "policy on the service's handler queues, RabbitMQ 3.12 or later — or run queueType: quorum on RabbitMQ 4.3 "
        "or later, where the workers ask for their own)"
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


def test_a_quorum_service_on_a_broker_that_honours_the_workers_own_is_told_to_give_them_a_spec() -> None:
    """RabbitMQ 4.3, quorum queues, no spec.workers: nothing asked, the broker's timeout applies — the advice is
    the spec that makes the workers ask, not the queue type the service already has."""
    timeout = ack_timeout("4.3.6", 1800, None, "quorum")
    assert (timeout.seconds, timeout.per_consumer, timeout.askable) == (1800.0, False, True)
    found = run_once([Rerun("reports.build", "ack_timeout", 1805.0, 10.0)], timeout=timeout, observed=None, grace=None)
    assert "give the service spec.workers" in found.message
    assert "queueType: quorum" not in found.message
