"""A broker's resource alarms from the management API's health check (pure): what RabbitMQ 3.10 answers."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.broker.alarms import Alarm, alarms_of, describe

# As measured on a node with `rabbitmqctl set_vm_memory_high_watermark 0.000001`.
MEMORY = {
    "alarms": [{"node": "rabbit@a", "resource": "memory"}],
    "reason": "There are alarms in effect in the cluster",
    "status": "failed",
}


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        pytest.param(200, {"status": "ok"}, (), id="none"),
        pytest.param(503, MEMORY, (Alarm("memory", "rabbit@a"),), id="memory"),
        pytest.param(
            503,
            {
                "status": "failed",
                "alarms": [{"node": "b", "resource": "disk"}, {"node": "a", "resource": "memory"}] * 2,
            },
            (Alarm("disk", "b"), Alarm("memory", "a")),
            id="two-sorted-once-each",
        ),
        pytest.param(503, {"alarms": ["garbage", {}]}, (Alarm("unknown", "unknown"),), id="odd-entries"),
        pytest.param(401, {"error": "not_authorised"}, None, id="not-allowed"),
        pytest.param(404, None, None, id="no-such-endpoint"),
        pytest.param(503, "Service Unavailable", None, id="no-json"),
        pytest.param(200, [], None, id="not-a-health-answer"),
    ],
)
def test_alarms_of_the_health_check(status: int, body: Any, expected: tuple[Alarm, ...] | None) -> None:
    assert alarms_of(status, body) == expected


def test_the_description_names_the_alarm_and_what_it_stops() -> None:
    text = describe((Alarm("memory", "rabbit@a"),))
    assert text.startswith("memory alarm on node rabbit@a: the broker blocks publishers")
    assert "retries, archives or events" in text
