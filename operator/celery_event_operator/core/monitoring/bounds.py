"""Bounds on what a service's Celery events can make of its metrics (pure).

Every label value that input controls is bounded per service: task names (`maxTaskNames`), exception classes
per task, the queue names of tasks of no handler, and worker hostnames (live pods, plus a few workers outside
Kubernetes). A value past its bound is counted under the label value `__overflow__`, each such event counted
for the operator's own metric, and the distinct values refused estimated (a HyperLogLog of a few KiB), so that
the service can be told once how many were seen and how many kept. The memory of tasks in flight (uuid →
name, queue, wait start) is bounded per service and across the services of the operator (`TaskBudget`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

OVERFLOW = "__overflow__"  # the label value of everything past a bound
DEFAULT_MAX_TASK_NAMES = 500
MAX_EXCEPTIONS_PER_TASK = 20
MAX_QUEUES = 50  # queue_name values of tasks of no handler (task-sent's `queue`): the handlers' queues are free
MAX_WORKERS_OUTSIDE_PODS = 100  # hostnames that are no live pod of the service (a laptop, a VM)
# The most tasks one worker may say it runs at once (its heartbeats' `concurrency`): beyond the largest gevent or
# eventlet pools; a larger number is no worker's, and the replicas computed from it would be nonsense.
MAX_WORKER_SLOTS = 10_000
# Tasks in flight remembered (for the events that carry neither name nor queue), per service and in all.
TASKS_KEPT = 50_000
TASKS_BUDGET = 200_000  # about 55 MB when full
LABELS = ("name", "exception", "queue_name", "hostname")  # the bounded labels


@dataclasses.dataclass(frozen=True)
class SeriesSettings:
    """How a service's task series are shaped (spec.monitoring, else the operator's flags)."""

    per_pod: bool = False  # `hostname` on task series (celery-exporter's shape), one set per pod
    max_task_names: int = DEFAULT_MAX_TASK_NAMES


DEFAULT_SETTINGS = SeriesSettings()


def series_settings(per_pod: bool | None, max_task_names: int | None, defaults: SeriesSettings) -> SeriesSettings:
    """The spec's fields where set, the operator's defaults where not."""
    return SeriesSettings(
        per_pod=defaults.per_pod if per_pod is None else per_pod,
        max_task_names=defaults.max_task_names if max_task_names is None else max_task_names,
    )


class DistinctCount:
    """How many distinct strings were added: exact up to EXACT_UP_TO (their 64-bit hashes kept), then estimated
    (HyperLogLog, 4,096 registers: about ±1.6 %). Within one process: it uses Python's string hash.

    Exact for small counts because two of five values sharing a register (one process in a hundred, by its hash
    seed) made linear counting say "about 4" of 5 refused labels — in a Warning's text and in a test that failed
    once in a while for it."""

    BITS = 12
    REGISTERS = 1 << BITS
    EXACT_UP_TO = 64
    __slots__ = ("_registers", "_small")

    def __init__(self) -> None:
        self._registers = bytearray(self.REGISTERS)
        self._small: set[int] | None = set()

    def add(self, value: str) -> None:
        hashed = hash(value) & 0xFFFF_FFFF_FFFF_FFFF
        if self._small is not None:
            self._small.add(hashed)
            if len(self._small) > self.EXACT_UP_TO:
                self._small = None  # the registers hold them all
        index, rest = hashed & (self.REGISTERS - 1), hashed >> self.BITS
        rank = 64 - self.BITS - rest.bit_length() + 1  # position of the first 1 bit of the remaining 52
        self._registers[index] = max(self._registers[index], rank)

    def estimate(self) -> int:
        if self._small is not None:
            return len(self._small)
        registers = self.REGISTERS
        zeros = self._registers.count(0)
        if zeros == registers:
            return 0
        harmonic = sum(2.0**-rank for rank in self._registers)
        raw = 0.7213 / (1 + 1.079 / registers) * registers * registers / harmonic
        if raw <= 2.5 * registers and zeros:
            return round(registers * math.log(registers / zeros))
        return round(raw)


class Overflow:
    """What was refused for one label of one service: events counted under OVERFLOW, and distinct values."""

    __slots__ = ("events", "refused")

    def __init__(self) -> None:
        self.events = 0
        self.refused = DistinctCount()

    def add(self, value: str) -> None:
        self.events += 1
        self.refused.add(value)


class TaskMemory(Protocol):
    """A service's memory of tasks in flight, as the budget sees it."""

    def tasks_remembered(self) -> int: ...

    def forget_oldest_tasks(self, count: int) -> None: ...


class TaskBudget:
    """Tasks remembered across the services of one operator. When the budget is full, the service that
    remembers the most forgets its oldest: each service keeps at least an equal share whatever the others'
    producers send (max-min fairness), and one service alone may use what the others leave."""

    def __init__(self, limit: int = TASKS_BUDGET) -> None:
        self.limit = limit
        self.total = 0
        self.members: dict[int, TaskMemory] = {}

    def join(self, member: TaskMemory) -> None:
        self.members[id(member)] = member

    def leave(self, member: TaskMemory) -> None:
        if self.members.pop(id(member), None) is not None:
            self.total -= member.tasks_remembered()

    def reclaim(self) -> None:
        """Down to 1 % under the limit, taken from the largest memories down to a common level (one sort of
        the members every limit/100 tasks, not a scan at every task)."""
        excess = self.total - (self.limit - max(1, self.limit // 100))
        if excess <= 0:
            return
        members = sorted(self.members.values(), key=lambda member: member.tasks_remembered(), reverse=True)
        sizes = [member.tasks_remembered() for member in members]
        level = forgotten = 0
        for above, size in enumerate(sizes, start=1):
            below = sizes[above] if above < len(sizes) else 0
            if forgotten + above * (size - below) >= excess:
                level = size - math.ceil((excess - forgotten) / above)
                break
            forgotten += above * (size - below)
        for member, size in zip(members, sizes, strict=True):
            if size <= level:
                break
            member.forget_oldest_tasks(size - level)
