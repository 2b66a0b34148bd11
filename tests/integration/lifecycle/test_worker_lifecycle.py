"""The workers' lifecycle with real Celery workers, the real operator and a real RabbitMQ: deletion costs from
the tasks the pods run, stuck workers found and replaced — never during a broker outage.

What cannot exist here: a kubelet and the ReplicaSet controller; fleet.py plays both. The ReplicaSet's choice of
victims by deletion cost is checked on a real cluster by the e2e suite.
"""

from __future__ import annotations

import signal

from celery_event_operator.core.lifecycle import costs
from celery_event_operator.core.lifecycle.stuck import RECONNECT_SECONDS
from tests.conftest import create_broker_secret
from tests.integration.lifecycle.fleet import (
    CES,
    HANDLER_QUEUE,
    STATUS_INTERVAL_SECONDS,
    STUCK_AFTER_SECONDS,
    Fleet,
    events_of,
    service,
)
from tests.support import rabbitmq
from tests.support.kube import condition, eventually
from tests.support.private_broker import PrivateRabbit
from tests.support.waiting import stays


def test_a_pod_running_a_long_task_costs_more_to_delete_than_an_idle_one(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    fleet.start("billing-worker-busy")
    fleet.fire((1, "long:25"))
    eventually(lambda: [h.get("phase") for h in fleet.handled()] == ["started"], timeout=20)
    fleet.start("billing-worker-idle")
    # After 10 s of running, the busy pod's task would be thrown away by a deletion: it costs more.
    eventually(
        lambda: fleet.deletion_cost("billing-worker-busy") == "1",
        timeout=30,
        message="the busy pod's deletion cost was not set",
    )
    assert fleet.deletion_cost("billing-worker-idle") is None, "an idle pod is not written to (it costs 0)"
    eventually(lambda: [h.get("phase") for h in fleet.handled()] == ["started", "done"], timeout=30)
    # Idle now, the pod keeps its cost a while (the next task of a steady stream would raise it again), then 0.
    stays(
        lambda: fleet.deletion_cost("billing-worker-busy") == "1",
        seconds=costs.LOWER_AFTER_SECONDS / 3,
        message="the cost of a pod idle a moment was lowered at once",
    )
    eventually(
        lambda: fleet.deletion_cost("billing-worker-busy") == "0",
        timeout=costs.LOWER_AFTER_SECONDS + 20,
        message="the finished task's cost stayed",
    )
    assert condition(fleet.api, "WorkersHealthy")["status"] == "True"
    stays(
        lambda: fleet.deletion_cost("billing-worker-idle") is None,
        seconds=4,
        message="the idle pod was patched at rest",
    )


def test_a_worker_that_stops_consuming_is_reported_evicted_and_replaced_nothing_lost(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    worker = fleet.start("billing-worker-a")
    fleet.fire((1, "ok"), (2, "ok"))
    eventually(lambda: len(fleet.handled()) == 2, timeout=20)
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)

    # The process and its heartbeats go on; its consumer of the handler queue is gone.
    worker.run(
        "from orders_app import app\n"
        f"print(app.control.cancel_consumer({HANDLER_QUEUE!r}, destination=['celery@billing-worker-a'], reply=True))"
    )
    fleet.fire(*[(order_id, "ok") for order_id in range(3, 13)])
    stuck = eventually(
        lambda: (
            condition(fleet.api, "WorkersHealthy").get("status") == "False" and condition(fleet.api, "WorkersHealthy")
        ),
        timeout=STUCK_AFTER_SECONDS + 3 * STATUS_INTERVAL_SECONDS + rabbitmq.STATS_LAG_SECONDS + 20,
        message="the worker that consumes nothing was not reported",
    )
    assert stuck["reason"] == "WorkersStuck"
    assert "billing-worker-a: consumes from no handler queue" in stuck["message"]
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=20, message="the stuck pod was not evicted")
    [warning] = eventually(lambda: events_of(fleet.api, "WorkerStuck"), timeout=10)
    assert "billing-worker-a" in warning
    eventually(lambda: any("the worker is stuck" in message for message in events_of(fleet.api, "PodEvicted")))

    # The ReplicaSet's replacement; the evicted pod's worker gets its SIGTERM.
    worker.terminate()
    fleet.start("billing-worker-b")
    eventually(
        lambda: sorted(h["order_id"] for h in fleet.handled()) == list(range(1, 13)),
        timeout=40,
        message="the messages that waited were not all handled",
    )
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)
    assert len(events_of(fleet.api, "PodEvicted")) == 1, "one eviction"


def test_a_worker_stopped_with_sigstop_is_reported_and_replaced(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    worker = fleet.start("billing-worker-a")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)
    assert worker.process is not None
    worker.process.send_signal(signal.SIGSTOP)  # the process hangs: no heartbeat, the pod still Running
    stuck = eventually(
        lambda: (
            condition(fleet.api, "WorkersHealthy").get("status") == "False" and condition(fleet.api, "WorkersHealthy")
        ),
        # Silence counts once the workers had the time to reconnect after the events were first consumed.
        timeout=RECONNECT_SECONDS + STUCK_AFTER_SECONDS + 3 * STATUS_INTERVAL_SECONDS + 10,
        message="the silent worker was not reported",
    )
    assert "billing-worker-a: no heartbeat or event for" in stuck["message"]
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=20, message="the silent pod was not evicted")
    worker.kill()
    fleet.start("billing-worker-b")
    fleet.fire((1, "ok"))
    eventually(lambda: len(fleet.handled()) == 1, timeout=20, message="the replacement does not consume")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)


def test_a_broker_outage_evicts_nothing_and_reports_the_broker(fleet: Fleet, private_rabbit: PrivateRabbit) -> None:
    create_broker_secret(fleet.api, private_rabbit.url)
    fleet.api.client.create(CES, service())
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    fleet.start("billing-worker-a")
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=20)

    private_rabbit.stop()
    eventually(lambda: condition(fleet.api, "BrokerReachable").get("status") == "False", timeout=30)
    stays(
        lambda: (
            fleet.pod("billing-worker-a") is not None
            and condition(fleet.api, "WorkersHealthy").get("status") != "False"
        ),
        seconds=3 * STUCK_AFTER_SECONDS,
        message="a worker was judged during the outage",
    )
    assert condition(fleet.api, "WorkersHealthy")["reason"] == "NotChecked"
    private_rabbit.start()
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=90)
    eventually(lambda: condition(fleet.api, "WorkersHealthy").get("status") == "True", timeout=60)
    assert fleet.pod("billing-worker-a") is not None
    assert events_of(fleet.api, "WorkerStuck") == []
    assert events_of(fleet.api, "PodEvicted") == []
