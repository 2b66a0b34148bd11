"""The Prometheus text exposition (format 0.0.4) of the metrics state, rendered service by service (pure).

A service's samples are rendered into one text fragment per family and kept until the service changes (its
`version`); a gzip scrape also keeps each fragment's deflate piece (compressed with a full flush, so pieces
compressed apart join into one deflate stream). A scrape joins the fragments family by family (the format
wants every family in one group) between the families' headers: an unchanged service costs a scrape only
its bytes. Rendering and compressing are generators that yield every few hundred series or KiB, so that the
event loop they run on (which also serves the webhook and the events) is never held for long.

Names and labels of the Celery series are danihodovic/celery-exporter's (plus `namespace` and `service_name`),
so its dashboards and alerts (the celery-mixin) work; the operator's own series are `celery_event_operator_*`.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import struct
import zlib
from collections.abc import Generator, Iterable, Mapping, Sequence
from typing import Any, Literal

from celery_event_operator.core.monitoring.bounds import LABELS
from celery_event_operator.core.monitoring.state import (
    REFUSED_FIELDS,
    TASK_EVENT_KINDS,
    WITH_EXCEPTION,
    Histogram,
    HistogramKey,
    ServiceMetrics,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SLICE_SERIES = 250  # series rendered between two yields
SLICE_BYTES = 256 * 1024  # bytes compressed (or checksummed) between two yields
COMPRESSION_LEVEL = 1  # about 280 MB/s here and a 17-fold smaller text; level 6 is three times slower
Rendering = Generator[None, None, None]


@dataclasses.dataclass(frozen=True)
class Family:
    name: str  # as exposed (a counter's with `_total`)
    type: Literal["counter", "gauge", "histogram"]
    help: str

    @property
    def header(self) -> bytes:
        text = self.help.replace("\\", r"\\").replace("\n", r"\n")
        return f"# HELP {self.name} {text}\n# TYPE {self.name} {self.type}\n".encode()


TASK_COUNTERS = tuple(
    Family(f"celery_task_{kind}_total", "counter", f"Tasks {kind}, from the workers' Celery events.")
    for kind in TASK_EVENT_KINDS
)
RUNTIME = Family("celery_task_runtime", "histogram", "Runtime of succeeded tasks (seconds).")
QUEUE_WAIT = Family(
    "celery_task_queue_wait_time",
    "histogram",
    "Time from a task's sending (else its receipt by a worker) to its start, without ETA or countdown delay (seconds).",
)
WORKER_UP = Family("celery_worker_up", "gauge", "1 while the worker sends heartbeats, 0 after it went offline.")
WORKER_ACTIVE = Family("celery_worker_tasks_active", "gauge", "Tasks the worker is running (its heartbeats).")
QUEUE_LENGTHS = {
    "events": Family("celery_queue_length", "gauge", "Messages waiting in a handler queue (ready + unacknowledged)."),
    "retry": Family(
        "celery_event_operator_retry_queue_length",
        "gauge",
        "Messages waiting in a retry level (ready + unacknowledged).",
    ),
    "archive": Family(
        "celery_event_operator_archive_queue_length", "gauge", "Messages in the archive (ready + unacknowledged)."
    ),
}
CONSUMERS = Family("celery_active_consumer_count", "gauge", "Consumers of a handler queue.")
REPLICAS = Family("celery_event_operator_replicas", "gauge", "The service's worker pods running.")
DESIRED_REPLICAS = Family(
    "celery_event_operator_desired_replicas",
    "gauge",
    "The worker replicas wanted: the autoscaler's or spec.workers.replicas, else the workload's own.",
)
ESTIMATED_WAIT = Family(
    "celery_event_operator_estimated_wait_seconds",
    "gauge",
    "With a wait target: the 95th percentile of the wait of a task published now, as the autoscaler estimated it at "
    "the replicas it decided (+Inf: they cannot keep up); compare with celery_task_queue_wait_time.",
)
STUCK_WORKERS = Family(
    "celery_event_operator_stuck_workers",
    "gauge",
    "Running worker pods that are stuck: they consume nothing while messages wait, stopped heartbeating while they "
    "run no task, or run a task past its limit.",
)
REPLACEMENT_PAUSED = Family(
    "celery_event_operator_stuck_replacement_paused",
    "gauge",
    "1 while the replacing of stuck workers is paused: a replacement was stuck for the same reason (a loop).",
)
BROKER_ALARMS = Family(
    "celery_event_operator_broker_alarms",
    "gauge",
    "Resource alarms (memory, disk) in effect on the service's broker: while above 0 it blocks publishers.",
)
CONSUMER_UP = Family(
    "celery_event_operator_events_consumer_up",
    "gauge",
    "1 while the service's events consumer consumes; 0 while it is not (its series then stand still).",
)
CONSUMED = Family("celery_event_operator_events_consumed_total", "counter", "Celery events the operator consumed.")
MALFORMED = Family(
    "celery_event_operator_events_malformed_total",
    "counter",
    "Messages on the events queue that were no Celery event (skipped).",
)
DROPPED = Family("celery_event_operator_events_dropped_total", "counter", "Celery events of types no metric counts.")
OVERFLOWED = Family(
    "celery_event_operator_label_values_overflowed_total",
    "counter",
    'Task events counted under the label value "__overflow__": their name, exception class, queue or worker was'
    " past the service's bound on that label.",
)
REFUSED_VALUES = Family(
    "celery_event_operator_event_values_refused_total",
    "counter",
    "Values in Celery events that no Celery worker sends, by field: a label value (name, hostname, exception, "
    "queue_name) whose text is no valid UTF-8 is exported with U+FFFD in its place; a number out of range (active, "
    "runtime, timestamp: negative, not a number, beyond 2^32) is left out.",
)
TASK_RERUNS = Family(
    "celery_event_operator_task_reruns_total",
    "counter",
    "Tasks started again after a run that did not end: cause ack_timeout (the broker's delivery-acknowledgement "
    "timeout delivered it again while it ran), pod_stopped (its worker shut down or its pod was deleted while it ran), "
    "worker_lost (its worker process died, restarted or lost its connection).",
)
TASKS_FORGOTTEN = Family(
    "celery_event_operator_tasks_forgotten_total",
    "counter",
    'Tasks in flight forgotten for want of memory (their later events count under the name "unknown").',
)
SERVICE_FAMILIES = (
    *TASK_COUNTERS,
    RUNTIME,
    QUEUE_WAIT,
    WORKER_UP,
    WORKER_ACTIVE,
    *QUEUE_LENGTHS.values(),
    CONSUMERS,
    REPLICAS,
    DESIRED_REPLICAS,
    ESTIMATED_WAIT,
    STUCK_WORKERS,
    REPLACEMENT_PAUSED,
    BROKER_ALARMS,
    CONSUMER_UP,
    CONSUMED,
    MALFORMED,
    DROPPED,
    OVERFLOWED,
    REFUSED_VALUES,
    TASK_RERUNS,
    TASKS_FORGOTTEN,
)
RECONCILES = Family("celery_event_operator_reconciles_total", "counter", "Reconciles of CeleryEventServices.")
STATUS_PASS = Family(
    "celery_event_operator_status_pass_timestamp_seconds",
    "gauge",
    "When the status (queue lengths, replicas) of a CeleryEventService was last refreshed (unix time).",
)
OPERATOR_FAMILIES = (RECONCILES, STATUS_PASS)
FAMILIES = (*SERVICE_FAMILIES, *OPERATOR_FAMILIES)
_INDEX = {family: index for index, family in enumerate(SERVICE_FAMILIES)}
TASK_FAMILIES = len(TASK_COUNTERS) + 2  # the counters and the two histograms come first
_COUNTER_INDEX = {kind: _INDEX[family] for kind, family in zip(TASK_EVENT_KINDS, TASK_COUNTERS, strict=True)}

# gzip (RFC 1952): the header of a member without name or time, the final empty deflate block, the trailer.
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
DEFLATE_END = b"\x03\x00"


def escape(value: str) -> str:
    """A label value as the text format wants it."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def bound_label(bound: float) -> str:
    """A bucket's `le` as prometheus_client writes it (Go's float formatting), so series keep their identity."""
    if math.isinf(bound):
        return "+Inf"
    text = repr(float(bound))
    dot = text.find(".")
    if bound > 0 and dot > 6:  # Go switches to an exponent sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def compressor() -> Any:
    """A raw deflate compressor (zlib's own type has no public name)."""
    return zlib.compressobj(COMPRESSION_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)


def deflated(data: bytes) -> bytes:
    """A piece of a deflate stream that any other such piece may follow (a full flush: no shared window)."""
    compressing = compressor()
    return bytes(compressing.compress(data) + compressing.flush(zlib.Z_FULL_FLUSH))


def deflating(data: bytes, into: list[bytes], compressing: Any) -> Rendering:
    """`deflated(data)` appended to `into`, yielding every SLICE_BYTES. The compressor may be reused for the next
    piece (a full flush leaves no state behind), which costs far less than a new one: it allocates its tables."""
    pieces = []
    view = memoryview(data)
    for start in range(0, len(data), SLICE_BYTES):
        pieces.append(compressing.compress(view[start : start + SLICE_BYTES]))
        yield
    pieces.append(compressing.flush(zlib.Z_FULL_FLUSH))
    into.append(b"".join(pieces))


class ServiceBlock:
    """One service's fragments, one per family of SERVICE_FAMILIES, and their deflate pieces once a gzip scrape
    asked for them. The task families (the bulk: counters and histograms) are rendered again only when a task
    event or a removal changed them, the rest (a few lines) whenever anything changed: a service that only
    heartbeats costs a scrape a few lines. The label text of each task series is kept while the series lives."""

    def __init__(self, namespace: str, service: str) -> None:
        self.service_labels = f'namespace="{escape(namespace)}",service_name="{escape(service)}"'
        self._versions: tuple[int, ...] | None = None  # the service's version and task version rendered
        self._tasks: tuple[bytes, ...] = ()
        self._rest: tuple[bytes, ...] = ()
        self._tasks_deflated: tuple[bytes, ...] | None = None
        self._rest_deflated: tuple[bytes, ...] | None = None
        self._bodies: dict[HistogramKey, str] = {}

    @property
    def plain(self) -> tuple[bytes, ...]:
        return self._tasks + self._rest

    @property
    def deflated(self) -> tuple[bytes, ...] | None:
        if self._tasks_deflated is None or self._rest_deflated is None:
            return None
        return self._tasks_deflated + self._rest_deflated

    def stale(self, metrics: ServiceMetrics) -> bool:
        return self._versions != (*metrics.version, metrics.task_changes)

    def render(self, metrics: ServiceMetrics) -> Rendering:
        """Render what changed (`plain`), yielding every SLICE_SERIES series."""
        versions = (*metrics.version, metrics.task_changes)
        if self._versions is None or self._versions[-1] != metrics.task_changes:
            lines: list[list[str]] = [[] for _ in range(TASK_FAMILIES)]
            yield from self._render_tasks(metrics, lines)
            self._tasks = tuple("".join(family_lines).encode() for family_lines in lines)
            self._tasks_deflated = None
        self._rest = tuple("".join(family_lines).encode() for family_lines in self._rest_lines(metrics))
        self._rest_deflated = None
        self._versions = versions

    def deflate(self) -> Rendering:
        """`deflated`: each fragment of `plain` compressed (what is not yet), yielding every SLICE_BYTES."""
        compressing = compressor()
        for part in ("_tasks", "_rest"):
            if getattr(self, f"{part}_deflated") is None:
                pieces: list[bytes] = []
                for fragment in getattr(self, part):
                    if fragment:
                        yield from deflating(fragment, pieces, compressing)
                    else:
                        pieces.append(b"")
                setattr(self, f"{part}_deflated", tuple(pieces))

    def _render_tasks(self, metrics: ServiceMetrics, lines: list[list[str]]) -> Rendering:
        previous, bodies = self._bodies, dict[HistogramKey, str]()
        counters = metrics.counters
        # The keys and counts listed apart: two lists, not a tuple per series (the renderer yields meanwhile).
        for number_, ((kind, task, worker, queue, exception), count) in enumerate(
            zip(list(counters), list(counters.values()), strict=True)
        ):
            series = (task, worker, queue)
            body = bodies.get(series) or previous.get(series) or self._body(series)
            bodies[series] = body
            index = _COUNTER_INDEX[kind]
            name = SERVICE_FAMILIES[index].name
            if kind in WITH_EXCEPTION:
                lines[index].append(f'{name}{{{body},exception="{escape(exception)}"}} {count}\n')
            else:
                lines[index].append(f"{name}{{{body}}} {count}\n")
            if number_ % SLICE_SERIES == SLICE_SERIES - 1:
                yield
        for family, histogram in ((RUNTIME, metrics.runtime), (QUEUE_WAIT, metrics.queue_wait)):
            yield from self._histogram(lines[_INDEX[family]], family.name, histogram, previous, bodies)
        self._bodies = bodies

    def _rest_lines(self, metrics: ServiceMetrics) -> list[list[str]]:
        lines: list[list[str]] = [[] for _ in range(len(SERVICE_FAMILIES) - TASK_FAMILIES)]

        def of(family: Family) -> list[str]:
            return lines[_INDEX[family] - TASK_FAMILIES]

        service = self.service_labels
        for family, per_worker in ((WORKER_UP, metrics.worker_up), (WORKER_ACTIVE, metrics.worker_active)):
            of(family).extend(
                f'{family.name}{{{service},hostname="{escape(worker)}"}} {value}\n'
                for worker, value in per_worker.items()
            )
        for (queue, role), waiting in metrics.queue_length.items():
            if role in QUEUE_LENGTHS:
                family = QUEUE_LENGTHS[role]
                of(family).append(f'{family.name}{{{service},queue_name="{escape(queue)}"}} {waiting}\n')
        of(CONSUMERS).extend(
            f'{CONSUMERS.name}{{{service},queue_name="{escape(queue)}"}} {count}\n'
            for queue, count in metrics.queue_consumers.items()
        )
        for family, value in (
            (REPLICAS, metrics.replicas),
            (DESIRED_REPLICAS, metrics.desired_replicas),
            (ESTIMATED_WAIT, None if metrics.estimated_wait is None else number(metrics.estimated_wait)),
            (STUCK_WORKERS, metrics.stuck_workers),
            (REPLACEMENT_PAUSED, None if metrics.replacement_paused is None else int(metrics.replacement_paused)),
            (BROKER_ALARMS, metrics.broker_alarms),
            (CONSUMER_UP, 1 if metrics.consumer_connected else 0),
            (CONSUMED, metrics.events_consumed),
            (MALFORMED, metrics.malformed),
            (DROPPED, metrics.dropped),
            (TASKS_FORGOTTEN, metrics.tasks_forgotten),
        ):
            if value is not None:
                of(family).append(f"{family.name}{{{service}}} {value}\n")
        overflows = metrics.overflows
        of(OVERFLOWED).extend(  # at 0 too: a rate sees the first overflow
            f'{OVERFLOWED.name}{{{service},label="{label}"}} {overflows[label].events if label in overflows else 0}\n'
            for label in LABELS
        )
        refused = metrics.refused_values
        of(REFUSED_VALUES).extend(  # at 0 too, as the overflows
            f'{REFUSED_VALUES.name}{{{service},field="{field}"}} {refused.get(field, 0)}\n' for field in REFUSED_FIELDS
        )
        of(TASK_RERUNS).extend(
            f'{TASK_RERUNS.name}{{{service},name="{escape(task)}",cause="{cause}"}} {count}\n'
            for (task, cause), count in metrics.rerun_counts.items()
        )
        return lines

    def _body(self, series: HistogramKey) -> str:
        """`namespace=…,service_name=…,name=…,queue_name=…[,hostname=…]`: the labels of a task series."""
        task, worker, queue = series
        hostname = f',hostname="{escape(worker)}"' if worker else ""
        return f'{self.service_labels},name="{escape(task)}",queue_name="{escape(queue)}"{hostname}'

    def _histogram(
        self,
        lines: list[str],
        name: str,
        histogram: Histogram,
        previous: Mapping[HistogramKey, str],
        bodies: dict[HistogramKey, str],
    ) -> Rendering:
        suffixes = [f',le="{bound_label(bound)}"}} ' for bound in (*histogram.bounds, math.inf)]
        bucket, sums = f"{name}_bucket{{", histogram.sums
        for number_, (series, counts) in enumerate(
            zip(list(histogram.counts), list(histogram.counts.values()), strict=True)
        ):
            body = bodies.get(series) or previous.get(series) or self._body(series)
            bodies[series] = body
            cumulative = list(itertools.accumulate(counts))
            lines += [f"{bucket}{body}{suffix}{total}\n" for suffix, total in zip(suffixes, cumulative, strict=True)]
            lines.append(f"{name}_sum{{{body}}} {number(sums.get(series, 0.0))}\n")
            lines.append(f"{name}_count{{{body}}} {cumulative[-1]}\n")
            if number_ % SLICE_SERIES == SLICE_SERIES - 1:
                yield


def operator_fragments(
    reconciles: Mapping[str, int], status_passes: Mapping[tuple[str, str], tuple[float, float]]
) -> tuple[bytes, ...]:
    """The operator's own families (OPERATOR_FAMILIES), rendered at every scrape (a line per resource)."""
    return (
        "".join(f'{RECONCILES.name}{{result="{escape(result)}"}} {n}\n' for result, n in reconciles.items()).encode(),
        "".join(
            f'{STATUS_PASS.name}{{namespace="{escape(namespace)}",name="{escape(name)}"}} {number(at)}\n'
            for (namespace, name), (at, _interval) in status_passes.items()
        ).encode(),
    )


_HEADERS = tuple(family.header for family in FAMILIES)
_DEFLATED_HEADERS = tuple(deflated(header) for header in _HEADERS)


def exposition(blocks: Sequence[Sequence[bytes]], operator: Sequence[bytes]) -> list[bytes]:
    """The text of a scrape, in pieces: each family's header, then its fragment of every service."""
    return list(_joined(_HEADERS, blocks, operator))


def compressed_exposition(blocks: Sequence[Sequence[bytes]], operator: Sequence[bytes]) -> list[bytes]:
    """The deflate pieces of the same text (`blocks` being the services' deflated fragments)."""
    return list(_joined(_DEFLATED_HEADERS, blocks, [deflated(fragment) for fragment in operator]))


def _joined(headers: Sequence[bytes], blocks: Sequence[Sequence[bytes]], operator: Sequence[bytes]) -> Iterable[bytes]:
    services = len(SERVICE_FAMILIES)
    for index, header in enumerate(headers):
        yield header
        if index < services:
            yield from (block[index] for block in blocks if block[index])
        else:
            yield operator[index - services]


def gzip_member(plain: Sequence[bytes], deflate_pieces: Sequence[bytes], into: list[bytes]) -> Rendering:
    """One gzip member of the deflate pieces of `plain`, appended to `into` in pieces; the checksum of the
    plain text is computed piece by piece, yielding every SLICE_BYTES or so."""
    crc, size, since_yield = 0, 0, 0
    for piece in plain:
        crc = zlib.crc32(piece, crc)
        size += len(piece)
        since_yield += len(piece)
        if since_yield >= 16 * SLICE_BYTES:  # a checksum is ten times cheaper than compressing
            since_yield = 0
            yield
    into += [GZIP_HEADER, *deflate_pieces, DEFLATE_END, struct.pack("<II", crc, size & 0xFFFF_FFFF)]
