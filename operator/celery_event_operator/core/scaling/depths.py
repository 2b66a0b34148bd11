"""A service's queue depths and the counters status shows of them (pure)."""

from __future__ import annotations

import dataclasses

ROLE_COUNTERS = {"events": "queueLength", "retry": "retrying", "archive": "archived"}
# How the depths were counted when the management API gave them (the only way the held messages are seen).
READY_AND_UNACKNOWLEDGED = "ready + unacknowledged"


@dataclasses.dataclass(frozen=True)
class QueueDepth:
    queue: str
    role: str
    waiting: int  # ready + unacknowledged (ready only without the management API)
    consumers: int


def counters(depths: tuple[QueueDepth, ...]) -> dict[str, int]:
    """`queueLength`, `retrying`, `archived` and `consumers` (of the handler queues)."""
    totals = {"queueLength": 0, "retrying": 0, "archived": 0, "consumers": 0}
    for depth in depths:
        totals[ROLE_COUNTERS[depth.role]] += depth.waiting
        if depth.role == "events":
            totals["consumers"] += depth.consumers
    return totals


def counts_unacknowledged(source: str) -> bool:
    """Whether depths counted as `source` says include the messages workers hold (ready only without the
    management API)."""
    return source.startswith(READY_AND_UNACKNOWLEDGED)
