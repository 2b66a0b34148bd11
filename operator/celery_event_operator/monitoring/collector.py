"""The Prometheus view of our metrics state: a custom Collector over the dicts we own.

Names follow the popular Celery exporters (danihodovic/celery-exporter), so their dashboards work.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from celery_event_operator.monitoring.state import RUNTIME_BUCKETS, TASK_EVENT_KINDS, WITH_EXCEPTION, ServiceMetrics

SERVICE_LABELS = ["namespace", "service_name"]


class MetricsRegistry:
    """The metrics state of every monitored service, and the operator's own counters."""

    def __init__(self) -> None:
        self._services: dict[tuple[str, str], ServiceMetrics] = {}
        self._lock = threading.Lock()  # for adding and removing services only, never on the event path
        self.reconciles: dict[str, int] = {"success": 0, "failure": 0}
        # (namespace, resource) → (wall-clock time of its last status pass, its interval): how fresh status is
        self.status_passes: dict[tuple[str, str], tuple[float, float]] = {}

    def service(self, namespace: str, service: str) -> ServiceMetrics:
        with self._lock:
            found = self._services.get((namespace, service))
            if found is None:
                found = self._services[(namespace, service)] = ServiceMetrics(namespace, service)
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


class EventsCollector(Collector):
    def __init__(self, registry: MetricsRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        services = self.registry.services()
        tasks = {
            kind: CounterMetricFamily(
                f"celery_task_{kind}",
                f"Tasks {kind}, from the workers' Celery events.",
                labels=[*SERVICE_LABELS, "task", "worker", *(["exception"] if kind in WITH_EXCEPTION else [])],
            )
            for kind in TASK_EVENT_KINDS
        }
        runtime = HistogramMetricFamily(
            "celery_task_runtime_seconds", "Runtime of succeeded tasks.", labels=[*SERVICE_LABELS, "task", "worker"]
        )
        up = GaugeMetricFamily(
            "celery_worker_up",
            "1 while the worker sends heartbeats, 0 after it went offline.",
            labels=[*SERVICE_LABELS, "worker"],
        )
        active = GaugeMetricFamily(
            "celery_worker_tasks_active",
            "Tasks the worker is running (its heartbeats).",
            labels=[*SERVICE_LABELS, "worker"],
        )
        queue_length = GaugeMetricFamily(
            "celery_queue_length",
            "Messages waiting (ready + unacknowledged).",
            labels=[*SERVICE_LABELS, "queue", "role"],
        )
        consumers = GaugeMetricFamily(
            "celery_queue_consumers", "Consumers of a handler queue.", labels=[*SERVICE_LABELS, "queue"]
        )
        consumed = CounterMetricFamily(
            "celery_event_operator_events_consumed", "Celery events the operator consumed.", labels=SERVICE_LABELS
        )
        malformed = CounterMetricFamily(
            "celery_event_operator_events_malformed",
            "Messages on the events queue that were no Celery event (skipped).",
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
            for (kind, task, worker, exception), count in metrics.counters.copy().items():
                tasks[kind].add_metric(
                    [*service, task, worker, *([exception] if kind in WITH_EXCEPTION else [])], count
                )
            sums = metrics.runtime_sum.copy()
            for (task, worker), counts in metrics.runtime_buckets.copy().items():
                cumulative = list(itertools.accumulate(counts))
                buckets = [(str(bound), value) for bound, value in zip(RUNTIME_BUCKETS, cumulative, strict=False)]
                runtime.add_metric(
                    [*service, task, worker], [*buckets, ("+Inf", cumulative[-1])], sums.get((task, worker), 0.0)
                )
            for worker, value in metrics.worker_up.copy().items():
                up.add_metric([*service, worker], value)
            for worker, value in metrics.worker_active.copy().items():
                active.add_metric([*service, worker], value)
            for (queue, role), value in metrics.queue_length.copy().items():
                queue_length.add_metric([*service, queue, role], value)
            for queue, value in metrics.queue_consumers.copy().items():
                consumers.add_metric([*service, queue], value)
            consumed.add_metric(service, metrics.events_consumed)
            malformed.add_metric(service, metrics.malformed)
            dropped.add_metric(service, metrics.dropped)
        yield from tasks.values()
        yield from (runtime, up, active, queue_length, consumers, consumed, malformed, dropped, reconciles, status_pass)


def serve_metrics(metrics: MetricsRegistry, port: int, addr: str) -> None:
    """Serve /metrics on its own thread (prometheus_client's server), beside kopf's event loop."""
    registry = CollectorRegistry()
    registry.register(EventsCollector(metrics))
    prometheus_client.start_http_server(port, addr=addr, registry=registry)
