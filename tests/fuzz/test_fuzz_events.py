"""Celery events of any shape → a service's metrics → the exposition: nothing raises, Prometheus' own parser reads
every scrape (labels valid UTF-8 and escaped, values finite float64), one service's input never changes another
service's block, and a worker's slots are only ever what it reported within bounds."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from celery_event_operator.adapters.monitoring.collector import MetricsRegistry
from celery_event_operator.core.monitoring.bounds import MAX_WORKER_SLOTS, SeriesSettings
from celery_event_operator.core.monitoring.state import TASK_EVENT_KINDS, ServiceMetrics
from tests.fuzz.strategies import JSON, NUMBERS, SCALARS, TEXT, nested
from tests.support import promparse

KINDS = st.sampled_from(
    [f"task-{kind}" for kind in TASK_EVENT_KINDS] + ["worker-online", "worker-heartbeat", "worker-offline"]
)
HOSTNAMES = st.one_of(st.sampled_from(["celery@pod-a", "celery@pod-b", "celery@", "@"]), TEXT.map("celery@{}".format))
FIELDS = {
    "uuid": st.one_of(st.sampled_from(["u1", "u2", "u3"]), TEXT),
    "name": st.one_of(st.sampled_from(["orders.created", "reports.build"]), TEXT),
    "exception": st.one_of(st.sampled_from(["KeyError('x')", "Retry in 1s: E(1)"]), TEXT),
    "queue": TEXT,
    "timestamp": NUMBERS,
    "runtime": NUMBERS,
    "active": NUMBERS,
    "concurrency": st.one_of(st.integers(min_value=1, max_value=MAX_WORKER_SLOTS), NUMBERS, TEXT),  # our runtime's
    "published_at": st.one_of(NUMBERS, TEXT),  # our runtime's
    "eta": SCALARS,
    "retries": SCALARS,
}
# Well formed, with any text and any number in its fields: what gets past the checks of shape.
EVENT = st.fixed_dictionaries({"type": KINDS, "hostname": HOSTNAMES}, optional=FIELDS)
# Of any shape: every field of any JSON type, unknown types.
ODD_EVENT = st.fixed_dictionaries(
    {"type": st.one_of(KINDS, st.sampled_from(["task-custom", "worker-", "task-", "other"]), TEXT, JSON)},
    optional={"hostname": st.one_of(HOSTNAMES, JSON), **{field: JSON for field in FIELDS}},
)


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()  # lone surrogates as \ud800 escapes, NaN and Infinity as Python writes them


MESSAGES = st.one_of(
    EVENT.map(encoded),
    st.lists(EVENT, min_size=1, max_size=4).map(encoded),
    ODD_EVENT.map(encoded),
    st.lists(st.one_of(EVENT, ODD_EVENT, JSON), max_size=4).map(encoded),
    JSON.map(encoded),
    st.binary(max_size=60),
    st.tuples(EVENT.map(encoded), st.integers(min_value=0)).map(lambda cut: cut[0][: cut[1] % (len(cut[0]) + 1)]),
    st.integers(min_value=900, max_value=5_000).map(nested),
)
OPERATIONS = st.lists(
    st.one_of(
        MESSAGES.map(lambda body: ("message", body)),
        st.tuples(st.just("oversized"), MESSAGES, MESSAGES),
        st.tuples(st.just("forget"), st.sampled_from(["pod-a", "pod-b"])),
        st.just(("sweep",)),
    ),
    max_size=25,
)
NEIGHBOUR_EVENTS = [
    encoded({"type": "task-sent", "hostname": "celery@p", "uuid": "n1", "name": "mail.send", "timestamp": 1.0}),
    encoded({"type": "task-received", "hostname": "celery@pod-n", "uuid": "n1", "timestamp": 2.0}),
    encoded({"type": "task-started", "hostname": "celery@pod-n", "uuid": "n1", "timestamp": 3.0}),
    encoded({"type": "task-succeeded", "hostname": "celery@pod-n", "uuid": "n1", "runtime": 0.5}),
    encoded({"type": "worker-heartbeat", "hostname": "celery@pod-n", "active": 1}),
]


def apply(metrics: ServiceMetrics, operation: tuple[Any, ...], now: float) -> None:
    match operation:
        case ("message", body):
            metrics.ingest_message(body, now)
        case ("oversized", head, tail):
            metrics.ingest_oversized(head, tail, len(head) + len(tail) + 10**6, now)
        case ("forget", worker):
            metrics.forget_worker(worker, now)
        case _:
            metrics.sweep(["pod-a"], now, silence_seconds=5)


def scraped(registry: MetricsRegistry) -> bytes:
    return b"".join(asyncio.run(registry.scrape(gzip=False)))


def block(registry: MetricsRegistry, service: str) -> tuple[bytes, ...]:
    return registry._services[("shop", service)][1].plain


@given(operations=OPERATIONS, per_pod=st.booleans())
def test_any_events_give_a_scrape_prometheus_parses_and_leave_other_services_as_they_were(
    operations: list[tuple[Any, ...]], per_pod: bool
) -> None:
    settings = SeriesSettings(per_pod=per_pod, max_task_names=3)  # small: the overflow paths are walked too
    registry, alone = MetricsRegistry(defaults=settings), MetricsRegistry(defaults=settings)
    hostile = registry.service("shop", "hostile")
    hostile.handler_queues = {"orders.created": "hostile.orders.created"}
    neighbours = (registry.service("shop", "neighbour"), alone.service("shop", "neighbour"))
    for number, operation in enumerate(operations):
        apply(hostile, operation, float(number))  # raises nothing, whatever the input
        for neighbour in neighbours:
            neighbour.ingest_message(NEIGHBOUR_EVENTS[number % len(NEIGHBOUR_EVENTS)], float(number))
    text = scraped(registry)
    assert promparse.refusal(text) is None
    for family in text_string_to_metric_families(text.decode("utf-8")):  # strict UTF-8
        assert all(math.isfinite(sample.value) for sample in family.samples), family.name
    scraped(alone)
    assert block(registry, "neighbour") == block(alone, "neighbour")
    slots = hostile.worker_slots
    assert all(type(count) is int and 1 <= count <= MAX_WORKER_SLOTS for count in slots.values()), slots
    assert set(slots) <= set(hostile.last_heard), "remembered only of workers remembered"
    assert hostile.slots_per_pod() in {None, *slots.values()}
