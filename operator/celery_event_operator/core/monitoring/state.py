"""Metrics state of one service, fed by its Celery events (pure, plain dicts we own).

Series are keyed by label tuples. By default task series are the service's (no `hostname`): they stay the
same series through rollouts. With per-pod task series (opt-in) every series of a worker is indexed by the
worker, so a pod's series go at once (no scan of the others). Every label value that input controls is
bounded (bounds.py). Everything runs on the operator's event loop, the /metrics renderer included: there is
no lock on the event path; the renderer notices a change by `version`.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeGuard, TypeVar, overload

from celery_event_operator.core import naming
from celery_event_operator.core.monitoring import bounds
from celery_event_operator.core.monitoring.bounds import (
    DEFAULT_SETTINGS,
    OVERFLOW,
    Overflow,
    SeriesSettings,
    TaskBudget,
)
from celery_event_operator.core.monitoring.reruns import Cause, Reruns
from celery_event_operator.core.monitoring.running import RunningTask, RunningTasks
from celery_event_operator.core.monitoring.runtimes import RuntimeWindow

# Events whose counters are exported as celery_task_<kind>_total.
TASK_EVENT_KINDS = ("sent", "received", "started", "succeeded", "failed", "rejected", "revoked", "retried")
WITH_EXCEPTION = frozenset({"failed", "retried"})
# The kinds that end a task's run on its worker (a retried task runs again as a new task-started).
ENDED_KINDS = frozenset({"succeeded", "failed", "rejected", "revoked", "retried"})
# The kinds a worker sends: a task's first series brings the others at 0, as celery-exporter does, so
# `failed / (failed + succeeded)` has both sides for a task that never succeeded.
WORKER_KINDS = TASK_EVENT_KINDS[1:]
# Seconds, ten bounds each (a task name's two histograms then cost 26 samples): task runtimes from 10 ms to
# 5 minutes; queue waits from near zero (a healthy queue) to half an hour (a backlog).
RUNTIME_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0)
QUEUE_WAIT_BUCKETS = (0.05, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
GENERIC_WORKER = "generic"  # per-pod series: task-sent comes from producers, which are no workers
SERVICE_WIDE = ""  # the worker part of a task series key without `hostname`
UNKNOWN_TASK = "unknown"  # a task whose name no event of it carried (its first events were missed)
WORKER_LOST = "WorkerLostError"  # the exception of a task whose worker process died (Celery's billiard)
DEFAULT_QUEUE = "celery"  # Celery's task_default_queue: a task of no handler and of no task-sent seen
MAX_EVENT_BYTES = 64 * 1024
MAX_LABEL_CHARS = 512  # longer task names or hostnames are no Celery's: such an event is malformed
# Events that are legitimately larger than MAX_EVENT_BYTES (their traceback), counted from their short fields.
OVERSIZED_KINDS = frozenset({"task-failed", "task-retried"})
TOMBSTONES_KEPT = 10_000
TOMBSTONE_SECONDS = 600.0
PODS_READ_SECONDS = 1.0  # a hostname that is no pod known yet makes the pods be read again, at most this often
# Seconds and counts no worker sends more of (2^32 s is 136 years; unix time until 2106): a sum of such values stays a
# finite float64, and every number exported is one Prometheus parses.
MAX_SECONDS = 2**32
MAX_ACTIVE = 2**32
# Values of an event that cannot be exported as sent, counted by field: label values whose text is no valid UTF-8
# (a lone surrogate, valid in JSON) are exported with U+FFFD in place; numbers out of range are left out.
REFUSED_FIELDS = (
    "name",
    "hostname",
    "exception",
    "queue_name",
    "active",
    "runtime",
    "timestamp",
    naming.CONCURRENCY_FIELD,
    naming.PUBLISHED_AT_FIELD,
)

CounterKey = tuple[str, str, str, str, str]  # kind, task, worker (SERVICE_WIDE by default), queue, exception
HistogramKey = tuple[str, str, str]  # task, worker, queue
TaskMemory = tuple[str, str, float | None]  # name, queue, when its wait for a worker began (None: not measured)


# Events are UTF-8 JSON (Celery's): decoding the bytes ourselves skips json.loads' encoding detection,
# a measurable share of the per-event cost.
_decode_json = json.JSONDecoder().decode


_WAIT_KINDS = frozenset({"sent", "received", "started"})


def _waiting(
    kind: str, stamp: float | None, event: dict[str, Any], waiting_since: float | None, published: float | None = None
) -> tuple[float | None, float | None]:
    """(When the task's wait for a worker began, how long it waited, once it started.) The wait starts when the task
    was published, as the runtime's producer stamped it (`published`: carried by the task-started of its first
    delivery), else when it was sent (`stamp`: the event's timestamp, None when it has none usable), else (its
    task-sent not seen here, or a retry the broker held back on purpose) when a worker received it; a task with an
    ETA or countdown waits on purpose and is not measured."""
    if kind == "started":
        waiting_since = published if published is not None else waiting_since
        if waiting_since is not None and stamp is not None:
            return None, max(0.0, stamp - waiting_since)  # clock skew: 0
        return None, None
    if kind == "received":
        if event.get("eta"):
            return None, None
        return (stamp if waiting_since is None else waiting_since), None
    deliberate = event.get("eta") or event.get("retries")  # task-sent
    return (None if deliberate else stamp), None


def worker_of(hostname: str) -> str:
    """`celery@billing-worker-5d8f-x2` → the pod name `billing-worker-5d8f-x2`."""
    return hostname.rpartition("@")[2] or hostname


# task-retried carries the Retry that wraps the failure: `Retry(Retry(...), KeyError('sku'), 0)`,
# or as text `Retry in 0s: KeyError('sku')`; the label is the wrapped exception's class.
_RETRY_WRAPPER = re.compile(r"^Retry(?:\(Retry\(\.\.\.\),| (?:in|at) [^:]*:)\s*([A-Za-z_][\w.]*)")


def exception_class(text: str) -> str:
    """Celery sends `repr(exc)`, e.g. `KeyError('sku')` or `module.Error: message`."""
    wrapped = _RETRY_WRAPPER.match(text)
    head = wrapped.group(1) if wrapped else text.split("(", 1)[0].split(":", 1)[0].strip()
    return head.rpartition(".")[2] or "Exception"


def _is_label(value: object) -> TypeGuard[str]:
    """A non-empty string short enough to be a label value (task names, hostnames, uuids)."""
    return isinstance(value, str) and 0 < len(value) <= MAX_LABEL_CHARS


def _is_duration(value: object) -> TypeGuard[float]:
    """Seconds as Celery reports them: a non-negative number up to MAX_SECONDS (NaN would poison a sum for good, and
    an integer beyond float64 raises OverflowError where it is converted)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_SECONDS


def _text(value: object) -> str:
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(value: str) -> str:
    """`value` itself when UTF-8 can carry it, else a copy with U+FFFD for each lone surrogate (valid in JSON)."""
    return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value


# A top-level `"key": "short string"` pair of an event's JSON text. Inside a JSON string every quote is
# escaped, so a traceback cannot fake one.
_SHORT_FIELD = re.compile(rb'"(type|hostname|uuid|name|exception)"\s*:\s*("(?:[^"\\]|\\.){0,%d}")' % MAX_LABEL_CHARS)


def fields_of_oversized(head: bytes, tail: bytes) -> dict[str, str]:
    """The short string fields found in the first and last bytes of an event too large to decode."""
    fields: dict[str, str] = {}
    for part in (head, tail):
        for match in _SHORT_FIELD.finditer(part):
            try:
                value = json.loads(match.group(2))
            except ValueError:
                continue
            fields.setdefault(match.group(1).decode(), value)
    return fields


@dataclasses.dataclass
class LoadTotals:
    """What the workers' tasks' events said since `since` (wall clock; inf: nothing is counted): the arrivals, starts,
    runtimes and waits a wait target is judged by. Kept apart from the series, which go with their pods and bounds;
    only events stamped since `since` count (those read again after a reconnect were sent before it)."""

    waits: list[int]  # the measured waits per celery_task_queue_wait_time bucket (not cumulative)
    since: float = math.inf
    sent: int = 0  # task-sent events
    started: int = 0  # task-started events
    runtime_seconds: float = 0.0  # the runtimes of the tasks that succeeded, summed
    runtimes: int = 0  # how many succeeded


class Histogram:
    """Per-bucket counts (made cumulative by the renderer) and sums, by series."""

    def __init__(self, upper_bounds: tuple[float, ...]) -> None:
        self.bounds = upper_bounds
        self.counts: dict[HistogramKey, list[int]] = {}
        self.sums: dict[HistogramKey, float] = {}

    def observe(self, key: HistogramKey, value: float) -> bool:
        """True when the series is new."""
        counts = self.counts.get(key)
        new = counts is None
        if counts is None:
            counts = self.counts[key] = [0] * (len(self.bounds) + 1)
            self.sums[key] = 0.0
        counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sums[key] += value
        return new

    def remove(self, key: HistogramKey) -> None:
        self.counts.pop(key, None)
        self.sums.pop(key, None)

    def clear(self) -> None:
        self.counts.clear()
        self.sums.clear()


V = TypeVar("V")


class _Exported(Generic[V]):
    """A value of the service's metrics set off the event path (by the keeper or the events connection): a change
    counts in `changes`, the renderer's cue to render the service's block again."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._attribute = f"_{name}"

    @overload
    def __get__(self, instance: None, owner: type) -> _Exported[V]: ...
    @overload
    def __get__(self, instance: ServiceMetrics, owner: type) -> V: ...
    def __get__(self, instance: ServiceMetrics | None, owner: type) -> _Exported[V] | V:
        if instance is None:
            return self
        found: V = getattr(instance, self._attribute)
        return found

    def __set__(self, instance: ServiceMetrics, value: V) -> None:
        if value != getattr(instance, self._attribute):
            setattr(instance, self._attribute, value)
            instance.changes += 1


class ServiceMetrics:
    # Set off the event path; each change counts in `changes`.
    queue_length: _Exported[dict[tuple[str, str], int]] = _Exported()  # (queue, role) → messages
    queue_consumers: _Exported[dict[str, int]] = _Exported()
    replicas: _Exported[int | None] = _Exported()  # the workers' pods running (None: unknown)
    desired_replicas: _Exported[int | None] = _Exported()
    estimated_wait: _Exported[float | None] = _Exported()  # the wait target's estimate (None: no estimate)
    stuck_workers: _Exported[int | None] = _Exported()  # None: not judged
    replacement_paused: _Exported[bool | None] = _Exported()  # replacing stuck workers paused (a loop); None: unjudged
    broker_alarms: _Exported[int | None] = _Exported()  # resource alarms of the service's broker; None: not seen
    consumer_connected: _Exported[bool] = _Exported()  # set by the events connection: is its consumer live?

    def __init__(
        self,
        namespace: str,
        service: str,
        runtime_buckets: tuple[float, ...] = RUNTIME_BUCKETS,
        queue_wait_buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS,
        *,
        settings: SeriesSettings = DEFAULT_SETTINGS,
        budget: TaskBudget | None = None,
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.settings = settings
        self.counters: dict[CounterKey, int] = {}
        self.runtime = Histogram(runtime_buckets)
        self.queue_wait = Histogram(queue_wait_buckets)
        self.load = LoadTotals([0] * (len(queue_wait_buckets) + 1))
        self.worker_up: dict[str, int] = {}
        self.worker_active: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}  # every worker admitted (bounds.py), when it was last heard from
        # When each worker sent its last heartbeat (worker-online or worker-heartbeat); a worker run with
        # --without-heartbeat never does: its silence tells nothing.
        self.last_heartbeat: dict[str, float] = {}
        self.first_heard: dict[str, float] = {}  # when each worker was first heard from (by this operator)
        # The most tasks each worker runs at once, as its last worker-online or worker-heartbeat said (our runtime's).
        self.worker_slots: dict[str, int] = {}
        self.events_consumed = 0
        self.malformed = 0
        self.dropped = 0  # well-formed events of no interest (types we do not count)
        self.tasks_forgotten = 0  # tasks in flight forgotten for want of memory (their later events: "unknown")
        self.refused_values: dict[str, int] = {}  # field (REFUSED_FIELDS) → values replaced or left out
        self.overflows: dict[str, Overflow] = {}  # label → what its bound refused
        # The live pods of the service (a view of the operator's index), read when a hostname is new.
        self.live_pods: Callable[[], Iterable[str]] | None = None
        self.changes = 0  # counts changes made off the event path (the event path counts events)
        self.task_changes = 0  # counts changes of the task series (every task event, every removal)
        self._handler_queues: dict[str, str] = {}
        self._handler_queue_names: frozenset[str] = frozenset()
        self._queue_length: dict[tuple[str, str], int] = {}  # (queue, role) → messages
        self._queue_consumers: dict[str, int] = {}
        self._replicas: int | None = None  # the workers' pods running, and their desired number (None: unknown)
        self._desired_replicas: int | None = None
        self._estimated_wait: float | None = None
        self._stuck_workers: int | None = None  # None: not judged
        self._replacement_paused: bool | None = None
        self._broker_alarms: int | None = None  # resource alarms of the service's broker; None: not seen
        self.running = RunningTasks()  # what each worker runs now: its pod's deletion cost
        self.reruns = Reruns()  # tasks run again, and why
        self.runtimes = RuntimeWindow()  # how long its tasks ran lately: what a worker's shutdown must wait for
        self.rerun_counts: dict[tuple[str, Cause], int] = {}  # (task name, bounded; cause) → re-runs
        self.ack_timeout_seconds: float | None = None  # the broker's delivery-acknowledgement timeout, when known
        self._consumer_connected = False
        self._names: set[str] = set()  # task names admitted (the handlers' are always)
        self._exceptions: dict[str, set[str]] = {}  # task → exception classes admitted
        self._queues: set[str] = set()  # queue names admitted for tasks of no handler
        self._outside: set[str] = set()  # workers admitted that are no live pod
        self._pods_seen: frozenset[str] = frozenset()
        self._pods_read_at = -math.inf
        self._series_of: dict[str, set[tuple[str, Any]]] = collections.defaultdict(set)  # per-pod series only
        self._tasks: collections.OrderedDict[str, TaskMemory] = collections.OrderedDict()
        self._tombstones: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._budget = budget if budget is not None else TaskBudget()
        self._budget.join(self)

    # --- what the keeper and the events connection set ------------------------------------

    @property
    def version(self) -> tuple[int, int, int]:
        """Changes whenever anything exported changes (every message counts as consumed or malformed)."""
        return self.events_consumed, self.malformed, self.changes

    def configure(self, settings: SeriesSettings) -> None:
        """New settings start the task series afresh (series of another shape, or bounds to apply from now)."""
        if settings == self.settings:
            return
        self.settings = settings
        self.counters.clear()
        self.runtime.clear()
        self.queue_wait.clear()
        self._series_of.clear()
        self._names.clear()
        self._exceptions.clear()
        self._queues.clear()
        self.overflows.clear()
        self.rerun_counts.clear()
        self.changes += 1
        self.task_changes += 1

    @property
    def handler_queues(self) -> dict[str, str]:
        """Task name → the handler queue it is consumed from (set from the service's spec)."""
        return self._handler_queues

    @handler_queues.setter
    def handler_queues(self, queues: dict[str, str]) -> None:
        if queues != self._handler_queues:
            self._handler_queues = dict(queues)
            self._handler_queue_names = frozenset(queues.values())
            self.changes += 1

    # --- the hot path -----------------------------------------------------------------------

    def ingest_message(self, body: bytes | str, now: float) -> None:
        """One AMQP message of the event exchange: an event, or a list of them (batched).

        A message that is not entirely made of events counts once as malformed, whatever its size or
        shape; its well-formed events are still counted.
        """
        if len(body) > MAX_EVENT_BYTES:
            self.count_malformed()
            return
        try:
            decoded = _decode_json(body.decode() if isinstance(body, bytes) else body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            self.count_malformed()
            return
        if isinstance(decoded, list):
            valid = [self.ingest(event, now) for event in decoded]
            if not all(valid):
                self.count_malformed()
        elif not self.ingest(decoded, now):
            self.count_malformed()

    def ingest_oversized(self, head: bytes, tail: bytes, size: int, now: float) -> None:
        """A body over MAX_EVENT_BYTES, of which only the head and tail were kept.

        A legitimate task-failed or task-retried with a long traceback is this large: it is counted from
        the short top-level fields found in the kept parts; anything else is malformed.
        """
        fields = fields_of_oversized(head, tail)
        if fields.get("type") not in OVERSIZED_KINDS or not self.ingest(fields, now):
            self.count_malformed()

    def count_malformed(self) -> None:
        """A message that is no event (also called for bodies too large to be read at all)."""
        self.malformed += 1

    def ingest(self, event: Any, now: float) -> bool:
        """Account one decoded event; False (and nothing changed) when it is not a well-formed event."""
        if not isinstance(event, dict):
            return False
        kind, hostname = event.get("type"), event.get("hostname")
        # _is_label, inlined: this runs for every event
        if type(kind) is not str or type(hostname) is not str:
            return False
        if not (0 < len(kind) <= MAX_LABEL_CHARS and 0 < len(hostname) <= MAX_LABEL_CHARS):
            return False
        if kind.startswith("task-"):
            uuid, name = event.get("uuid"), event.get("name")
            # _is_label for the optional uuid and name, inlined
            if uuid is not None and not (type(uuid) is str and 0 < len(uuid) <= MAX_LABEL_CHARS):
                return False
            if name is not None and not (type(name) is str and 0 < len(name) <= MAX_LABEL_CHARS):
                return False
            # isascii() is O(1): only other text is searched for what UTF-8 cannot carry
            if name is not None and not name.isascii():
                name = self._label("name", name)
            if uuid is not None and not uuid.isascii():
                uuid = _valid_text(uuid)  # shown in messages (a task's first characters), never a label
            if not hostname.isascii():
                hostname = self._label("hostname", hostname)
            self.events_consumed += 1
            self._task_event(kind[5:], event, hostname, uuid, name, now=now)
        elif kind.startswith("worker-"):
            if not hostname.isascii():
                hostname = self._label("hostname", hostname)
            self.events_consumed += 1
            self._worker_event(kind[7:], event, worker_of(hostname), now)
        else:
            self.events_consumed += 1
            self.dropped += 1
        return True

    def _task_event(
        self, kind: str, event: dict[str, Any], hostname: str, uuid: str | None, name: str | None, *, now: float
    ) -> None:
        if kind not in TASK_EVENT_KINDS:
            self.dropped += 1
            return
        self.task_changes += 1
        per_pod = self.settings.per_pod
        if kind == "sent":
            worker = GENERIC_WORKER if per_pod else SERVICE_WIDE
        else:
            worker = worker_of(hostname)
            tombstoned = self._tombstoned(worker, now)
            if tombstoned:
                if per_pod:
                    return  # a late event of a deleted pod: its series stay gone
            elif worker in self.last_heard:
                self.last_heard[worker] = now
            elif not self._admit_worker(worker, now):
                worker = OVERFLOW
            if worker != OVERFLOW and not tombstoned:
                self._track_running(kind, event, uuid, worker, now)
            if not per_pod:
                worker = SERVICE_WIDE
        tasks = self._tasks
        known = tasks.get(uuid) if uuid else None
        if known is not None and (not name or name == known[0]):
            task, queue, waiting_since = known
        else:
            task = name or UNKNOWN_TASK
            queue, waiting_since, known = self._queue_of(task, kind, event), None, None
        if kind in _WAIT_KINDS:
            waiting_since, waited = self._wait_of(kind, event, queue, waiting_since)
        else:
            waited = None
        exception = self._exception(event) if kind in WITH_EXCEPTION else ""
        key = (kind, task, worker, queue, exception)
        counters = self.counters
        if key in counters:
            counters[key] += 1
        else:
            key = self._new_counter(key)
        if waited is not None:
            self._observe_wait(key, waited)
        elif kind == "succeeded":
            self._succeeded(key, uuid, event.get("runtime"), now)
        if uuid:
            if kind in ("succeeded", "failed", "rejected", "revoked"):
                if tasks.pop(uuid, None) is not None:  # done: no later event of it needs the name
                    self._budget.total -= 1
            elif known is None or waiting_since is not known[2]:
                remembered = len(tasks)
                tasks[uuid] = (task, queue, waiting_since)
                if len(tasks) > remembered:
                    self._remembered_one_more()

    def _timestamp(self, event: dict[str, Any]) -> float | None:
        """The event's timestamp when it is one (one that is not is counted)."""
        stamp = event.get("timestamp")
        if _is_duration(stamp):
            return float(stamp)
        if stamp is not None:
            self._refused("timestamp")
        return None

    def _exception(self, event: dict[str, Any]) -> str:
        exception = exception_class(_text(event.get("exception")))
        return exception if exception.isascii() else self._label("exception", exception)

    def _track_running(self, kind: str, event: dict[str, Any], uuid: str | None, worker: str, now: float) -> None:
        if not uuid:
            return
        if kind == "started":
            rerun = self.reruns.started(
                uuid, self._task_name(uuid), self.running.started_at(uuid), now, ack_timeout=self.ack_timeout_seconds
            )
            if rerun is not None:
                key = (self._admitted_name(rerun.task or UNKNOWN_TASK), rerun.cause)
                self.rerun_counts[key] = self.rerun_counts.get(key, 0) + 1
            self.running.started(uuid, worker, now)
        elif kind in ENDED_KINDS:
            started_at = self.running.started_at(uuid)
            self.running.ended(uuid, worker)
            lost = kind == "failed" and _text(event.get("exception")).startswith(WORKER_LOST)
            if lost and started_at is not None:  # its process died: the broker delivers it again
                self.reruns.cut(
                    uuid, "worker_lost", self._task_name(uuid), started_at, now, ack_timeout=self.ack_timeout_seconds
                )

    def _task_name(self, uuid: str) -> str | None:
        known = self._tasks.get(uuid)
        return known[0] if known is not None and known[0] != UNKNOWN_TASK else None

    def _cut_runs(self, worker: str, cause: Cause, now: float, *, going: bool = False) -> None:
        """The worker's runs end without their tasks' end: run again when delivered again. `going`: it shuts down,
        and its runs go on until its process ends."""
        for task in self.running.tasks(worker):
            self.reruns.cut(
                task.uuid,
                cause,
                self._task_name(task.uuid),
                task.started_at,
                now,
                ack_timeout=self.ack_timeout_seconds,
                going=worker if going else None,
            )
        self.running.forget(worker)

    def _wait_of(
        self, kind: str, event: dict[str, Any], queue: str, waiting_since: float | None
    ) -> tuple[float | None, float | None]:
        """`_waiting` of a task-sent, -received or -started event; the sent and started counted as load."""
        stamp = self._timestamp(event)
        if stamp is not None and stamp >= self.load.since and kind != "received" and self._loads(queue):
            if kind == "sent":
                self.load.sent += 1
            else:
                self.load.started += 1
        published = event.get(naming.PUBLISHED_AT_FIELD) if kind == "started" else None
        if published is not None and not _is_duration(published):
            self._refused(naming.PUBLISHED_AT_FIELD)
            published = None
        return _waiting(kind, stamp, event, waiting_since, published)

    def _observe_wait(self, key: CounterKey, waited: float) -> None:
        self._observe(self.queue_wait, key, waited)
        if self.load.since < math.inf and self._loads(key[3]):
            self.load.waits[bisect.bisect_left(self.queue_wait.bounds, waited)] += 1

    def _loads(self, queue: str) -> bool:
        """Whether a task of `queue` is the workers' load: a handler's (any task's when the service names none)."""
        return not self._handler_queue_names or queue in self._handler_queue_names

    def running_tasks(self, worker: str) -> list[RunningTask]:
        """The tasks a worker runs that were seen starting, oldest first, named when their name is remembered."""
        return [dataclasses.replace(task, name=self._task_name(task.uuid)) for task in self.running.tasks(worker)]

    def _succeeded(self, key: CounterKey, uuid: str | None, runtime: object, now: float) -> None:
        """A run that ended well, `runtime` seconds long by the worker's measure (a runtime that is no duration is
        counted and left out)."""
        if not _is_duration(runtime):
            if runtime is not None:
                self._refused("runtime")
            return
        seconds = float(runtime)
        self._observe(self.runtime, key, seconds)
        self.runtimes.observe(seconds, now)
        if self.load.since < math.inf and self._loads(key[3]):
            self.load.runtime_seconds += seconds
            self.load.runtimes += 1
        if uuid:
            self.reruns.succeeded(uuid, key[1], seconds, self.ack_timeout_seconds)

    def _observe(self, histogram: Histogram, key: CounterKey, value: float) -> None:
        series = (key[1], key[2], key[3])
        if histogram.observe(series, value) and key[2]:
            self._series_of[key[2]].add(("runtime" if histogram is self.runtime else "queue_wait", series))

    def _queue_of(self, task: str, kind: str, event: dict[str, Any]) -> str:
        """A handler's queue is known; task-sent's `queue` is Celery's router's guess (its default queue for a
        message published to the events exchange), so it counts only for the tasks of no handler."""
        queue = self._handler_queues.get(task)
        if queue is None:
            sent_to = event.get("queue") if kind == "sent" else None
            queue = sent_to if _is_label(sent_to) else DEFAULT_QUEUE
            if not queue.isascii():
                queue = self._label("queue_name", queue)
        return queue

    def _new_counter(self, key: CounterKey) -> CounterKey:
        """A series not counted yet: its label values bounded first (the key counted is returned)."""
        kind, task, worker, queue, exception = key
        task = self._admitted_name(task)
        queue = self._admitted_queue(queue)
        if exception:
            exception = self._admitted_exception(task, exception)
        key = (kind, task, worker, queue, exception)
        counters = self.counters
        if key in counters:
            counters[key] += 1
            return key
        counters[key] = 1
        series = self._series_of[worker] if worker else None
        if series is not None:
            series.add(("counter", key))
        if kind == "sent":
            return key
        for other in WORKER_KINDS:
            zero = (other, task, worker, queue, "")
            if zero not in counters:
                counters[zero] = 0
                if series is not None:
                    series.add(("counter", zero))
        return key

    # --- bounds -----------------------------------------------------------------------------

    def _refused(self, field: str) -> None:
        self.refused_values[field] = self.refused_values.get(field, 0) + 1

    def _label(self, field: str, value: str) -> str:
        """`value` as a label value can carry it: text that is no valid UTF-8 (a lone surrogate) written with U+FFFD
        in its place, and counted."""
        valid = _valid_text(value)
        if valid is not value:
            self._refused(field)
        return valid

    def _overflowed(self, label: str, value: str) -> None:
        overflow = self.overflows.get(label)
        if overflow is None:
            overflow = self.overflows[label] = Overflow()
        overflow.add(value)

    def _admitted_name(self, task: str) -> str:
        if task in self._names or task in self._handler_queues or task in (UNKNOWN_TASK, OVERFLOW):
            return task
        if len(self._names) < self.settings.max_task_names:
            self._names.add(task)
            return task
        self._overflowed("name", task)
        return OVERFLOW

    def _admitted_queue(self, queue: str) -> str:
        if queue in self._queues or queue in self._handler_queue_names or queue in (DEFAULT_QUEUE, OVERFLOW):
            return queue
        if len(self._queues) < bounds.MAX_QUEUES:
            self._queues.add(queue)
            return queue
        self._overflowed("queue_name", queue)
        return OVERFLOW

    def _admitted_exception(self, task: str, exception: str) -> str:
        admitted = self._exceptions.get(task)
        if admitted is None:
            admitted = self._exceptions[task] = set()
        if exception in admitted or exception == OVERFLOW:
            return exception
        if len(admitted) < bounds.MAX_EXCEPTIONS_PER_TASK:
            admitted.add(exception)
            return exception
        self._overflowed("exception", f"{task}\0{exception}")
        return OVERFLOW

    def _admit_worker(self, worker: str, now: float) -> bool:
        """A hostname not heard from yet: a live pod of the service, or one of a few workers outside Kubernetes."""
        if worker not in (GENERIC_WORKER, OVERFLOW):
            if self._is_live_pod(worker, now):
                self.last_heard[worker] = self.first_heard[worker] = now
                return True
            if len(self._outside) < bounds.MAX_WORKERS_OUTSIDE_PODS:
                self._outside.add(worker)
                self.last_heard[worker] = self.first_heard[worker] = now
                return True
        self._overflowed("hostname", worker)
        return False

    def _is_live_pod(self, worker: str, now: float) -> bool:
        if worker in self._pods_seen:
            return True
        return self._read_pods(now) and worker in self._pods_seen

    def _read_pods(self, now: float) -> bool:
        """The live pods read again (at most once per PODS_READ_SECONDS); False when they were not."""
        if self.live_pods is None or now - self._pods_read_at < PODS_READ_SECONDS:
            return False
        self._pods_seen = frozenset(self.live_pods())
        self._pods_read_at = now
        self._outside -= self._pods_seen  # workers taken for outsiders at first were pods not watched yet
        return True

    def _tombstoned(self, worker: str, now: float) -> bool:
        """A deleted pod's name: its late events are ignored — until a live pod of that name is listed after the
        deletion (a StatefulSet's pod recreated under its name is a new worker)."""
        since = self._tombstones.get(worker)
        if since is None:
            return False
        listed = self._pods_read_at > since and worker in self._pods_seen
        if listed or (self._read_pods(now) and worker in self._pods_seen):
            del self._tombstones[worker]
            return False
        return True

    def overflowing(self) -> dict[str, tuple[int, int]]:
        """Label → (distinct values refused, about; values kept), for the labels past their bound."""
        kept = {
            "name": len(self._names),
            "exception": sum(len(classes) for classes in self._exceptions.values()),
            "queue_name": len(self._queues),
            "hostname": len(self.last_heard),
        }
        return {label: (overflow.refused.estimate(), kept[label]) for label, overflow in self.overflows.items()}

    # --- the memory of tasks in flight ------------------------------------------------------

    def _remembered_one_more(self) -> None:
        budget = self._budget
        budget.total += 1
        if len(self._tasks) > bounds.TASKS_KEPT:
            self.forget_oldest_tasks(1)
        elif budget.total > budget.limit:
            budget.reclaim()

    def tasks_remembered(self) -> int:
        return len(self._tasks)

    def forget_oldest_tasks(self, count: int) -> None:
        tasks = self._tasks
        count = min(count, len(tasks))
        for _ in range(count):
            tasks.popitem(last=False)
        self._budget.total -= count
        self.tasks_forgotten += count
        self.changes += 1

    def close(self) -> None:
        """The service is gone: its share of the operator's task memory is given back."""
        self._budget.leave(self)
        self._tasks.clear()

    def _worker_event(self, kind: str, event: dict[str, Any], worker: str, now: float) -> None:
        if kind not in ("online", "heartbeat", "offline"):
            self.dropped += 1
            return
        if self._tombstoned(worker, now):
            return
        if worker in self.last_heard:
            self.last_heard[worker] = now
        elif not self._admit_worker(worker, now):
            return
        if kind == "offline":
            self.worker_up[worker] = 0
            self.worker_active[worker] = 0
            # Its warm shutdown began: what it still runs goes on until it ends or the kubelet kills the process, then
            # is handed back to the broker.
            self._cut_runs(worker, "pod_stopped", now, going=True)
            return
        self.worker_up[worker] = 1
        self.last_heartbeat[worker] = now
        if kind == "online":
            self._cut_runs(worker, "worker_lost", now)  # (re)started: its predecessor's runs were cut
        active = event.get("active")
        if isinstance(active, int) and not isinstance(active, bool) and 0 <= active <= MAX_ACTIVE:
            self.worker_active[worker] = active
            self.running.active(worker, active, now)  # how many it runs: those not seen starting are the rest
        elif active is not None:
            self._refused("active")
        slots = event.get(naming.CONCURRENCY_FIELD)
        if slots is not None:
            if type(slots) is int and 0 < slots <= bounds.MAX_WORKER_SLOTS:
                self.worker_slots[worker] = slots
            else:
                self._refused(naming.CONCURRENCY_FIELD)

    def slots_per_pod(self) -> int | None:
        """How many tasks one pod runs at once, as the service's live pods say (a worker gone offline is shutting
        down; a hostname of no pod is no pod of the workload): the value most of them reported, the lower of a tie
        (too few slots assumed costs a pod, too many a missed target); None when none reported one."""
        up, pods = self.worker_up, self._pods_seen
        reported = collections.Counter(
            slots for worker, slots in self.worker_slots.items() if up.get(worker) == 1 and worker in pods
        )
        if not reported:
            return None
        return max(reported, key=lambda slots: (reported[slots], -slots))

    # --- garbage collection -----------------------------------------------------------------

    def forget_worker(self, worker: str, now: float) -> None:
        """Every series of the worker, at once; its late events are ignored for a while (per-pod task series
        included; the service's task series still count the tasks it ran)."""
        for series, key in self._series_of.pop(worker, ()):
            self.task_changes += 1
            if series == "counter":
                self.counters.pop(key, None)
            elif series == "runtime":
                self.runtime.remove(key)
            else:
                self.queue_wait.remove(key)
        for per_worker in (
            self.worker_up,
            self.worker_active,
            self.worker_slots,
            self.last_heard,
            self.last_heartbeat,
            self.first_heard,
        ):
            per_worker.pop(worker, None)
        self.reruns.ended(worker, now)
        self._cut_runs(worker, "pod_stopped", now)
        self._outside.discard(worker)
        self._tombstones[worker] = now
        while len(self._tombstones) > TOMBSTONES_KEPT:
            self._tombstones.popitem(last=False)
        self.changes += 1

    def sweep(self, live_pods: Iterable[str], now: float, silence_seconds: float) -> list[str]:
        """Forget workers that are no live pod and were not heard from within `silence_seconds`."""
        live = set(live_pods) | {GENERIC_WORKER, OVERFLOW}
        gone = [
            worker
            for worker in list(self._series_of) + list(self.last_heard)
            if worker not in live and now - self.last_heard.get(worker, 0.0) > silence_seconds
        ]
        for worker in dict.fromkeys(gone):
            self.forget_worker(worker, now)
        while self._tombstones and now - next(iter(self._tombstones.values())) > TOMBSTONE_SECONDS:
            self._tombstones.popitem(last=False)
        return list(dict.fromkeys(gone))
