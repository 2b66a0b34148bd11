"""The text exposition: valid for Prometheus' own parser, gzip equal to plain, blocks reused until their service
changes, rendering in slices (pure; the scrape runs on an event loop of the test's own)."""

from __future__ import annotations

import asyncio
import collections
import gzip

import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_event_operator.adapters.monitoring.collector import MetricsRegistry, accepts_gzip
from celery_event_operator.core.monitoring import exposition
from celery_event_operator.core.monitoring.bounds import SeriesSettings
from tests.support import promparse
from tests.unit.monitoring.test_state import event


def scrape(registry: MetricsRegistry, compressed: bool = False) -> bytes:
    return b"".join(asyncio.run(registry.scrape(gzip=compressed)))


def busy_registry() -> MetricsRegistry:
    registry = MetricsRegistry()
    for service, per_pod in (("billing", False), ("shipping", True)):
        metrics = registry.service("shop", service, per_pod=per_pod)
        metrics.handler_queues = {"orders.created": f"{service}.orders.created"}
        for number in range(40):
            name = ("orders.created", 'weird "name" \\ with\nnewline', "reports.build")[number % 3]
            for kind in ("task-sent", "task-received", "task-started"):
                metrics.ingest(event(kind, f"pod-{number % 4}", uuid=f"u{number}", name=name, queue="reports"), 1.0)
            outcome = "task-failed" if number % 5 == 0 else "task-succeeded"
            metrics.ingest(event(outcome, f"pod-{number % 4}", uuid=f"u{number}", runtime=0.3, exception="E('x')"), 1.0)
        metrics.ingest(event("worker-heartbeat", "pod-0", active=2), 1.0)
        metrics.queue_length = {(f"{service}.orders.created", "events"): 3, (f"{service}:archived", "archive"): 1}
        metrics.queue_consumers = {f"{service}.orders.created": 2}
        metrics.replicas = 4
    registry.count_reconcile(True)
    registry.status_refreshed("shop", "billing", 15.0)
    return registry


def test_the_exposition_parses_each_family_once_and_gzip_is_the_same_text() -> None:
    registry = busy_registry()
    plain = scrape(registry)
    assert gzip.decompress(scrape(registry, compressed=True)) == plain
    families = list(text_string_to_metric_families(plain.decode()))
    names = collections.Counter(family.name for family in families)
    assert names.most_common(1)[0][1] == 1, "each family in one group"
    assert {f.name for f in families} >= {"celery_task_received", "celery_task_runtime", "celery_worker_up"}
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in families
        for sample in family.samples
    }
    weird = {"namespace": "shop", "service_name": "billing", "name": 'weird "name" \\ with\nnewline'}
    assert samples[("celery_task_received_total", tuple(sorted({**weird, "queue_name": "reports"}.items())))] == 13
    queue = {"namespace": "shop", "service_name": "billing", "queue_name": "billing.orders.created"}
    assert samples[("celery_queue_length", tuple(sorted(queue.items())))] == 3
    hostnames = {
        labels.get("hostname")
        for (name, pairs) in samples
        if name.startswith("celery_task_")
        for labels in [dict(pairs)]
    }
    assert hostnames == {None, "generic", "pod-0", "pod-1", "pod-2", "pod-3"}, "per pod on shipping only"
    assert plain.decode().count("# TYPE") == len(exposition.FAMILIES)


def test_a_block_is_rendered_again_only_when_its_service_changed_and_its_task_part_only_after_task_events() -> None:
    registry = busy_registry()
    scrape(registry, compressed=True)
    blocks = {metrics.service: block for metrics, block in registry._services.values()}

    def same(service: str, before: tuple[bytes, ...], families: slice) -> bool:
        return all(a is b for a, b in zip(blocks[service].plain[families], before[families], strict=True))

    before = {service: block.plain for service, block in blocks.items()}
    deflated = {service: block.deflated for service, block in blocks.items()}
    scrape(registry, compressed=True)
    assert all(same(service, before[service], slice(None)) for service in blocks), "nothing rendered again"
    assert all(blocks[s].deflated == deflated[s] for s in blocks)
    billing = registry.find("shop", "billing")
    assert billing is not None
    billing.ingest(event("worker-heartbeat", "pod-0", active=3), 2.0)
    plain = scrape(registry)
    tasks = slice(exposition.TASK_FAMILIES)
    assert same("billing", before["billing"], tasks), "a heartbeat leaves the task series as rendered"
    assert not same("billing", before["billing"], slice(None))
    assert same("shipping", before["shipping"], slice(None))
    assert b'celery_worker_tasks_active{namespace="shop",service_name="billing",hostname="pod-0"} 3\n' in plain
    billing.ingest(event("task-received", "pod-0", uuid="new", name="reports.build"), 2.0)
    assert b'name="reports.build",queue_name="celery"} 1\n' in scrape(registry)
    assert not same("billing", before["billing"], tasks)


def test_a_forgotten_pods_series_leave_the_block_and_its_label_text() -> None:
    registry = MetricsRegistry(defaults=SeriesSettings(per_pod=True))
    metrics = registry.service("shop", "billing")
    for worker in ("pod-a", "pod-b"):
        metrics.ingest(event("task-received", worker, uuid=worker, name="n"), 1.0)
    scrape(registry)
    metrics.forget_worker("pod-a", 2.0)
    assert b"pod-a" not in scrape(registry)
    [(_, block)] = registry._services.values()
    assert {worker for (_, worker, _) in block._bodies} == {"pod-b"}


def test_rendering_a_large_service_yields_every_few_hundred_series() -> None:
    registry = MetricsRegistry(defaults=SeriesSettings(max_task_names=5_000))
    metrics = registry.service("shop", "billing")
    for number in range(2_000):
        metrics.ingest(event("task-received", uuid=f"u{number}", name=f"task.{number}"), 1.0)
        metrics.ingest(event("task-succeeded", uuid=f"u{number}", runtime=0.1), 1.0)
    block = exposition.ServiceBlock("shop", "billing")
    slices = sum(1 for _ in block.render(metrics))
    assert slices >= 2_000 * 8 // exposition.SLICE_SERIES
    assert sum(1 for _ in block.deflate()) >= len(b"".join(block.plain)) // exposition.SLICE_BYTES


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param("gzip", True, id="gzip"),
        pytest.param("gzip, identity", True, id="list"),
        pytest.param("identity, GZip;q=0.5", True, id="weighted"),
        pytest.param("gzip;q=0", False, id="refused"),
        pytest.param("gzip; q=0.0", False, id="refused-spaced"),
        pytest.param("deflate", False, id="other"),
        pytest.param("", False, id="none"),
    ],
)
def test_gzip_is_sent_when_the_scraper_takes_it(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


@pytest.mark.parametrize(
    ("bound", "label"),
    [(0.05, "0.05"), (1, "1.0"), (300, "300.0"), (1_800.0, "1800.0"), (12_345_678.0, "1.2345678e+07")],
)
def test_bucket_bounds_are_written_as_prometheus_client_writes_them(bound: float, label: str) -> None:
    assert exposition.bound_label(bound) == label


# --- hostile input (issue 40): one producer's message never breaks another service's scrape ---------------------


def parsed(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def labelled(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": "shop", **labels}.items()))


def test_prometheus_own_parser_accepts_the_exposition() -> None:
    assert promparse.refusal(scrape(busy_registry())) is None


def test_prometheus_own_parser_refuses_what_prometheus_client_accepts() -> None:
    """Why the tests check with both: a value beyond float64 is refused by Prometheus (the whole scrape is lost)."""
    text = b"# TYPE x gauge\nx " + b"9" * 310 + b"\n"
    assert list(text_string_to_metric_families(text.decode()))
    assert "expected float as value" in (promparse.refusal(text) or "")


def test_a_label_value_that_is_no_valid_utf8_is_exported_replaced_and_counted_and_other_services_scrape() -> None:
    """A lone surrogate is valid JSON (`"\\ud800"`) and no UTF-8: rendering it raised UnicodeEncodeError, and every
    scrape of every service answered 500 until the operator restarted."""
    registry = MetricsRegistry()
    billing, shipping = registry.service("shop", "billing"), registry.service("shop", "shipping")
    shipping.ingest(event("task-received", uuid="s", name="reports.build"), 1.0)
    for body in (
        rb'{"type": "task-sent", "hostname": "celery@p", "uuid": "u", "name": "bad\ud800name", "queue": "q\udfff"}',
        rb'{"type": "task-failed", "hostname": "celery@p", "uuid": "u", "exception": "\udc00Error(1)"}',
        rb'{"type": "worker-heartbeat", "hostname": "celery@pod\ud800", "active": 1}',
    ):
        billing.ingest_message(body, 1.0)
    text = scrape(registry)
    assert promparse.refusal(text) is None
    found = parsed(text)
    billing_labels = {"service_name": "billing", "name": "bad\ufffdname", "queue_name": "q\ufffd"}
    assert found[("celery_task_sent_total", labelled(**billing_labels))] == 1
    assert found[("celery_task_failed_total", labelled(**billing_labels, exception="\ufffdError"))] == 1
    assert found[("celery_worker_up", labelled(service_name="billing", hostname="pod\ufffd"))] == 1
    refused = "celery_event_operator_event_values_refused_total"
    for field, count in (("name", 1), ("queue_name", 1), ("exception", 1), ("hostname", 1), ("active", 0)):
        assert found[(refused, labelled(service_name="billing", field=field))] == count, field
    shipping_labels = labelled(service_name="shipping", name="reports.build", queue_name="celery")
    assert found[("celery_task_received_total", shipping_labels)] == 1


def test_numbers_beyond_what_a_worker_sends_are_left_out_and_counted_and_prometheus_parses_the_scrape() -> None:
    """A heartbeat's `active` of 310 digits was written as it came: Prometheus' parser refused the page (every series
    of the operator lost); runtimes near float64's largest summed to +Inf."""
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    huge = "9" * 310
    for body in (
        f'{{"type": "worker-heartbeat", "hostname": "celery@pod-a", "active": {huge}}}',
        '{"type": "task-succeeded", "hostname": "celery@pod-a", "uuid": "a", "name": "n", "runtime": 1.5e308}',
        '{"type": "task-succeeded", "hostname": "celery@pod-a", "uuid": "b", "name": "n", "runtime": 1.5e308}',
    ):
        metrics.ingest_message(body.encode(), 1.0)
    text = scrape(registry)
    assert promparse.refusal(text) is None
    found = parsed(text)
    assert found[("celery_worker_up", labelled(service_name="billing", hostname="pod-a"))] == 1
    assert ("celery_worker_tasks_active", labelled(service_name="billing", hostname="pod-a")) not in found
    assert found[("celery_task_succeeded_total", labelled(service_name="billing", name="n", queue_name="celery"))] == 2
    refused = "celery_event_operator_event_values_refused_total"
    assert found[(refused, labelled(service_name="billing", field="active"))] == 1
    assert found[(refused, labelled(service_name="billing", field="runtime"))] == 2
