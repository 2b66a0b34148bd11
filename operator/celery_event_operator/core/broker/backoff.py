"""Exponential backoff between attempts (pure: the caller passes the time).

One helper for every connection the operator keeps (the control connection of a broker, its events
connection, one service's subscription on it): after n failures in a row the next attempt waits
min(initial * 2^(n-1), maximum) seconds, with a little jitter so that many waiters do not retry in step.
"""

from __future__ import annotations

import dataclasses
import random

BACKOFF_INITIAL_SECONDS = 1.0
BACKOFF_MAX_SECONDS = 60.0


@dataclasses.dataclass
class Backoff:
    initial: float = BACKOFF_INITIAL_SECONDS
    maximum: float = BACKOFF_MAX_SECONDS
    jitter: float = 0.1  # up to this share of the delay is added at random
    failures: int = 0
    retry_at: float = 0.0

    def failed(self, now: float) -> float:
        """Count a failure; returns the delay until the next attempt (also kept in `retry_at`)."""
        self.failures += 1
        delay = float(min(self.initial * 2 ** (self.failures - 1), self.maximum))
        delay += delay * self.jitter * random.random()
        self.retry_at = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.retry_at = 0.0

    def waiting(self, now: float) -> float:
        """Seconds until the next attempt is allowed (0: now)."""
        return max(0.0, self.retry_at - now)
