"""What each RabbitMQ version does with unacknowledged deliveries, and what the workers ask for (pure)."""

from __future__ import annotations

import pytest

from celery_event_operator.core.broker import versions


def test_versions_parse() -> None:
    assert versions.parse("3.10.8") == (3, 10, 8)
    assert versions.parse("4.0.0-rc.1") == (4, 0, 0)
    assert versions.parse("") is None
    assert versions.parse(None) is None


@pytest.mark.parametrize(
    ("server", "queue_type", "expected"),
    [
        # Ignored there (3.10.8, 4.0.5 measured): not asked, the broker's own applies.
        pytest.param("3.10.8", "classic", {}, id="3.10"),
        pytest.param("4.0.5", "classic", {}, id="4.0-classic"),
        pytest.param("4.0.5", "quorum", {}, id="4.0-quorum"),
        # 4.3.2 and later refuse it on classic queues (406 on basic.consume: the worker could not consume).
        pytest.param("4.3.6", "classic", {}, id="4.3-classic-refused"),
        pytest.param("4.3.6", "quorum", {"x-consumer-timeout": 3_660_000}, id="4.3-quorum"),
        pytest.param(None, "quorum", {}, id="unknown"),
    ],
)
def test_what_workers_ask_for(server: str | None, queue_type: str, expected: dict[str, int]) -> None:
    assert versions.consumer_arguments(server, queue_type, 3660) == expected


def test_nothing_asked_without_a_timeout() -> None:
    assert versions.consumer_arguments("4.3.6", "quorum", None) == {}


@pytest.mark.parametrize(
    ("version", "queue_type", "expected"),
    [
        pytest.param((3, 10, 8), "quorum", (True, False), id="3.10"),
        pytest.param((4, 2, 0), "classic", (True, False), id="4.2"),
        pytest.param((4, 3, 0), "classic", (False, False), id="4.3-classic"),
        pytest.param((4, 3, 6), "quorum", (True, True), id="4.3-quorum"),
        # Not measured: classic queues may be timed out again (a warning too many rather than none).
        pytest.param((4, 4, 0), "classic", (True, False), id="later-classic"),
        pytest.param((4, 4, 0), "quorum", (True, True), id="later-quorum"),
    ],
)
def test_support(version: tuple[int, ...], queue_type: str, expected: tuple[bool, bool]) -> None:
    found = versions.ack_timeout_support(version, queue_type)
    assert (found.enforced, found.per_consumer) == expected
