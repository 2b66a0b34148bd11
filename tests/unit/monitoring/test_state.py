"""Celery events into metrics state, its exposition, and garbage collection (pure; the scrape runs on an event
loop of the test's own, as the operator's)."""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from celery_event_operator.adapters.monitoring.collector import MetricsRegistry
from celery_event_operator.core.monitoring import bounds, state
from celery_event_operator.core.monitoring.bounds import SeriesSettings

PER_POD = SeriesSettings(per_pod=True)
W = state.SERVICE_WIDE


def event(kind: str, worker: str = "pod-a", **fields: Any) -> dict[str, Any]:
    return {"type": kind, "hostname": f"celery@{worker}", "timestamp": 1.0, **fields}


def scraped(registry: MetricsRegistry) -> str:
    return b"".join(asyncio.run(registry.scrape(gzip=False))).decode()


def samples(registry: MetricsRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = scraped(registry)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, **labels: str) -> float:
    wanted = {"namespace": "shop", "service_name": "billing", **labels}
    return found[(metric, tuple(sorted(wanted.items())))]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("KeyError('sku')", "KeyError"),
        ("ValueError: bad", "ValueError"),
        ("app.errors.PaymentDeclined('card')", "PaymentDeclined"),
        ("", "Exception"),
        ("Retry(Retry(...), KeyError('always fails'), 0)", "KeyError"),
        ("Retry in 0s: ValueError('x')", "ValueError"),
    ],
)
def test_exception_class(text: str, expected: str) -> None:
    assert state.exception_class(text) == expected


@pytest.mark.parametrize("per_pod", [pytest.param(False, id="per-service"), pytest.param(True, id="per-pod")])
def test_task_lifecycle_counters_histogram_and_names_from_the_lru(per_pod: bool) -> None:
    registry = MetricsRegistry(defaults=SeriesSettings(per_pod=per_pod))
    metrics = registry.service("shop", "billing")
    metrics.handler_queues = {"orders.created": "billing.orders.created"}
    for item in [
        event("task-sent", "producer-x", uuid="t1", name="orders.created", queue=None, exchange="events"),
        event("task-received", uuid="t1", name="orders.created"),
        event("task-started", uuid="t1"),  # no name: found by uuid
        event("task-succeeded", uuid="t1", runtime=0.3),
        event("task-received", uuid="t2", name="orders.created"),
        event("task-started", uuid="t2"),
        event("task-retried", uuid="t2", exception="KeyError('sku')"),
        event("task-received", uuid="t2", name="orders.created"),
        event("task-failed", uuid="t2", exception="ValueError('no')"),
    ]:
        metrics.ingest_message(json.dumps(item).encode(), now=10.0)
    found = samples(registry)
    task = {"name": "orders.created", "queue_name": "billing.orders.created"}
    sent = {**task, **({"hostname": "generic"} if per_pod else {})}
    worked = {**task, **({"hostname": "pod-a"} if per_pod else {})}
    assert value(found, "celery_task_sent_total", **sent) == 1
    assert value(found, "celery_task_received_total", **worked) == 3
    assert value(found, "celery_task_started_total", **worked) == 2
    assert value(found, "celery_task_succeeded_total", **worked) == 1
    assert value(found, "celery_task_retried_total", exception="KeyError", **worked) == 1
    assert value(found, "celery_task_failed_total", exception="ValueError", **worked) == 1
    assert value(found, "celery_task_runtime_bucket", le="0.25", **worked) == 0
    assert value(found, "celery_task_runtime_bucket", le="0.5", **worked) == 1
    assert value(found, "celery_task_runtime_count", **worked) == 1
    assert value(found, "celery_task_runtime_sum", **worked) == pytest.approx(0.3)
    assert value(found, "celery_event_operator_events_consumed_total") == 9
    task_series = [dict(labels) for name, labels in found if name.startswith("celery_task_")]
    assert {"hostname" in labels for labels in task_series} == {per_pod}


def test_queue_name_is_where_the_task_was_sent_else_its_handler_queue_else_celerys_default() -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    metrics.handler_queues = {"orders.created": "billing.orders.created"}
    for item in [
        event("task-sent", "web", uuid="a", name="reports.build", queue="reports"),
        event("task-received", uuid="a", name="reports.build"),
        event("task-started", uuid="a"),
        event("task-received", uuid="b", name="orders.created"),
        event("task-received", uuid="c", name="cleanup"),
        event("task-revoked", uuid="c"),
    ]:
        metrics.ingest(item, 1.0)
    found = samples(registry)
    assert value(found, "celery_task_sent_total", name="reports.build", queue_name="reports") == 1
    assert value(found, "celery_task_started_total", name="reports.build", queue_name="reports") == 1
    assert (
        value(
            found,
            "celery_task_received_total",
            name="orders.created",
            queue_name="billing.orders.created",
        )
        == 1
    )
    assert value(found, "celery_task_revoked_total", name="cleanup", queue_name="celery") == 1


def test_a_tasks_first_series_of_a_worker_brings_its_other_worker_series_at_zero() -> None:
    """As celery-exporter: `failed / (failed + succeeded)` has a denominator for a task that never succeeded."""
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    metrics.ingest(event("task-sent", "web", uuid="a", name="n", queue="q"), 1.0)
    metrics.ingest(event("task-failed", uuid="a", exception="KeyError('x')"), 1.0)
    labels = {"name": "n", "queue_name": "q"}
    found = samples(registry)
    assert value(found, "celery_task_failed_total", exception="KeyError", **labels) == 1
    for kind in ("received", "started", "succeeded", "rejected", "revoked"):
        assert value(found, f"celery_task_{kind}_total", **labels) == 0
    assert value(found, "celery_task_failed_total", exception="", **labels) == 0
    assert value(found, "celery_task_retried_total", exception="", **labels) == 0
    assert len([key for key in found if key[0] == "celery_task_sent_total"]) == 1, "producers get no zero series"


def test_queue_wait_counts_from_sending_else_receipt_and_never_a_deliberate_delay() -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    eta = {"eta": "2026-01-01T00:01:00+00:00"}
    for item in [
        event("task-sent", "web", uuid="sent", name="n", queue="q", timestamp=100.0, retries=0, eta=None),
        event("task-received", uuid="sent", name="n", timestamp=101.0, eta=None),
        event("task-started", uuid="sent", timestamp=103.0),  # 3 s since sent
        event("task-received", uuid="unsent", name="n", timestamp=200.0),  # its task-sent went elsewhere
        event("task-started", uuid="unsent", timestamp=200.2),  # 0.2 s since received
        event("task-sent", "web", uuid="countdown", name="n", queue="q", timestamp=300.0, **eta),
        event("task-received", uuid="countdown", name="n", timestamp=300.1, **eta),
        event("task-started", uuid="countdown", timestamp=360.0),  # waited on purpose: not observed
        event("task-sent", "pod-a", uuid="retry", name="n", queue="q", timestamp=400.0, retries=1),
        event("task-received", uuid="retry", name="n", timestamp=404.0),  # held back by a retry level
        event("task-started", uuid="retry", timestamp=404.5),  # 0.5 s since received
        event("task-sent", "web", uuid="skewed", name="n", queue="q", timestamp=500.0),
        event("task-started", uuid="skewed", timestamp=499.0),  # the worker's clock is behind: 0
        event("task-started", uuid="skewed", timestamp=510.0),  # started twice: its wait was observed already
    ]:
        metrics.ingest(item, 1.0)
    found = samples(registry)
    labels = {"name": "n"}
    # "unsent" has no task-sent: Celery's default queue; the others were sent to "q"
    assert value(found, "celery_task_queue_wait_time_count", queue_name="q", **labels) == 3
    assert value(found, "celery_task_queue_wait_time_sum", queue_name="q", **labels) == pytest.approx(3.5)
    assert value(found, "celery_task_queue_wait_time_bucket", queue_name="q", le="0.05", **labels) == 1
    assert value(found, "celery_task_queue_wait_time_bucket", queue_name="q", le="1.0", **labels) == 2
    assert value(found, "celery_task_queue_wait_time_bucket", queue_name="q", le="5.0", **labels) == 3
    assert value(found, "celery_task_queue_wait_time_count", queue_name="celery", **labels) == 1
    assert value(found, "celery_task_queue_wait_time_sum", queue_name="celery", **labels) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("events", "waited", "refused"),
    [
        pytest.param(  # another service's producer: no task-sent here; the wait counts from the publish, not receipt
            [("received", {"name": "n", "timestamp": 105.0}), ("started", {"timestamp": 105.5, "published_at": 100.0})],
            5.5,
            0,
            id="published-not-received",
        ),
        pytest.param(  # the publish time is the wait's start even where the task-sent was seen (a moment later)
            [
                ("sent", {"name": "n", "queue": "q", "timestamp": 100.2}),
                ("started", {"timestamp": 103.0, "published_at": 100.0}),
            ],
            3.0,
            0,
            id="published-before-sent",
        ),
        pytest.param(  # the worker's clock behind the producer's: 0, as for task-sent
            [("received", {"name": "n", "timestamp": 99.0}), ("started", {"timestamp": 99.5, "published_at": 100.0})],
            0.0,
            0,
            id="skewed",
        ),
        *(
            pytest.param(  # no time: refused and counted; the wait counts from the receipt
                [
                    ("received", {"name": "n", "timestamp": 105.0}),
                    ("started", {"timestamp": 105.5, "published_at": bad}),
                ],
                0.5,
                1,
                id=f"refused-{bad!r}",
            )
            for bad in ("100.0", -1.0, 2.0**40, True, [100.0])
        ),
    ],
)
def test_queue_wait_counts_from_the_publish_time_a_task_started_carries(
    events: list[tuple[str, dict[str, Any]]], waited: float, refused: int
) -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    for kind, fields in events:
        metrics.ingest(event(f"task-{kind}", uuid="u", **fields), 1.0)
    [(series, total)] = metrics.queue_wait.sums.items()
    assert sum(metrics.queue_wait.counts[series]) == 1
    assert total == pytest.approx(waited)
    assert metrics.refused_values.get("published_at", 0) == refused


def test_histogram_buckets_are_the_configured_ones() -> None:
    registry = MetricsRegistry(runtime_buckets=(1.0, 60.0), queue_wait_buckets=(10.0,))
    metrics = registry.service("shop", "billing")
    metrics.ingest(event("task-received", uuid="u", name="n", timestamp=1.0), 1.0)
    metrics.ingest(event("task-started", uuid="u", timestamp=2.0), 1.0)
    metrics.ingest(event("task-succeeded", uuid="u", runtime=30.0), 1.0)
    bounds = {
        metric: sorted(dict(labels)["le"] for (name, labels) in samples(registry) if name == f"{metric}_bucket")
        for metric in ("celery_task_runtime", "celery_task_queue_wait_time")
    }
    assert bounds == {"celery_task_runtime": ["+Inf", "1.0", "60.0"], "celery_task_queue_wait_time": ["+Inf", "10.0"]}


def test_the_consumer_readiness_follows_its_connection() -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    assert value(samples(registry), "celery_event_operator_events_consumer_up") == 0, "not connected yet"
    metrics.consumer_connected = True
    assert value(samples(registry), "celery_event_operator_events_consumer_up") == 1


def test_workers_up_active_and_offline() -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    metrics.ingest(event("worker-online"), 1.0)
    metrics.ingest(event("worker-heartbeat", active=3), 2.0)
    assert value(samples(registry), "celery_worker_tasks_active", hostname="pod-a") == 3
    metrics.ingest(event("worker-offline"), 3.0)
    found = samples(registry)
    assert value(found, "celery_worker_up", hostname="pod-a") == 0
    assert value(found, "celery_worker_tasks_active", hostname="pod-a") == 0


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"\x00\x01 not json", id="not-json"),
        pytest.param(b'{"hostname": "celery@x"}', id="no-type"),
        pytest.param(b'["just", "strings"]', id="list-of-garbage"),
        pytest.param(json.dumps(event("task-received", args="x" * state.MAX_EVENT_BYTES)).encode(), id="huge"),
        pytest.param(b'{"type": 3, "hostname": "celery@x"}', id="wrong-types"),
    ],
)
def test_malformed_messages_are_counted_and_skipped(body: bytes) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest_message(body, 1.0)
    assert metrics.malformed == 1
    assert metrics.counters == {}
    metrics.ingest_message(json.dumps(event("task-received", uuid="t", name="n")).encode(), 1.0)
    assert metrics.counters[("received", "n", W, "celery", "")] == 1


def test_batched_events_and_unknown_types() -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest_message(
        json.dumps(
            [event("task-received", uuid="a", name="n"), event("task-custom"), event("something-else")]
        ).encode(),
        1.0,
    )
    assert metrics.counters[("received", "n", W, "celery", "")] == 1
    assert metrics.dropped == 2


def test_forget_worker_removes_every_series_of_the_pod_and_ignores_late_events() -> None:
    registry = MetricsRegistry(defaults=PER_POD)
    metrics = registry.service("shop", "billing")
    for worker in ("pod-a", "pod-b"):
        metrics.ingest(event("worker-heartbeat", worker, active=1), 1.0)
        metrics.ingest(event("task-received", worker, uuid=worker, name="n"), 1.0)
        metrics.ingest(event("task-started", worker, uuid=worker), 1.0)
        metrics.ingest(event("task-succeeded", worker, uuid=worker, runtime=0.01), 1.0)
    metrics.forget_worker("pod-a", 2.0)
    metrics.ingest(event("worker-offline", "pod-a"), 3.0)  # its last words arrive after the deletion
    found = samples(registry)
    workers = {dict(labels).get("hostname") for (_, labels) in found} - {None}
    assert workers == {"pod-b"}
    assert {name for name, _ in found} >= {"celery_task_queue_wait_time_count", "celery_task_runtime_count"}


def test_a_pod_recreated_under_its_name_is_a_new_worker_not_a_late_one() -> None:
    """A StatefulSet's pod comes back under its name: once the index lists it again, its events count (they were
    dropped as a deleted pod's late words for the tombstone's 10 minutes, and its worker looked silent)."""
    live = ["worker-0"]
    metrics = state.ServiceMetrics("shop", "billing", settings=PER_POD)
    metrics.live_pods = lambda: list(live)
    metrics.ingest(event("worker-heartbeat", "worker-0"), 1.0)
    metrics.forget_worker("worker-0", 2.0)
    live.clear()  # deleted: the index no longer lists it
    metrics.ingest(event("worker-heartbeat", "worker-0"), 3.5)
    assert "worker-0" not in metrics.last_heard, "a late heartbeat of the deleted pod"
    live.append("worker-0")  # recreated under its name
    metrics.ingest(event("worker-heartbeat", "worker-0", active=1), 5.0)
    metrics.ingest(event("task-started", "worker-0", uuid="t", name="n"), 5.5)
    assert metrics.last_heard["worker-0"] == 5.5
    assert metrics.worker_up == {"worker-0": 1}
    assert list(metrics.running.elapsed(6.0)) == ["worker-0"]


def test_sweep_keeps_live_pods_and_recently_heard_workers() -> None:
    metrics = state.ServiceMetrics("shop", "billing", settings=PER_POD)
    metrics.ingest(event("worker-heartbeat", "live-pod"), 0.0)
    metrics.ingest(event("worker-heartbeat", "laptop-worker"), 90.0)
    metrics.ingest(event("worker-heartbeat", "vanished-pod"), 0.0)
    metrics.ingest(event("task-sent", "producer", uuid="u", name="n"), 0.0)
    assert metrics.sweep(["live-pod"], now=100.0, silence_seconds=60.0) == ["vanished-pod"]
    assert set(metrics.worker_up) == {"live-pod", "laptop-worker"}
    assert ("sent", "n", "generic", "celery", "") in metrics.counters, "producers are no workers to sweep"


def test_task_name_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "TASKS_KEPT", 3)
    metrics = state.ServiceMetrics("shop", "billing")
    for index in range(10):
        metrics.ingest(event("task-received", uuid=f"t{index}", name="n"), 1.0)
    assert len(metrics._tasks) == 3
    metrics.ingest(event("task-started", uuid="t0"), 1.0)
    assert metrics.counters[("started", "unknown", W, "celery", "")] == 1
    assert metrics.tasks_forgotten == 8, "7 received, then the started of one forgotten"


def test_removing_a_service_removes_its_series() -> None:
    registry = MetricsRegistry()
    registry.service("shop", "billing").ingest(event("worker-heartbeat"), 1.0)
    registry.remove("shop", "billing")
    assert not [key for key in samples(registry) if dict(key[1]).get("service_name") == "billing"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"[" * 30000 + b"]" * 30000, id="deep-nesting"),
        pytest.param(b'{"type": "task-received", "hostname": "celery@w1", "uuid": ["a"], "name": "t"}', id="uuid-list"),
        pytest.param(
            b'{"type": "task-received", "hostname": "celery@w1", "uuid": "a", "name": {"x": 1}}', id="name-dict"
        ),
        pytest.param(b'{"type": "task-received", "hostname": "' + b"h" * 5000 + b'"}', id="huge-hostname"),
        pytest.param(b'[{"type": "task-received", "hostname": "celery@w1"}, 1, 2, 3, "x"]', id="list-mixed"),
        pytest.param(b"[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", id="list-of-numbers"),
        pytest.param(b"null", id="null"),
    ],
)
def test_a_hostile_body_counts_once_as_malformed_and_changes_no_series(body: bytes) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest_message(body, 1.0)
    assert metrics.malformed == 1
    assert all(key[1] != "t" for key in metrics.counters)


@pytest.mark.parametrize("runtime", ["NaN", "Infinity", "-Infinity", "-1", '"1.5"', "true", "[1]"])
def test_a_runtime_that_is_no_duration_counts_the_task_but_is_not_observed(runtime: str) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    body = '{"type": "task-succeeded", "hostname": "celery@pod-a", "uuid": "u", "name": "n", "runtime": '
    body += runtime + "}"
    metrics.ingest_message(body.encode(), 1.0)
    metrics.ingest_message(json.dumps(event("task-succeeded", uuid="v", name="n", runtime=0.5)).encode(), 1.0)
    assert metrics.counters[("succeeded", "n", W, "celery", "")] == 2
    assert metrics.runtime.sums[("n", W, "celery")] == 0.5
    assert sum(metrics.runtime.counts[("n", W, "celery")]) == 1


def test_an_oversized_task_failed_counts_as_a_failure_from_its_head_and_tail() -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest_message(json.dumps(event("task-received", uuid="u1", name="orders.charge")).encode(), 1.0)
    failed = event("task-failed", uuid="u1", exception="PaymentDeclined('card')")
    failed["traceback"] = 'Traceback:\n  raise "x"\n' * 20_000  # quotes inside: escaped in the JSON text
    failed["pid"] = 7
    body = json.dumps(failed).encode()
    assert len(body) > 2 * state.MAX_EVENT_BYTES
    metrics.ingest_oversized(body[:32768], body[-32768:], len(body), 1.0)
    assert metrics.counters[("failed", "orders.charge", W, "celery", "PaymentDeclined")] == 1
    assert metrics.malformed == 0


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"type": "task-received", "pad": "' + b"x" * 200_000 + b'"}', id="not-a-failure"),
        pytest.param(b'{"pad": "' + b'\\"type\\": \\"task-failed\\"' * 10_000 + b'"}', id="fields-inside-a-string"),
        pytest.param(b"x" * 200_000, id="no-json"),
    ],
)
def test_other_oversized_bodies_are_malformed(body: bytes) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest_oversized(body[:32768], body[-32768:], len(body), 1.0)
    assert (metrics.malformed, metrics.counters) == (1, {})


def test_fuzzed_bodies_interleaved_with_good_events_never_raise_and_good_events_count_exactly() -> None:
    """Every field of a good event replaced by values of every wrong type, sent between good events."""
    rng = random.Random(12)
    hostile_values: list[Any] = [
        None,
        True,
        -1,
        2**70,
        1.5,
        float("nan"),
        float("inf"),
        "",
        "x" * 100_000,
        [],
        [[[]]],
        {},
        {"a": [1]},
        "celery@",
        "@",
        "task-",
        "worker-",
    ]
    template = event("task-succeeded", uuid="u", name="fuzzed", runtime=0.1, active=1, exception="E('x')")
    metrics = state.ServiceMetrics("shop", "billing")
    good = 0
    for round_ in range(2_000):
        mutated = dict(template)
        for field in rng.sample(sorted(template), rng.randint(1, 3)):
            mutated[field] = rng.choice(hostile_values)
        text = json.dumps(mutated if rng.random() < 0.8 else [mutated, mutated])
        if rng.random() < 0.1:
            text = text[: rng.randrange(len(text))]  # cut short
        metrics.ingest_message(text.encode(), 1.0)
        metrics.ingest_message(json.dumps(event("task-received", uuid=f"g{round_}", name="good")).encode(), 1.0)
        good += 1
    assert metrics.counters[("received", "good", W, "celery", "")] == good
    assert all(math.isfinite(total) for total in metrics.runtime.sums.values())
    assert all(
        len(key[1]) <= state.MAX_LABEL_CHARS and len(key[2]) <= state.MAX_LABEL_CHARS for key in metrics.counters
    )


def test_an_integer_beyond_float64_leaves_its_value_out_and_the_rest_of_the_batch_counts() -> None:
    """`timestamp` or `runtime` beyond float64 raised OverflowError out of ingest_message: the message was counted
    malformed after part of it was counted, and the rest of its batch was lost."""
    metrics = state.ServiceMetrics("shop", "billing")
    huge = "1" + "0" * 400
    batch = (
        '[{"type": "task-received", "hostname": "celery@pod-a", "uuid": "g1", "name": "good", "timestamp": 1.0},'
        f' {{"type": "task-sent", "hostname": "celery@p", "uuid": "h", "name": "huge", "timestamp": {huge}}},'
        f' {{"type": "task-succeeded", "hostname": "celery@pod-a", "uuid": "h", "runtime": {huge}}},'
        ' {"type": "task-received", "hostname": "celery@pod-a", "uuid": "g2", "name": "good", "timestamp": 1.0}]'
    )
    metrics.ingest_message(batch.encode(), 1.0)
    assert metrics.malformed == 0
    assert metrics.counters[("received", "good", W, "celery", "")] == 2
    assert metrics.counters[("succeeded", "huge", W, "celery", "")] == 1
    assert metrics.runtime.counts == {}
    assert metrics.refused_values == {"timestamp": 1, "runtime": 1}


@pytest.mark.parametrize(
    ("concurrency", "remembered", "refused"),
    [
        pytest.param(4, 4, 0, id="valid"),
        pytest.param(1, 1, 0, id="solo"),
        pytest.param(bounds.MAX_WORKER_SLOTS, bounds.MAX_WORKER_SLOTS, 0, id="the-bound"),
        pytest.param(bounds.MAX_WORKER_SLOTS + 1, None, 1, id="past-the-bound"),
        pytest.param(10**400, None, 1, id="huge"),
        pytest.param(0, None, 1, id="zero"),
        pytest.param(-3, None, 1, id="negative"),
        pytest.param(True, None, 1, id="bool"),
        pytest.param(4.0, None, 1, id="float"),
        pytest.param(float("nan"), None, 1, id="nan"),
        pytest.param("4", None, 1, id="string"),
        pytest.param([4], None, 1, id="list"),
        pytest.param(None, None, 0, id="missing"),
    ],
)
@pytest.mark.parametrize("kind", ["worker-online", "worker-heartbeat"])
def test_a_workers_slots_are_what_it_reported_else_refused_and_counted(
    kind: str, concurrency: Any, remembered: int | None, refused: int
) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    fields = {} if concurrency is None else {"concurrency": concurrency}
    metrics.ingest_message(json.dumps(event(kind, active=1, **fields)).encode(), 1.0)
    assert metrics.worker_slots.get("pod-a") == remembered
    assert metrics.refused_values.get("concurrency", 0) == refused
    assert metrics.worker_active == {"pod-a": 1}, "the rest of the event counts"


def test_a_refused_concurrency_keeps_what_the_worker_reported_before() -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.ingest(event("worker-online", concurrency=3), 1.0)
    metrics.ingest(event("worker-heartbeat", concurrency="lots"), 2.0)
    metrics.ingest(event("worker-heartbeat"), 3.0)  # Celery's own heartbeat: no field
    assert metrics.worker_slots == {"pod-a": 3}
    metrics.ingest(event("worker-heartbeat", concurrency=5), 4.0)  # restarted with another pool size
    assert metrics.worker_slots == {"pod-a": 5}


def test_refused_concurrencies_are_exported_by_field() -> None:
    registry = MetricsRegistry()
    metrics = registry.service("shop", "billing")
    found = samples(registry)
    refused = "celery_event_operator_event_values_refused_total"
    assert value(found, refused, field="concurrency") == 0, "at 0 too"
    metrics.ingest(event("worker-heartbeat", concurrency=-1), 1.0)
    assert value(samples(registry), refused, field="concurrency") == 1


def test_a_workers_slots_are_forgotten_with_it_and_its_late_words_ignored() -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    for worker in ("pod-a", "pod-b", "vanished"):
        metrics.ingest(event("worker-heartbeat", worker, concurrency=2), 0.0)
    metrics.forget_worker("pod-a", 1.0)
    metrics.ingest(event("worker-heartbeat", "pod-a", concurrency=2), 2.0)  # a deleted pod's late heartbeat
    assert metrics.sweep(["pod-b"], now=100.0, silence_seconds=60.0) == ["vanished"]
    assert metrics.worker_slots == {"pod-b": 2}


@pytest.mark.parametrize(
    ("reports", "expected"),
    [
        pytest.param([], None, id="none-heard"),
        pytest.param([("pod-a", None)], None, id="none-reported"),
        pytest.param([("pod-a", 4)], 4, id="one"),
        pytest.param([("pod-a", 4), ("pod-b", 4), ("pod-c", 8)], 4, id="most-common"),
        pytest.param([("pod-a", 4), ("pod-b", 8)], 4, id="tie-the-lower"),
        pytest.param([("pod-a", 2), ("pod-b", 2), ("pod-c", 8), ("pod-d", 8), ("pod-e", 1)], 2, id="tie-of-many"),
        pytest.param([("pod-a", 4), ("pod-b", None), ("pod-c", -1)], 4, id="silent-and-refused-ignored"),
        pytest.param([("pod-a", 2), ("laptop", 64), ("forged", 64)], 2, id="hostnames-of-no-pod-ignored"),
    ],
)
def test_slots_per_pod_is_the_most_common_report_of_the_workers(
    reports: list[tuple[str, int | None]], expected: int | None
) -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.live_pods = lambda: [f"pod-{letter}" for letter in "abcde"]
    for worker, slots in reports:
        fields = {} if slots is None else {"concurrency": slots}
        metrics.ingest(event("worker-online", worker, **fields), 1.0)
    assert metrics.slots_per_pod() == expected


def test_slots_per_pod_leaves_out_workers_gone_offline_or_forgotten() -> None:
    metrics = state.ServiceMetrics("shop", "billing")
    metrics.live_pods = lambda: ["old-a", "old-b", "new-a"]
    for worker, slots in (("old-a", 2), ("old-b", 2), ("new-a", 6)):
        metrics.ingest(event("worker-heartbeat", worker, concurrency=slots), 1.0)
    assert metrics.slots_per_pod() == 2
    metrics.ingest(event("worker-offline", "old-a", concurrency=2), 2.0)  # a rollout: the old pods shut down
    metrics.forget_worker("old-b", 3.0)
    assert metrics.slots_per_pod() == 6
    metrics.ingest(event("worker-offline", "new-a"), 4.0)
    assert metrics.slots_per_pod() is None


def task_event(kind: str, uuid: str, stamp: float, worker: str = "pod-a", **fields: Any) -> dict[str, Any]:
    return event(f"task-{kind}", worker, uuid=uuid, name="orders.created", timestamp=stamp, **fields)


def test_the_load_counts_the_handler_tasks_stamped_since_it_began_and_outlives_a_pods_series() -> None:
    metrics = state.ServiceMetrics("shop", "billing", queue_wait_buckets=(1.0, 5.0), settings=PER_POD)
    metrics.handler_queues = {"orders.created": "billing.orders.created"}
    metrics.live_pods = lambda: ["pod-a", "pod-b"]
    metrics.ingest(task_event("sent", "t0", 10.0), 0.0)  # nothing is counted before a wait target asks
    metrics.load.since = 100.0
    metrics.ingest(task_event("sent", "old", 99.0), 0.0)  # read again after a reconnect: sent before it
    for index, worker in enumerate(["pod-a", "pod-b"]):
        uuid = f"t{index + 1}"
        metrics.ingest(task_event("sent", uuid, 100.0), 0.0)
        metrics.ingest(task_event("received", uuid, 100.5, worker), 0.0)
        metrics.ingest(task_event("started", uuid, 102.0, worker), 0.0)
        metrics.ingest(task_event("succeeded", uuid, 104.0, worker, runtime=2.0), 0.0)
    metrics.ingest(event("task-started", "pod-a", uuid="other", name="cleanup", queue="celery", timestamp=101.0), 0.0)
    metrics.forget_worker("pod-a", 1.0)  # its per-pod series go; what it ran still counted
    load = metrics.load
    assert (load.sent, load.started, load.runtimes, load.runtime_seconds, load.waits) == (2, 2, 2, 4.0, [0, 2, 0])
