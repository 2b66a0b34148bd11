"""The tasks each worker of a service runs now, from its Celery events (pure): task-started without an end yet.

It tells whether a pod is busy (a busy pod is judged by its tasks, never by its silence: a task blocks the solo
pool's heartbeats) and how much work a deletion would throw away (its deletion cost). Besides the tasks seen
starting, a worker may run tasks that were not seen starting: before the operator consumed its events (a restart),
while the solo pool holds them back until the task ends, or forgotten for want of memory. Those are counted per
worker, as "running since about" a time, and only evidence forgets them: a heartbeat saying how many tasks the worker
runs, its going offline or online again, the end of a task not seen starting, or the broker showing that the worker
holds no delivery. Bounded: at most RUNNING_KEPT tasks per service (the oldest starts are then counted
as not seen, not forgotten).
"""

from __future__ import annotations

import collections
import dataclasses

RUNNING_KEPT = 10_000


@dataclasses.dataclass(frozen=True)
class RunningTask:
    uuid: str
    started_at: float
    name: str | None = None  # None: not known (its task-received was not seen)


@dataclasses.dataclass
class _Unseen:
    count: int  # tasks running that were not seen starting
    since: float  # running since about then (the earliest it may have begun: what its deletion would throw away)
    surely_since: float  # running since then at the latest (how long it surely ran: what may be judged)


class RunningTasks:
    def __init__(self, limit: int = RUNNING_KEPT) -> None:
        self._limit = limit
        self._started: collections.OrderedDict[str, tuple[str, RunningTask]] = collections.OrderedDict()
        self._of_worker: dict[str, set[str]] = {}
        self._unseen: dict[str, _Unseen] = {}

    def started(self, uuid: str, worker: str, now: float) -> None:
        self._drop(uuid)
        self._started[uuid] = (worker, RunningTask(uuid, now))
        self._of_worker.setdefault(worker, set()).add(uuid)
        if len(self._started) > self._limit:
            oldest_worker, oldest = self._started[next(iter(self._started))]
            self._drop(oldest.uuid)
            self._add_unseen(oldest_worker, 1, oldest.started_at)  # still running: only which task is forgotten

    def ended(self, uuid: str, worker: str | None = None) -> None:
        """A task ended (on `worker`, when known): a task of the worker not seen starting, when it is none known."""
        if not self._drop(uuid) and worker is not None:
            unseen = self._unseen.get(worker)
            if unseen is not None:
                unseen.count -= 1
                if unseen.count <= 0:
                    del self._unseen[worker]

    def count(self) -> int:
        """Tasks running now, seen starting or not."""
        return len(self._started) + sum(unseen.count for unseen in self._unseen.values())

    def forget(self, worker: str) -> None:
        """The worker runs nothing (any more): its tasks whose end was not seen go."""
        for uuid in self._of_worker.pop(worker, ()):
            self._started.pop(uuid, None)
        self._unseen.pop(worker, None)

    def active(self, worker: str, count: int, now: float) -> None:
        """The worker says it runs `count` tasks (its heartbeat): the ones not seen starting are the rest."""
        if count == 0:
            self.forget(worker)
            return
        known = len(self._of_worker.get(worker, ()))
        if count <= known:
            self._unseen.pop(worker, None)
        else:
            unseen = self._unseen.get(worker)
            since = (unseen.since, unseen.surely_since) if unseen is not None else (now, now)
            self._unseen[worker] = _Unseen(count - known, *since)

    def assume_busy(self, worker: str, since: float, surely_since: float | None = None) -> None:
        """Something outside the events says the worker runs a task (its pod's deletion cost, written before the
        operator restarted; the deliveries it holds): believed until evidence says otherwise. It began about
        `since`, and at the latest at `surely_since` (by default the same)."""
        if worker not in self._of_worker and worker not in self._unseen:
            self._unseen[worker] = _Unseen(1, since, since if surely_since is None else surely_since)

    def holds(self, worker: str, deliveries: int, since: float, now: float) -> None:
        """The broker says the worker holds `deliveries` unacknowledged (late acknowledgement: one per task it runs).
        Holding some while running nothing known: it runs a task its events do not show yet (the solo pool sends them
        when the task ends), begun about `since` (after the last event heard of it) and surely by `now`; holding
        none: it runs no task not seen starting."""
        if deliveries > 0:
            self.assume_busy(worker, since, now)
        else:
            self._unseen.pop(worker, None)

    def started_at(self, uuid: str) -> float | None:
        """When a task seen starting began, while it runs."""
        found = self._started.get(uuid)
        return found[1].started_at if found is not None else None

    def tasks(self, worker: str) -> list[RunningTask]:
        """The worker's running tasks seen starting, oldest first."""
        found = [self._started[uuid][1] for uuid in self._of_worker.get(worker, ())]
        return sorted(found, key=lambda task: task.started_at)

    def unseen(self, worker: str) -> tuple[int, float, float] | None:
        """(How many tasks not seen starting the worker runs, since about when, since when at the latest); None:
        none."""
        found = self._unseen.get(worker)
        return (found.count, found.since, found.surely_since) if found is not None else None

    def workers(self) -> set[str]:
        """The workers running anything."""
        return set(self._of_worker) | set(self._unseen)

    def elapsed(self, now: float) -> dict[str, list[float]]:
        """Per worker, how long each of its running tasks seen starting has run, and at least how long the ones not seen
        starting have (one figure for them all; seconds)."""
        found = {worker: [now - task.started_at for task in self.tasks(worker)] for worker in self._of_worker}
        for worker, unseen in self._unseen.items():
            found.setdefault(worker, []).append(now - unseen.since)  # the longest of them, however many
        return found

    def _add_unseen(self, worker: str, count: int, since: float) -> None:
        unseen = self._unseen.get(worker)
        if unseen is None:
            self._unseen[worker] = _Unseen(count, since, since)
        else:
            unseen.count += count
            unseen.since = min(unseen.since, since)
            unseen.surely_since = min(unseen.surely_since, since)

    def _drop(self, uuid: str) -> bool:
        found = self._started.pop(uuid, None)
        if found is None:
            return False
        tasks = self._of_worker.get(found[0])
        if tasks is not None:
            tasks.discard(uuid)
            if not tasks:
                del self._of_worker[found[0]]
        return True
