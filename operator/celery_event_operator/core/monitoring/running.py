"""The tasks each worker of a service runs now, from its Celery events (pure): task-started without an end yet.

It tells how much work a pod would throw away if it were deleted now (its deletion cost). Bounded: at most
RUNNING_KEPT tasks per service (the oldest starts go first); a worker that says it runs nothing (a heartbeat with
`active: 0`, or offline) forgets its tasks whose end events were lost.
"""

from __future__ import annotations

import collections

RUNNING_KEPT = 10_000


class RunningTasks:
    def __init__(self, limit: int = RUNNING_KEPT) -> None:
        self._limit = limit
        self._started: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()  # uuid → worker, at
        self._of_worker: dict[str, set[str]] = {}

    def started(self, uuid: str, worker: str, now: float) -> None:
        self.ended(uuid)
        self._started[uuid] = (worker, now)
        self._of_worker.setdefault(worker, set()).add(uuid)
        if len(self._started) > self._limit:
            self.ended(next(iter(self._started)))

    def ended(self, uuid: str) -> None:
        found = self._started.pop(uuid, None)
        if found is not None:
            tasks = self._of_worker.get(found[0])
            if tasks is not None:
                tasks.discard(uuid)
                if not tasks:
                    del self._of_worker[found[0]]

    def forget(self, worker: str) -> None:
        """The worker runs nothing (any more): its tasks whose end was not seen go."""
        for uuid in self._of_worker.pop(worker, ()):
            self._started.pop(uuid, None)

    def elapsed(self, now: float) -> dict[str, list[float]]:
        """Per worker, how long each of its running tasks has run (seconds)."""
        return {worker: [now - self._started[uuid][1] for uuid in tasks] for worker, tasks in self._of_worker.items()}
