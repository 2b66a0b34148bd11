"""A task's wait is measured from its publish time where its task-sent never reaches the service: a producer of
another service (its task-sent goes to its own events exchange) publishes with the runtime, which stamps the publish
time in a header; the handler's real worker puts it in the task-started event of the task's first delivery, and the
operator's metrics state measures the wait from it. Real Celery worker and producer, real broker."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from celery_event_operator.core import naming
from celery_event_operator.core.monitoring.state import ServiceMetrics
from tests.integration.monitoring.test_worker_slots import APPS, injected_env, service_events
from tests.support.kube import eventually
from tests.support.workers import Worker

__all__ = ["injected_env"]  # the fixture, shared

HOLD_SECONDS = 3.0
# A producer of another service: no task-sent reaches this service's events exchange.
PRODUCER = (
    "import time\n"
    "from orders_app import app, order_created\n"
    "app.conf.task_send_sent_event = False\n"
    f"order_created(1, 'long:{HOLD_SECONDS}')\n"  # the one slot runs this for a while
    "order_created(2, 'ok')\n"  # and this waits in the queue meanwhile (prefetch 1: not even received)
    "order_created(3, 'flaky-once')\n"  # its retry waited in a retry level on purpose: no publish time
    "print(time.time())\n"
)


def test_the_wait_of_a_task_from_another_services_producer_counts_from_its_publish(
    injected_env: dict[str, str], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    env = {**injected_env, "HANDLER_LOG": str(tmp_path / "handled.jsonl")}
    worker = Worker(APPS, "orders_app", env, tmp_path / "worker.log", "--pool=solo", "--hostname=celery@billing-w-1")
    metrics = ServiceMetrics("default", "billing")
    queue = naming.handler_queue_name("billing", "orders.order.created")
    metrics.handler_queues = {"orders.order.created": queue}
    started: list[dict[str, Any]] = []  # the task-started events, in order

    def all_ended() -> bool:
        while (message := task_events.get(no_ack=True, accept=["json"])) is not None:
            metrics.ingest_message(message.body, 1.0)  # the operator's own parsing of the bytes it consumes
            decoded = json.loads(message.body)
            started.extend(
                e for e in (decoded if isinstance(decoded, list) else [decoded]) if e["type"] == "task-started"
            )
        return len(started) == 4  # three tasks and one retry

    with service_events(test_vhost_url, "published-test", "task.#") as task_events:
        worker.start()
        try:
            done = worker.run(PRODUCER)
            eventually(all_ended, timeout=60, interval=0.5, message="not every task started")
        finally:
            worker.stop()
    published_by = float(done.stdout.split()[-1])
    stamped = [event.get(naming.PUBLISHED_AT_FIELD) for event in started]
    assert all(isinstance(stamp, float) and stamp <= published_by for stamp in stamped[:3]), started
    assert stamped[3] is None, "a retry carries no publish time: it waited in a retry level on purpose"
    waited = [event["timestamp"] - stamp for event, stamp in zip(started[:3], stamped[:3], strict=True)]
    assert waited[1] >= HOLD_SECONDS - 0.5, ("the second task waited behind the first", waited)
    # The operator's histogram: three waits from the publish (one ≥ 2.5 s) and the retry's from its receipt.
    series = ("orders.order.created", "", queue)
    assert sum(metrics.queue_wait.counts[series]) == 4
    assert metrics.queue_wait.sums[series] >= HOLD_SECONDS - 0.5
    assert metrics.refused_values.get(naming.PUBLISHED_AT_FIELD, 0) == 0
