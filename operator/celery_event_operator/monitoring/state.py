"""Metrics state of one service, fed by its Celery events (pure, plain dicts we own).

Series are keyed by label tuples; every series of a worker is indexed by the worker, so a pod's
series go at once (no scan of the others). One thread writes a service's state (its consumer):
there is no lock on the event path; the exporter copies dicts before reading them (`dict.copy()`
is atomic under the GIL).
"""

from __future__ import annotations

import bisect
import collections
import json
import math
import re
from collections.abc import Iterable
from typing import Any, TypeGuard

from celery_event_operator.monitoring.running import RunningTasks

# Events whose counters are exported as celery_task_<kind>_total.
TASK_EVENT_KINDS = ("sent", "received", "started", "succeeded", "failed", "rejected", "revoked", "retried")
WITH_EXCEPTION = frozenset({"failed", "retried"})
# The kinds that end a task's run on its worker (a retried task runs again as a new task-started).
ENDED_KINDS = frozenset({"succeeded", "failed", "rejected", "revoked", "retried"})
# The kinds a worker sends: a task's first series of a worker brings the others at 0, as celery-exporter
# does, so `failed / (failed + succeeded)` has both sides for a task that never succeeded.
WORKER_KINDS = TASK_EVENT_KINDS[1:]
# Seconds; task runtimes from a few milliseconds to several minutes.
RUNTIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Seconds; celery-exporter's: healthy queues sit near zero, a backlog grows to minutes.
QUEUE_WAIT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
GENERIC_WORKER = "generic"  # task-sent comes from producers, which are no workers
DEFAULT_QUEUE = "celery"  # Celery's task_default_queue: a task of no handler and of no task-sent seen
MAX_EVENT_BYTES = 64 * 1024
MAX_LABEL_CHARS = 512  # longer task names or hostnames are no Celery's: such an event is malformed
# Events that are legitimately larger than MAX_EVENT_BYTES (their traceback), counted from their short fields.
OVERSIZED_KINDS = frozenset({"task-failed", "task-retried"})
TASKS_KEPT = 50_000  # task uuid → name, queue and wait start, for events that do not carry them
TOMBSTONES_KEPT = 10_000
TOMBSTONE_SECONDS = 600.0

CounterKey = tuple[str, str, str, str, str]  # kind, task, worker, queue, exception ("" when none)
HistogramKey = tuple[str, str, str]  # task, worker, queue
TaskMemory = tuple[str, str, float | None]  # name, queue, when its wait for a worker began (None: not measured)


# Events are UTF-8 JSON (Celery's): decoding the bytes ourselves skips json.loads' encoding detection,
# a measurable share of the per-event cost.
_decode_json = json.JSONDecoder().decode


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
    """Seconds as Celery reports them: a finite, non-negative number (NaN would poison a sum for good)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def _text(value: object) -> str:
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""


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


class Histogram:
    """Per-bucket counts (made cumulative by the collector) and sums, by series."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
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


class ServiceMetrics:
    def __init__(
        self,
        namespace: str,
        service: str,
        runtime_buckets: tuple[float, ...] = RUNTIME_BUCKETS,
        queue_wait_buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS,
    ) -> None:
        self.namespace = namespace
        self.service = service
        self.counters: dict[CounterKey, int] = {}
        self.runtime = Histogram(runtime_buckets)
        self.queue_wait = Histogram(queue_wait_buckets)
        # task name → the handler queue it is consumed from (set from the service's spec)
        self.handler_queues: dict[str, str] = {}
        self.worker_up: dict[str, int] = {}
        self.worker_active: dict[str, int] = {}
        self.last_heard: dict[str, float] = {}
        self.queue_length: dict[tuple[str, str], int] = {}  # (queue, role) → messages
        self.queue_consumers: dict[str, int] = {}
        self.replicas: int | None = None  # the workers' pods running, and their desired number (None: unknown)
        self.desired_replicas: int | None = None
        self.stuck_workers: int | None = None  # None: not judged
        self.broker_alarms: int | None = None  # resource alarms of the service's broker; None: not seen
        self.events_consumed = 0
        self.consumer_connected = False  # set by the events connection: is this service's consumer live?
        self.malformed = 0
        self.dropped = 0  # well-formed events of no interest (types we do not count)
        self._series_of: dict[str, set[tuple[str, Any]]] = collections.defaultdict(set)
        self.running = RunningTasks()  # what each worker runs now: its pod's deletion cost
        self._tasks: collections.OrderedDict[str, TaskMemory] = collections.OrderedDict()
        self._tombstones: collections.OrderedDict[str, float] = collections.OrderedDict()

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
            self.events_consumed += 1
            self._task_event(kind[5:], event, hostname, now)
        elif kind.startswith("worker-"):
            self.events_consumed += 1
            self._worker_event(kind[7:], event, worker_of(hostname), now)
        else:
            self.events_consumed += 1
            self.dropped += 1
        return True

    def _task_event(self, kind: str, event: dict[str, Any], hostname: str, now: float) -> None:
        if kind not in TASK_EVENT_KINDS:
            self.dropped += 1
            return
        worker = GENERIC_WORKER if kind == "sent" else worker_of(hostname)
        if worker in self._tombstones:
            return  # a late event of a deleted pod: its series stay gone
        uuid = event.get("uuid")
        name = event.get("name")
        known = self._tasks.get(uuid) if uuid else None
        if known is not None and (not name or name == known[0]):
            task, queue, waiting_since = known
        else:
            task = name or "unknown"
            queue, waiting_since, known = self._queue_of(task, kind, event), None, None
        # The wait for a worker starts when the task was sent, else (its task-sent not seen here, or a retry the
        # broker held back on purpose) when a worker received it; a task with an ETA or countdown waits on purpose.
        if kind == "started":
            if waiting_since is not None:
                stamp = event.get("timestamp")
                if _is_duration(stamp) and self.queue_wait.observe(
                    (task, worker, queue), max(0.0, stamp - waiting_since)
                ):
                    self._series_of[worker].add(("queue_wait", (task, worker, queue)))  # clock skew: 0 above
                waiting_since = None
        elif kind == "received":
            if event.get("eta"):
                waiting_since = None
            elif waiting_since is None:
                stamp = event.get("timestamp")
                waiting_since = float(stamp) if _is_duration(stamp) else None
        elif kind == "sent":
            stamp = event.get("timestamp")
            deliberate = event.get("eta") or event.get("retries")
            waiting_since = float(stamp) if not deliberate and _is_duration(stamp) else None
        if uuid and (known is None or waiting_since is not known[2]):
            tasks = self._tasks
            tasks[uuid] = (task, queue, waiting_since)
            if len(tasks) > TASKS_KEPT:
                tasks.popitem(last=False)
        if worker != GENERIC_WORKER:
            self.last_heard[worker] = now
        exception = exception_class(_text(event.get("exception"))) if kind in WITH_EXCEPTION else ""
        key = (kind, task, worker, queue, exception)
        counters = self.counters
        if key in counters:
            counters[key] += 1
        else:
            self._new_counter(key)
        if kind == "succeeded":
            self._observe_runtime((task, worker, queue), event.get("runtime"))
        if uuid and kind in ("succeeded", "failed", "rejected", "revoked"):
            self._tasks.pop(uuid, None)  # done: no later event of it needs the name
        if uuid and worker != GENERIC_WORKER:
            self._track_running(kind, uuid, worker, now)

    def _track_running(self, kind: str, uuid: str, worker: str, now: float) -> None:
        if kind == "started":
            self.running.started(uuid, worker, now)
        elif kind in ENDED_KINDS:
            self.running.ended(uuid)

    def _queue_of(self, task: str, kind: str, event: dict[str, Any]) -> str:
        """A handler's queue is known; task-sent's `queue` is Celery's router's guess (its default queue for a
        message published to the events exchange), so it counts only for the tasks of no handler."""
        queue = self.handler_queues.get(task)
        if queue is None:
            sent_to = event.get("queue") if kind == "sent" else None
            queue = sent_to if _is_label(sent_to) else DEFAULT_QUEUE
        return queue

    def _observe_runtime(self, key: HistogramKey, runtime: object) -> None:
        if _is_duration(runtime) and self.runtime.observe(key, float(runtime)):
            self._series_of[key[1]].add(("runtime", key))

    def _new_counter(self, key: CounterKey) -> None:
        kind, task, worker, queue, _ = key
        series = self._series_of[worker]
        self.counters[key] = 1
        series.add(("counter", key))
        if kind == "sent":
            return
        for other in WORKER_KINDS:
            zero = (other, task, worker, queue, "")
            if zero not in self.counters:
                self.counters[zero] = 0
                series.add(("counter", zero))

    def _worker_event(self, kind: str, event: dict[str, Any], worker: str, now: float) -> None:
        if worker in self._tombstones:
            return
        if kind in ("online", "heartbeat"):
            self.worker_up[worker] = 1
            self.last_heard[worker] = now
            active = event.get("active")
            if isinstance(active, int) and not isinstance(active, bool) and active >= 0:
                self.worker_active[worker] = active
                if active == 0:
                    self.running.forget(worker)
        elif kind == "offline":
            self.worker_up[worker] = 0
            self.worker_active[worker] = 0
            self.last_heard[worker] = now
            self.running.forget(worker)
        else:
            self.dropped += 1

    # --- garbage collection -----------------------------------------------------------------

    def forget_worker(self, worker: str, now: float) -> None:
        """Every series of the worker, at once; its late events are ignored for a while."""
        for series, key in self._series_of.pop(worker, ()):
            if series == "counter":
                self.counters.pop(key, None)
            elif series == "runtime":
                self.runtime.remove(key)
            else:
                self.queue_wait.remove(key)
        for per_worker in (self.worker_up, self.worker_active, self.last_heard):
            per_worker.pop(worker, None)
        self.running.forget(worker)
        self._tombstones[worker] = now
        while len(self._tombstones) > TOMBSTONES_KEPT:
            self._tombstones.popitem(last=False)

    def sweep(self, live_pods: Iterable[str], now: float, silence_seconds: float) -> list[str]:
        """Forget workers that are no live pod and were not heard from within `silence_seconds`."""
        live = set(live_pods) | {GENERIC_WORKER}
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

    def series_count(self) -> int:
        return (
            len(self.counters)
            + len(self.runtime.counts)
            + len(self.queue_wait.counts)
            + len(self.worker_up)
            + len(self.worker_active)
            + len(self.queue_length)
            + len(self.queue_consumers)
        )
