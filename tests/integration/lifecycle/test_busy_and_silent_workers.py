"""Stuck-worker replacement in the setups Celery teams run, with real workers: every pool, long tasks, heartbeats
switched off, a hung task, a replacement that hangs too. A worker that works is never evicted; one that hangs is
replaced once, and a replacement that hangs the same way is not replaced again.

What cannot exist here: a kubelet and the ReplicaSet controller; fleet.py plays both.
"""

from __future__ import annotations

import re

from celery_event_operator.core.lifecycle.stuck import RECONNECT_SECONDS
from tests.conftest import create_broker_secret
from tests.integration.lifecycle.fleet import (
    CES,
    HANDLER_QUEUE,
    STATUS_INTERVAL_SECONDS,
    STUCK_AFTER_SECONDS,
    WITHOUT_HEARTBEAT,
    Fleet,
    events_of,
    service,
)
from tests.support import rabbitmq
from tests.support.kube import condition, eventually
from tests.support.waiting import stays

# Long enough that silence is judged for a while after the workers had the time to reconnect (RECONNECT_SECONDS).
LONG_TASK_SECONDS = RECONNECT_SECONDS + 4 * STUCK_AFTER_SECONDS
# A task that runs until the test has seen what it waits for and releases it (at most LONG_TASK_SECONDS).
HELD = f"hold:{LONG_TASK_SECONDS}"
MAX_TASK_RUNTIME_SECONDS = 8
POOLS = ("solo", "threads", "prefork", "gevent")


def healthy(fleet: Fleet) -> dict[str, str]:
    found = condition(fleet.api, "WorkersHealthy")
    return found if found.get("status") == "True" else {}


def stuck(fleet: Fleet) -> dict[str, str]:
    found = condition(fleet.api, "WorkersHealthy")
    return found if found.get("status") == "False" else {}


def nothing_evicted_or_stuck(fleet: Fleet, pods: list[str]) -> bool:
    return (
        all(fleet.pod(pod) is not None for pod in pods)
        and condition(fleet.api, "WorkersHealthy").get("status") != "False"
        and not events_of(fleet.api, "WorkerStuck")
        and not events_of(fleet.api, "PodEvicted")
    )


def test_workers_running_tasks_longer_than_the_threshold_are_busy_never_stuck_in_every_pool(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    """A task blocks the solo pool's heartbeats (and can block gevent's): a pod running a task is busy, judged by its
    tasks, and without a time limit never for how long they run."""
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    pods = [f"billing-worker-{pool}" for pool in POOLS]
    for pool, pod in zip(POOLS, pods, strict=True):
        fleet.start(pod, pool=pool, concurrency=1)
    eventually(lambda: healthy(fleet), timeout=30, message="the workers were not judged healthy")
    # One long task each (every pod reserves one message at a time), and three more that wait for a free worker.
    fleet.fire(*[(order_id, HELD) for order_id in range(1, 5)], (5, "ok"), (6, "ok"), (7, "ok"))
    eventually(lambda: all(fleet.phases(order_id) == ["started"] for order_id in range(1, 5)), timeout=30)
    stays(
        lambda: nothing_evicted_or_stuck(fleet, pods),
        seconds=LONG_TASK_SECONDS - 10,
        interval=0.5,
        message="a worker running a task was judged stuck or evicted",
    )
    fleet.release(1, 2, 3, 4)
    eventually(
        lambda: (
            all(fleet.phases(order_id) == ["started", "done"] for order_id in range(1, 5))
            and all(fleet.phases(order_id) == ["handled"] for order_id in range(5, 8))
        ),
        timeout=40,
        message="the long tasks did not each complete once, or the waiting ones were not handled",
    )
    assert nothing_evicted_or_stuck(fleet, pods)
    ran = {h["order_id"]: h for h in fleet.handled() if h.get("phase") == "started"}
    assert all(started["retries"] == 0 for started in ran.values()), "no task was run twice"


def test_a_solo_worker_whose_task_hangs_past_its_limit_is_reported_and_replaced(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type, maxTaskRuntimeSeconds=MAX_TASK_RUNTIME_SECONDS))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    worker = fleet.start("billing-worker-a", pool="solo", concurrency=1)
    eventually(lambda: healthy(fleet), timeout=30)
    fleet.fire((1, "hang-once:600"), (2, "ok"), (3, "ok"), (4, "ok"))
    eventually(lambda: fleet.phases(1) == ["started"], timeout=20)

    found = eventually(lambda: stuck(fleet), timeout=MAX_TASK_RUNTIME_SECONDS + 4 * STATUS_INTERVAL_SECONDS + 10)
    assert found["reason"] == "WorkersStuck"
    # The solo pool sends a task's events once it ended: the running task shows only on the broker (its delivery).
    assert re.search(
        r"billing-worker-a: runs a task its events do not show \(the solo pool sends them when a task ends; the pod "
        rf"holds a delivery on the broker\) for at least \d+\.\d s, past its limit of {MAX_TASK_RUNTIME_SECONDS} s "
        r"\(workers\.maxTaskRuntimeSeconds\)",
        found["message"],
    ), found["message"]
    [warning] = eventually(lambda: events_of(fleet.api, "WorkerStuck"), timeout=10)
    assert f"past its limit of {MAX_TASK_RUNTIME_SECONDS} s" in warning
    # A hung task is no work to keep: the pod's deletion cost says so before it is evicted.
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=20, message="the hung pod was not evicted")
    [evicted] = eventually(lambda: events_of(fleet.api, "PodEvicted"), timeout=10)
    assert "billing-worker-a" in evicted
    assert "the worker is stuck" in evicted

    worker.kill()  # the kubelet's SIGKILL after the grace period: the hung task's message goes back to the queue
    fleet.start("billing-worker-b", pool="solo", concurrency=1)
    eventually(
        lambda: (
            fleet.phases(1)[-1:] == ["handled"] and all(fleet.phases(order_id) == ["handled"] for order_id in (2, 3, 4))
        ),
        timeout=40,
        message="the replacement did not handle the messages that waited",
    )
    eventually(lambda: healthy(fleet), timeout=30, message="the service stayed unhealthy after the replacement")
    assert len(events_of(fleet.api, "PodEvicted")) == 1


def test_a_replacement_that_hangs_the_same_way_is_not_replaced_again(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    """A task that hangs wherever it runs would make an eviction loop: the replacing pauses, says so, and resumes
    when the pods change (a rollout of another pod template)."""
    create_broker_secret(fleet.api, test_vhost_url)
    fleet.api.client.create(CES, service(queue_type, maxTaskRuntimeSeconds=MAX_TASK_RUNTIME_SECONDS))
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    first = fleet.start("billing-worker-a", pool="solo", concurrency=1)
    eventually(lambda: healthy(fleet), timeout=30)
    fleet.fire((1, "long:600"))
    eventually(lambda: fleet.pod("billing-worker-a") is None, timeout=40, message="the hung pod was not evicted")
    first.kill()

    fleet.start("billing-worker-b", pool="solo", concurrency=1)  # the ReplicaSet's replacement gets the same task
    eventually(lambda: fleet.phases(1) == ["started", "started"], timeout=30)
    found = eventually(
        lambda: "replacing paused" in stuck(fleet).get("message", "") and stuck(fleet),
        timeout=MAX_TASK_RUNTIME_SECONDS + 4 * STATUS_INTERVAL_SECONDS + 10,
        message="the loop was not reported",
    )
    assert "billing-worker-b" in found["message"]
    [paused] = eventually(lambda: events_of(fleet.api, "ReplacementPaused"), timeout=10)
    assert "billing-worker-a" in paused
    assert "billing-worker-b" in paused
    stays(
        lambda: fleet.pod("billing-worker-b") is not None and "replacing paused" in stuck(fleet).get("message", ""),
        seconds=4 * STATUS_INTERVAL_SECONDS,
        message="the replacement was evicted in a loop, or the pause was not kept in the condition",
    )
    assert len(events_of(fleet.api, "PodEvicted")) == 1
    scrape = fleet.operator.scrape()
    assert 'celery_event_operator_stuck_replacement_paused{namespace="default",service_name="billing"} 1' in scrape

    # A new pod template (the user's fix rolled out): replacing resumes, and the stuck pod of the old one goes.
    fleet.start("billing-worker-c", template="7c9e", pool="threads")
    eventually(lambda: fleet.pod("billing-worker-b") is None, timeout=30, message="replacing did not resume")
    assert len(events_of(fleet.api, "ReplacementPaused")) == 1


def test_workers_without_heartbeats_on_split_queues_are_never_judged_on_silence_only_on_consumers(
    fleet: Fleet, test_vhost_url: str, queue_type: str
) -> None:
    """Two workers with heartbeats off (as many teams run them, with gossip and mingle off), each on its own handler
    queue (`-Q`), one busy with a long task while messages wait for it: nothing is evicted, WorkersHealthy says
    that their silence cannot be judged (not that they heartbeat, nor that the broker is to blame); a worker that
    then stops consuming is found all the same."""
    create_broker_secret(fleet.api, test_vhost_url)
    body = service(queue_type)
    body["spec"]["events"]["handlers"].append({"name": "orders.order.paid"})
    fleet.api.client.create(CES, body)
    eventually(lambda: condition(fleet.api, "Ready").get("status") == "True", timeout=30)
    created, paid = HANDLER_QUEUE, "billing.orders.order.paid"
    both = {"ORDERS_PAID": "1"}
    fleet.start("billing-worker-a", *WITHOUT_HEARTBEAT, "-Q", created, concurrency=1, env=both)
    b = fleet.start("billing-worker-b", *WITHOUT_HEARTBEAT, "-Q", paid, concurrency=1, env=both)
    b.run("from orders_app import order_paid\norder_paid(100)")
    fleet.fire((1, HELD), (2, "ok"), (3, "ok"), (4, "ok"))
    eventually(lambda: fleet.phases(1) == ["started"] and len(fleet.handled()) == 2, timeout=20)
    found = eventually(
        lambda: "silence is not judged for billing-worker-b:" in healthy(fleet).get("message", "") and healthy(fleet),
        timeout=RECONNECT_SECONDS + 2 * STUCK_AFTER_SECONDS + 10,
        message="the worker without heartbeats was not recognised",
    )
    assert "--without-heartbeat" in found["message"]
    stays(
        lambda: (
            nothing_evicted_or_stuck(fleet, ["billing-worker-a", "billing-worker-b"])
            and "broker" not in condition(fleet.api, "WorkersHealthy").get("message", "")
        ),
        seconds=LONG_TASK_SECONDS - 30,
        interval=0.5,
        message="a worker without heartbeats was judged on silence, or its silence blamed on the broker",
    )
    fleet.release(1)
    eventually(lambda: all(fleet.phases(order_id) == ["handled"] for order_id in (2, 3, 4)), timeout=30)
    message = eventually(
        lambda: "billing-worker-a, billing-worker-b" in healthy(fleet).get("message", "") and healthy(fleet)["message"],
        timeout=2 * STUCK_AFTER_SECONDS + 10,
    )
    assert "heartbeat and consume" not in message
    assert "hostname" not in message

    # Judged on its consumers all the same.
    b.run(
        "from orders_app import app\n"
        f"print(app.control.cancel_consumer({paid!r}, destination=['celery@billing-worker-b'], reply=True))"
    )
    b.run("from orders_app import order_paid\norder_paid(101)")
    found = eventually(
        lambda: stuck(fleet),
        timeout=STUCK_AFTER_SECONDS + 4 * STATUS_INTERVAL_SECONDS + rabbitmq.STATS_LAG_SECONDS + 20,
    )
    assert "billing-worker-b: consumes from no handler queue" in found["message"]
    eventually(lambda: fleet.pod("billing-worker-b") is None, timeout=20, message="the stuck pod was not evicted")
    assert fleet.pod("billing-worker-a") is not None
