"""A broker's resource alarms, as its management API reports them (pure).

While a memory or disk alarm is in effect RabbitMQ blocks every connection that publishes (`connection.blocked`,
then it stops reading them), so workers cannot publish retries, archives or events, while consumers go on.
A consumer-only connection, like the operator's, is never told: the alarms are read from the management API's
`GET /api/health/checks/alarms` (200 without alarms; 503 with them), which needs only the `management` tag.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True, order=True)
class Alarm:
    resource: str  # "memory", "disk"
    node: str

    def __str__(self) -> str:
        return f"{self.resource} alarm on node {self.node}"


def alarms_of(status: int, body: Any) -> tuple[Alarm, ...] | None:
    """The alarms in an answer of the health check; None when the answer is not one (another status, garbage)."""
    if status == 200 and isinstance(body, dict) and body.get("status") == "ok":
        return ()
    if status != 503 or not isinstance(body, dict) or not isinstance(body.get("alarms"), list):
        return None
    found = {
        Alarm(str(alarm.get("resource") or "unknown"), str(alarm.get("node") or "unknown"))
        for alarm in body["alarms"]
        if isinstance(alarm, dict)
    }
    return tuple(sorted(found))


def describe(alarms: tuple[Alarm, ...]) -> str:
    """What the alarms mean for a service's workers (a stable text: one Event per change)."""
    return (
        "; ".join(str(alarm) for alarm in alarms)
        + ": the broker blocks publishers, so the workers cannot publish retries, archives or events until it clears"
    )
