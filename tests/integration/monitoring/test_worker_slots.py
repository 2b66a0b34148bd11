"""Each worker says how many tasks it runs at once: real Celery workers of several pools, configured by what the
operator injected, on the real broker; their worker-online and worker-heartbeat events read from the service's events
exchange into the operator's metrics state, as its events consumer reads them."""

from __future__ import annotations

import contextlib
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from celery_event_operator.core import naming
from celery_event_operator.core.monitoring.state import ServiceMetrics
from tests.conftest import billing_sample, create_broker_secret
from tests.integration.injection.test_workers import admitted_worker_env
from tests.support.kube import EmulatedApi, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.workers import Worker

APPS = pathlib.Path(__file__).resolve().parents[1] / "injection" / "apps"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
# pod name → the worker's pool options, and the slots it must report. The threads pool cannot grow (Celery's
# autoscaler ends a threads worker when it tries), so autoscaling is shown on prefork.
POOLS = {
    "prefork-3": (("--pool=prefork", "--concurrency=3"), 3),
    "solo": (("--pool=solo",), 1),
    "prefork-autoscale-4-1": (("--pool=prefork", "--autoscale=4,1"), 4),
    "threads-2": (("--pool=threads", "--concurrency=2"), 2),
    "gevent-5": (("--pool=gevent", "--concurrency=5"), 5),
}


@pytest.fixture
def injected_env(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str, tmp_path: pathlib.Path
) -> dict[str, str]:
    """The env of a worker pod of `billing` after the webhook, as the kubelet would give it (its topology declared)."""
    create_broker_secret(kube_api, test_vhost_url)
    service = billing_sample()
    service["spec"]["events"]["handlers"] = [{"name": "orders.order.created"}]
    service["spec"]["monitoring"] = {"enabled": True}  # the events exchange is declared with the topology
    kube_api.client.create(CES, service)
    return admitted_worker_env(kube_api, operator, tmp_path)


@contextlib.contextmanager
def service_events(url: str, name: str, routing_key: str) -> Iterator[Queue]:
    """A queue of billing's Celery events of the test's own (the operator's queue is its own consumer's)."""
    with Connection(url) as connection:
        exchange = Exchange(naming.event_exchange_name("billing"), type="topic", passive=True)
        queue = Queue(name, exchange, routing_key=routing_key, auto_delete=True)(connection.default_channel)
        queue.declare()
        yield queue
        queue.delete()


@pytest.fixture
def worker_events(test_vhost_url: str, injected_env: dict[str, str]) -> Iterator[Queue]:
    with service_events(test_vhost_url, "slots-test", "worker.#") as queue:
        yield queue


def test_workers_report_their_slots_on_every_pool(
    injected_env: dict[str, str], worker_events: Queue, tmp_path: pathlib.Path
) -> None:
    workers = [
        Worker(APPS, "orders_app", injected_env, tmp_path / f"{pod}.log", f"--hostname=celery@{pod}", *options)
        for pod, (options, _) in POOLS.items()
    ]
    metrics = ServiceMetrics("default", "billing")
    reported: dict[tuple[str, str], Any] = {}  # (event type, pod) → its `concurrency` ("absent" without it)

    def heard_from_all() -> bool:
        while (message := worker_events.get(no_ack=True, accept=["json"])) is not None:
            body = message.body
            metrics.ingest_message(body, 1.0)  # the operator's own parsing of the bytes it consumes
            decoded = json.loads(body)
            for event in decoded if isinstance(decoded, list) else [decoded]:
                pod = event["hostname"].rpartition("@")[2]
                reported[(event["type"], pod)] = event.get(naming.CONCURRENCY_FIELD, "absent")
        return all((kind, pod) in reported for pod in POOLS for kind in ("worker-online", "worker-heartbeat"))

    try:
        for worker in workers:
            worker.start()
        eventually(heard_from_all, timeout=30, interval=0.5, message="not every worker came online and heartbeat")
    finally:
        for worker in workers:
            worker.stop()
    for pod, (_, slots) in POOLS.items():
        assert reported[("worker-online", pod)] == slots, pod
        assert reported[("worker-heartbeat", pod)] == slots, pod
    assert metrics.worker_slots == {pod: slots for pod, (_, slots) in POOLS.items()}
    assert metrics.refused_values.get(naming.CONCURRENCY_FIELD, 0) == 0
