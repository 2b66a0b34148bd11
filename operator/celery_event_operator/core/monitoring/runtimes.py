"""How long a service's tasks run, over the last one to two hours (pure): what a worker's shutdown must wait for.

Fed by every task-succeeded event's `runtime` (measured by the worker, so right for every pool, the solo pool's
events coming late included). Kept in powers of two (a task of 300 s counts as up to 512 s) in two halves of
WINDOW_SECONDS that take turns, so that it is bounded (twice BUCKETS counts per service) and forgets what ran
long ago. `percentile` answers with a bucket's upper bound: never below what ran.
"""

from __future__ import annotations

import math

WINDOW_SECONDS = 3600.0
BUCKETS = 18  # up to 2^17 s (36 h): beyond any grace period


class RuntimeWindow:
    def __init__(self) -> None:
        self._current = [0] * BUCKETS
        self._previous = [0] * BUCKETS
        self._turned_at: float | None = None

    def observe(self, seconds: float, now: float) -> None:
        if self._turned_at is None:
            self._turned_at = now
        elif now - self._turned_at >= WINDOW_SECONDS:
            old = now - self._turned_at >= 2 * WINDOW_SECONDS
            self._previous, self._current = ([0] * BUCKETS if old else self._current), [0] * BUCKETS
            self._turned_at = now
        # bucket b: runtimes in (2^(b-1), 2^b]
        self._current[min(BUCKETS - 1, max(0, math.ceil(seconds) - 1).bit_length())] += 1

    def percentile(self, share: float, now: float) -> float | None:
        """The runtime that `share` of the tasks of the window did not exceed (a power of two; None: none ran)."""
        if self._turned_at is None or now - self._turned_at >= 2 * WINDOW_SECONDS:
            return None
        counts = [a + b for a, b in zip(self._current, self._previous, strict=True)]
        if now - self._turned_at >= WINDOW_SECONDS:
            counts = self._current[:]  # the previous half is older than the window
        total = sum(counts)
        if total == 0:
            return None
        seen = 0
        for bucket, count in enumerate(counts):
            seen += count
            if seen >= share * total:
                return float(2**bucket)
        return float(2 ** (BUCKETS - 1))
