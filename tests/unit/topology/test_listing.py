from __future__ import annotations

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.topology import listing, plan
from celery_event_operator.core.topology.outcome import EntityState

TOPOLOGY = plan.plan(
    "s",
    parse_spec(
        {
            "broker": {"secretRef": {"name": "r"}},
            "events": {"handlers": [{"name": "e"}]},
            "retry": {"maxRetries": 1},
            "archive": {"enabled": False},
        }
    ),
)


def test_rows_mark_missing_entities_and_show_depths() -> None:
    states = [
        EntityState("exchange", "events", True),
        EntityState("exchange", "s:retry", False),
        EntityState("queue", "s.e", True, 5, 2),
    ]
    rows = {row["entity"] + "/" + row["kind"]: row for row in listing.rows(TOPOLOGY, states)}
    assert rows["events/exchange"]["state"] == "ok"
    assert rows["events/exchange"]["detail"] == "topic (shared)"
    assert rows["s:retry/exchange"]["state"] == "missing"
    assert (rows["s.e/queue/events"]["messages"], rows["s.e/queue/events"]["consumers"]) == ("5", "2")
    assert rows["s:retry/queue/retry"]["state"] == "missing"
    assert "x-message-ttl=1000" in rows["s:retry/queue/retry"]["detail"]


def test_table_aligns_columns() -> None:
    lines = listing.table(listing.rows(TOPOLOGY, [])).splitlines()
    assert lines[0].split() == ["ENTITY", "KIND", "MESSAGES", "CONSUMERS", "STATE", "DETAIL"]
    assert len(lines) == 1 + len(TOPOLOGY.exchanges) + len(TOPOLOGY.queues)
    assert len({line.index("missing") for line in lines[1:] if "missing" in line}) == 1
