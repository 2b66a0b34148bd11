"""The worker's slots on its heartbeats (runtime/heart.py): Celery's own heart, with `concurrency` on what it sends."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.utils.imports import symbol_by_name

from celery_event_operator.runtime import app, heart


class Dispatcher:
    """The consumer's event dispatcher, as Celery's Heart uses it."""

    enabled = True

    def __init__(self) -> None:
        self.on_enabled: set[Any] = set()
        self.on_disabled: set[Any] = set()
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, type: str, **fields: Any) -> None:
        self.sent.append((type, fields))


class Timer:
    def __init__(self) -> None:
        self.repeated: list[tuple[Any, tuple[Any, ...]]] = []

    def call_repeatedly(self, interval: float, function: Any, args: tuple[Any, ...]) -> object:
        self.repeated.append((function, args))
        return object()

    def cancel(self, tref: object) -> None:
        pass


def consumer(limit: Any = 3, autoscale: Any = None, max_concurrency: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        controller=SimpleNamespace(autoscale=autoscale, max_concurrency=max_concurrency),
        pool=SimpleNamespace(limit=limit),
        event_dispatcher=Dispatcher(),
        timer=Timer(),
    )


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        pytest.param(consumer(limit=3), 3, id="prefork-or-threads"),
        pytest.param(consumer(limit=1), 1, id="solo"),
        pytest.param(consumer(limit=1, autoscale=[4, 1], max_concurrency=4), 4, id="autoscale-the-maximum"),
    ],
)
def test_worker_slots(worker: SimpleNamespace, expected: int) -> None:
    assert heart.worker_slots(worker) == expected


@pytest.mark.parametrize(
    "worker",
    [
        pytest.param(consumer(limit=None), id="no-limit"),
        pytest.param(consumer(limit=0), id="zero"),
        pytest.param(consumer(limit=True), id="bool"),
        pytest.param(SimpleNamespace(controller=None, pool=None), id="no-worker"),
    ],
)
def test_worker_slots_unknown(worker: SimpleNamespace) -> None:
    with pytest.raises((ValueError, AttributeError)):
        heart.worker_slots(worker)


def test_online_heartbeats_and_offline_carry_the_slots_beside_celerys_fields() -> None:
    worker = consumer(limit=3)
    step = heart.SlotsHeart(worker)
    step.start(worker)
    [(beat, args)] = worker.timer.repeated
    beat(*args)
    step.stop(worker)
    sent = worker.event_dispatcher.sent
    assert [kind for kind, _ in sent] == ["worker-online", "worker-heartbeat", "worker-offline"]
    assert all(fields["concurrency"] == 3 for _, fields in sent)
    assert {"freq", "active", "processed", "loadavg", "sw_ident"} <= set(sent[1][1]), "Celery's own fields"


def test_a_pool_size_not_read_leaves_the_field_out_and_the_heart_beating(caplog: pytest.LogCaptureFixture) -> None:
    worker = consumer(limit=None)
    with caplog.at_level(logging.WARNING):
        heart.SlotsHeart(worker).start(worker)
    [(kind, fields)] = worker.event_dispatcher.sent
    assert kind == "worker-online"
    assert "concurrency" not in fields
    assert "pool size is unknown" in caplog.text


def test_the_consumer_runs_the_slots_heart_in_place_of_celerys() -> None:
    steps = app.EventsConsumer.Blueprint.default_steps
    assert heart.CELERY_HEART_STEP in app.Consumer.Blueprint.default_steps, "Celery's name for its step"
    assert heart.CELERY_HEART_STEP not in steps
    assert app.SLOTS_HEART_STEP in steps
    assert symbol_by_name(app.SLOTS_HEART_STEP) is heart.SlotsHeart
