"""The Prometheus view of our metrics state: a custom Collector over the dicts we own.

Names and labels of the Celery series are danihodovic/celery-exporter's (plus `namespace` and `service_name`), so
its dashboards and alerts (the celery-mixin) work; the operator's own series are `celery_event_operator_*`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from celery_event_operator.monitoring.state import (
    QUEUE_WAIT_BUCKETS,
    RUNTIME_BUCKETS,
    TASK_EVENT_KINDS,
    WITH_EXCEPTION,
    Histogram,
    ServiceMetrics,
)

SERVICE_LABELS = ["namespace", "service_name"]
# celery-exporter's: `hostname` is the Celery hostname after `@` (the pod name), `queue_name` the queue consumed from
TASK_LABELS = [*SERVICE_LABELS, "name", "hostname", "queue_name"]


class MetricsRegistry:
    """The metrics state of every monitored service, and the operator's own counters."""

    def __init__(
        self,
        runtime_buckets: tuple[float, ...] = RUNTIME_BUCKETS,
        queue_wait_buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS,
    ) -> None:
        self.runtime_buckets = runtime_buckets
        self.queue_wait_buckets = queue_wait_buckets
        self._services: dict[tuple[str, str], ServiceMetrics] = {}
        self._lock = threading.Lock()  # for adding and removing services only, never on the event path
        self.reconciles: dict[str, int] = {"success": 0, "failure": 0}
        # (namespace, resource) → (wall-clock time of its last status pass, its interval): how fresh status is
        self.status_passes: dict[tuple[str, str], tuple[float, float]] = {}

    def service(self, namespace: str, service: str) -> ServiceMetrics:
        with self._lock:
            found = self._services.get((namespace, service))
            if found is None:
                found = ServiceMetrics(namespace, service, self.runtime_buckets, self.queue_wait_buckets)
                self._services[(namespace, service)] = found
            return found

    def find(self, namespace: str, service: str) -> ServiceMetrics | None:
        return self._services.get((namespace, service))

    def remove(self, namespace: str, service: str) -> None:
        with self._lock:
            self._services.pop((namespace, service), None)

    def services(self) -> list[ServiceMetrics]:
        with self._lock:
            return list(self._services.values())

    def status_refreshed(self, namespace: str, name: str, interval: float) -> None:
        self.status_passes[(namespace, name)] = (time.time(), interval)

    def forget_status(self, namespace: str, name: str) -> None:
        self.status_passes.pop((namespace, name), None)

    def count_reconcile(self, succeeded: bool) -> None:
        with self._lock:  # kopf's handler threads (not the event path)
            self.reconciles["success" if succeeded else "failure"] += 1


def _histogram_samples(family: HistogramMetricFamily, service: list[str], histogram: Histogram) -> None:
    sums = histogram.sums.copy()
    bounds = [str(bound) for bound in histogram.bounds]
    for (task, worker, queue), counts in histogram.counts.copy().items():
        cumulative = list(itertools.accumulate(counts))
        buckets = [*zip(bounds, cumulative, strict=False), ("+Inf", cumulative[-1])]
        family.add_metric([*service, task, worker, queue], buckets, sums.get((task, worker, queue), 0.0))


class EventsCollector(Collector):
    def __init__(self, registry: MetricsRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        services = self.registry.services()
        tasks = {
            kind: CounterMetricFamily(
                f"celery_task_{kind}",
                f"Tasks {kind}, from the workers' Celery events.",
                labels=[*TASK_LABELS, *(["exception"] if kind in WITH_EXCEPTION else [])],
            )
            for kind in TASK_EVENT_KINDS
        }
        runtime = HistogramMetricFamily(
            "celery_task_runtime", "Runtime of succeeded tasks (seconds).", labels=TASK_LABELS
        )
        queue_wait = HistogramMetricFamily(
            "celery_task_queue_wait_time",
            "Time from a task's sending (else its receipt by a worker) to its start, without ETA or countdown delay"
            " (seconds).",
            labels=TASK_LABELS,
        )
        up = GaugeMetricFamily(
            "celery_worker_up",
            "1 while the worker sends heartbeats, 0 after it went offline.",
            labels=[*SERVICE_LABELS, "hostname"],
        )
        active = GaugeMetricFamily(
            "celery_worker_tasks_active",
            "Tasks the worker is running (its heartbeats).",
            labels=[*SERVICE_LABELS, "hostname"],
        )
        queue_families = {
            "events": GaugeMetricFamily(
                "celery_queue_length",
                "Messages waiting in a handler queue (ready + unacknowledged).",
                labels=[*SERVICE_LABELS, "queue_name"],
            ),
            "retry": GaugeMetricFamily(
                "celery_event_operator_retry_queue_length",
                "Messages waiting in a retry level (ready + unacknowledged).",
                labels=[*SERVICE_LABELS, "queue_name"],
            ),
            "archive": GaugeMetricFamily(
                "celery_event_operator_archive_queue_length",
                "Messages in the archive (ready + unacknowledged).",
                labels=[*SERVICE_LABELS, "queue_name"],
            ),
        }
        consumers = GaugeMetricFamily(
            "celery_active_consumer_count", "Consumers of a handler queue.", labels=[*SERVICE_LABELS, "queue_name"]
        )
        consumed = CounterMetricFamily(
            "celery_event_operator_events_consumed", "Celery events the operator consumed.", labels=SERVICE_LABELS
        )
        malformed = CounterMetricFamily(
            "celery_event_operator_events_malformed",
            "Messages on the events queue that were no Celery event (skipped).",
            labels=SERVICE_LABELS,
        )
        replicas = GaugeMetricFamily(
            "celery_event_operator_replicas", "The service's worker pods running.", labels=SERVICE_LABELS
        )
        desired_replicas = GaugeMetricFamily(
            "celery_event_operator_desired_replicas",
            "The worker replicas wanted: the autoscaler's or spec.workers.replicas, else the workload's own.",
            labels=SERVICE_LABELS,
        )
        stuck = GaugeMetricFamily(
            "celery_event_operator_stuck_workers",
            "Running worker pods that heartbeat but consume nothing while messages wait, or stopped heartbeating.",
            labels=SERVICE_LABELS,
        )
        alarms = GaugeMetricFamily(
            "celery_event_operator_broker_alarms",
            "Resource alarms (memory, disk) in effect on the service's broker: while above 0 it blocks publishers.",
            labels=SERVICE_LABELS,
        )
        consumer_up = GaugeMetricFamily(
            "celery_event_operator_events_consumer_up",
            "1 while the service's events consumer consumes; 0 while it is not (its series then stand still).",
            labels=SERVICE_LABELS,
        )
        dropped = CounterMetricFamily(
            "celery_event_operator_events_dropped", "Celery events of types no metric counts.", labels=SERVICE_LABELS
        )
        status_pass = GaugeMetricFamily(
            "celery_event_operator_status_pass_timestamp_seconds",
            "When the status (queue lengths, replicas) of a CeleryEventService was last refreshed (unix time).",
            labels=["namespace", "name"],
        )
        for (namespace, name), (at, _interval) in self.registry.status_passes.copy().items():
            status_pass.add_metric([namespace, name], at)
        reconciles = CounterMetricFamily(
            "celery_event_operator_reconciles", "Reconciles of CeleryEventServices.", labels=["result"]
        )
        for result, count in self.registry.reconciles.copy().items():
            reconciles.add_metric([result], count)
        for metrics in services:
            service = [metrics.namespace, metrics.service]
            for (kind, task, worker, queue, exception), count in metrics.counters.copy().items():
                tasks[kind].add_metric(
                    [*service, task, worker, queue, *([exception] if kind in WITH_EXCEPTION else [])], count
                )
            _histogram_samples(runtime, service, metrics.runtime)
            _histogram_samples(queue_wait, service, metrics.queue_wait)
            for worker, value in metrics.worker_up.copy().items():
                up.add_metric([*service, worker], value)
            for worker, value in metrics.worker_active.copy().items():
                active.add_metric([*service, worker], value)
            for (queue, role), value in metrics.queue_length.copy().items():
                if role in queue_families:
                    queue_families[role].add_metric([*service, queue], value)
            for queue, value in metrics.queue_consumers.copy().items():
                consumers.add_metric([*service, queue], value)
            consumed.add_metric(service, metrics.events_consumed)
            malformed.add_metric(service, metrics.malformed)
            dropped.add_metric(service, metrics.dropped)
            consumer_up.add_metric(service, 1 if metrics.consumer_connected else 0)
            if metrics.replicas is not None:
                replicas.add_metric(service, metrics.replicas)
            if metrics.desired_replicas is not None:
                desired_replicas.add_metric(service, metrics.desired_replicas)
            if metrics.stuck_workers is not None:
                stuck.add_metric(service, metrics.stuck_workers)
            if metrics.broker_alarms is not None:
                alarms.add_metric(service, metrics.broker_alarms)
        yield from tasks.values()
        yield from (runtime, queue_wait, up, active, *queue_families.values(), consumers)
        yield from (
            replicas,
            desired_replicas,
            stuck,
            alarms,
            consumer_up,
            consumed,
            malformed,
            dropped,
            reconciles,
            status_pass,
        )


def serve_metrics(metrics: MetricsRegistry, port: int, addr: str) -> None:
    """Serve /metrics on its own thread (prometheus_client's server), beside kopf's event loop."""
    registry = CollectorRegistry()
    registry.register(EventsCollector(metrics))
    prometheus_client.start_http_server(port, addr=addr, registry=registry)
