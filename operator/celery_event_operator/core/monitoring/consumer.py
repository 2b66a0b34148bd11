"""A service's events consumer as the passes see it (pure typing): what the flow asks of the one the broker's events
connection made for it, whatever connection that is."""

from __future__ import annotations

from typing import Protocol

# The problem of a consumer whose connection is still being made (no failure of its own).
CONNECTING = "not connected yet"


class EventsSubscription(Protocol):
    @property
    def queue(self) -> str: ...  # the queue it consumes

    @property
    def problem(self) -> str | None: ...  # why it does not consume (None: it does)

    @property
    def tag(self) -> bytes: ...  # its consumer tag: how its connection knows it
