"""A service's planned topology beside what the broker holds, as a table for people (pure)."""

from __future__ import annotations

from celery_event_operator.core.topology.outcome import EntityState
from celery_event_operator.core.topology.plan import Topology


def rows(topology: Topology, states: list[EntityState]) -> list[dict[str, str]]:
    found = {(state.kind, state.name): state for state in states}
    listed = []
    for exchange in topology.exchanges:
        state = found.get(("exchange", exchange.name))
        listed.append(
            {
                "entity": exchange.name,
                "kind": "exchange",
                "detail": f"{exchange.type}{' (shared)' if exchange.shared else ''}",
                "messages": "",
                "consumers": "",
                "state": "ok" if state and state.present else "missing",
            }
        )
    for queue in topology.queues:
        state = found.get(("queue", queue.name))
        present = state is not None and state.present
        listed.append(
            {
                "entity": queue.name,
                "kind": f"queue/{queue.role}",
                "detail": " ".join(f"{key}={value}" for key, value in queue.arguments.items()),
                "messages": str(state.messages) if present and state else "",
                "consumers": str(state.consumers) if present and state else "",
                "state": "ok" if present else "missing",
            }
        )
    return listed


def table(listed: list[dict[str, str]]) -> str:
    columns = ["entity", "kind", "messages", "consumers", "state", "detail"]
    widths = {column: max([len(column), *(len(row[column]) for row in listed)]) for column in columns}
    lines = ["  ".join(column.upper().ljust(widths[column]) for column in columns).rstrip()]
    lines += ["  ".join(row[column].ljust(widths[column]) for column in columns).rstrip() for row in listed]
    return "\n".join(lines)
