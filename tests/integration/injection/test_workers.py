"""Real Celery workers configured only by what the operator injected, on the operator's topology.

The operator runs for real on the emulated API; its webhook is called with a real AdmissionReview;
the worker runs with the resulting env and files (see tests/support/workers.py for the kubelet's part).
"""

from __future__ import annotations

import base64
import itertools
import json
import pathlib
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_devcluster import jsonpatch
from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.topology import plan
from celery_event_operator.runtime.app import EXCEPTION_HEADER, EXCEPTION_TYPE_HEADER
from tests.conftest import billing_sample, create_broker_secret
from tests.support import rabbitmq, raw_headers
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, admission_review, worker_pod
from tests.support.waiting import stays
from tests.support.workers import Worker, as_kubelet_would

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

APPS = pathlib.Path(__file__).resolve().parent / "apps"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
EVENT_QUEUE = "billing.orders.order.created"
MAX_RETRIES = 3
DELIVERY_LIMIT = 3  # quorum: deliveries of a message whose worker process dies on it, before the archive


@pytest.fixture
def injected_env(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path, queue_type: str
) -> Iterator[dict[str, str]]:
    """The env of a worker pod of `billing` after the webhook, as the kubelet would give it."""
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    service = billing_sample()
    service["spec"]["retry"] = {"maxRetries": MAX_RETRIES}
    service["spec"]["queueType"] = queue_type
    if queue_type == "quorum":
        service["spec"]["deliveryLimit"] = DELIVERY_LIMIT
    service["spec"]["events"]["handlers"] = [{"name": "orders.order.created"}]
    kube_api.client.create(CES, service)
    yield admitted_worker_env(kube_api, operator, tmp_path)
    operator.stop()


def admitted_worker_env(kube_api: EmulatedApi, operator: OperatorProcess, tmp_path: pathlib.Path) -> dict[str, str]:
    """Once the service `billing` is Ready: the env of one of its worker pods after the webhook, as the kubelet would
    give it, and the log its handlers write."""
    eventually(
        lambda: condition(kube_api, "Ready").get("status") == "True",
        timeout=20,
        message="the service never became Ready",
    )
    pod = worker_pod({"celeryevents.io/service": "billing"})
    response = operator.admit(admission_review(pod))["response"]
    pod = jsonpatch.apply(pod, json.loads(base64.b64decode(response["patch"])))
    env = as_kubelet_would(pod, kube_api.client, tmp_path / "mounted-settings")
    return {**env, "HANDLER_LOG": str(tmp_path / "handled.jsonl")}


@pytest.fixture
def worker_factory(injected_env: dict[str, str], tmp_path: pathlib.Path) -> Iterator[Any]:
    started: list[Worker] = []

    def start(*options: str) -> Worker:
        worker = Worker(APPS, "orders_app", injected_env, tmp_path / "worker.log", *options).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:  # the test is over: no shutdown waits for a running task
        if worker.process is not None:
            worker.kill()


def handled(env: dict[str, str]) -> list[dict[str, Any]]:
    path = pathlib.Path(env["HANDLER_LOG"])
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def firing(*events: tuple[int, str]) -> str:
    return (
        "from orders_app import order_created\n"
        f"for order_id, behaviour in {list(events)!r}:\n    order_created(order_id, behaviour)"
    )


def fire(worker: Worker, *events: tuple[int, str]) -> None:
    worker.run(firing(*events))


def archived(url: str) -> list[amqp.Message]:
    messages = []
    with Connection(url) as connection:
        channel = connection.channel()
        while (message := channel.basic_get("billing:archived", no_ack=True)) is not None:
            messages.append(message)
    return messages


def depth(url: str, queue: str) -> int:
    with Connection(url) as connection:
        count: int = connection.channel().queue_declare(queue, passive=True).message_count
        return count


def test_worker_runs_on_injected_settings_alone(worker_factory: Any, injected_env: dict[str, str]) -> None:
    assert set(injected_env) >= {"CELERY_BROKER_URL", "CELERY_CONFIG_MODULE", "CELERY_EVENTS_SETTINGS", "PYTHONPATH"}
    worker = worker_factory("--pool=solo")
    fire(worker, (1, "ok"), (2, "ok"))
    eventually(lambda: {h["order_id"] for h in handled(injected_env)} == {1, 2}, timeout=20)
    assert all(h["exchange"] == "events" for h in handled(injected_env))
    log = worker.log()
    assert "mingle: searching for neighbors" not in log, "mingle is off"
    assert "gossip" not in log.lower().replace("without_gossip", "")


def test_a_worker_declares_nothing_beyond_the_plan(
    worker_factory: Any,
    injected_env: dict[str, str],
    kube_api: EmulatedApi,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    queue_type: str,
) -> None:
    """Issue #13: no PRECONDITION_FAILED, no native delayed delivery (`celery_delayed_*`), nothing else."""
    worker = worker_factory("--pool=solo")
    fire(worker, (1, "ok"))
    eventually(lambda: len(handled(injected_env)) == 1, timeout=20)
    body = kube_api.client.get(f"{CES}/billing")
    topology = plan.plan("billing", CeleryEventServiceSpec.model_validate(body["spec"]))
    held = rabbitmq.snapshot(rabbitmq_management, test_vhost)
    # Celery's own control plane stays: the service's control exchange (kombu's `<control_exchange>.pidbox`)
    # with each worker's auto-deleted pidbox queue, and the reply exchange of `celery inspect`.
    celery_own = {name for name in held["queues"] if name.endswith(".pidbox")}
    assert set(held["queues"]) - celery_own == {queue.name for queue in topology.queues}
    control = {"billing:control.pidbox", "reply.celery.pidbox", "billing:owner"}  # and the operator's claim
    assert set(held["exchanges"]) - control == {exchange.name for exchange in topology.exchanges}
    for queue in topology.queues:
        assert held["queues"][queue.name] == dict(queue.arguments), f"{queue.name} declared with other arguments"
    handler_queue_types = {
        held["queues"][q.name].get("x-queue-type", "classic") for q in topology.queues if q.role == "events"
    }
    assert handler_queue_types == {queue_type}
    assert "PRECONDITION_FAILED" not in worker.log()
    assert "NOT_IMPLEMENTED" not in worker.log()


def test_failures_are_retried_on_the_broker_after_1_2_4_seconds(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str
) -> None:
    worker = worker_factory("--pool=solo")
    fire(worker, (7, "flaky"))
    eventually(lambda: len(handled(injected_env)) == 3, timeout=10)
    # Between the third failure and the fourth attempt (4 s): the message waits on the broker, in
    # retry level 2, and the worker holds nothing (no ETA, nothing reserved or scheduled).
    eventually(lambda: depth(test_vhost_url, "billing:retry.2") == 1, timeout=2)
    inspected = worker.run(
        "import json\nfrom orders_app import app\ni = app.control.inspect(timeout=2)\n"
        "print(json.dumps({'scheduled': i.scheduled(), 'reserved': i.reserved()}))"
    ).stdout
    state = json.loads(inspected)
    assert all(not tasks for tasks in state["scheduled"].values())
    assert all(not tasks for tasks in state["reserved"].values())

    eventually(lambda: len(handled(injected_env)) == 4, timeout=10)
    attempts = handled(injected_env)
    assert [a["retries"] for a in attempts] == [0, 1, 2, 3]
    assert [a["exchange"] for a in attempts] == ["events", "billing:recover", "billing:recover", "billing:recover"]
    gaps = [later["at"] - earlier["at"] for earlier, later in itertools.pairwise(attempts)]
    for gap, expected in zip(gaps, (1, 2, 4), strict=True):
        # Never early; late by the way back through the broker and the worker (more on a busy machine).
        assert expected - 0.2 <= gap <= expected + 2.0, f"redelivered after {gaps}, expected 1, 2, 4 s"
    assert archived(test_vhost_url) == []


def test_always_failing_event_is_archived_with_its_attempts_and_exception(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str
) -> None:
    worker = worker_factory("--pool=solo")
    fire(worker, (9, "always"))
    eventually(lambda: depth(test_vhost_url, "billing:archived") == 1, timeout=20)
    [message] = archived(test_vhost_url)
    assert message.headers["retries"] == MAX_RETRIES + 1, "attempts made: the first and 3 retries"
    assert message.headers[EXCEPTION_TYPE_HEADER] == "KeyError"
    assert "always fails" in message.headers[EXCEPTION_HEADER]
    assert message.headers["task"] == "orders.order.created"
    assert json.loads(message.body)[0] == [9, "always"]
    assert len(handled(injected_env)) == MAX_RETRIES + 1


def test_poison_message_is_archived_after_max_retries_passes(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str, queue_type: str
) -> None:
    """The worker process dies on the message each time: classic queues archive it after maxRetries passes
    through retry level 0, quorum queues through the broker's delivery limit."""
    worker = worker_factory("--pool=prefork", "--concurrency=1")
    fire(worker, (13, "crash"))
    eventually(
        lambda: depth(test_vhost_url, "billing:archived") == 1, timeout=60, message="the poison message kept looping"
    )
    [message] = archived(test_vhost_url)
    if queue_type == "quorum":
        assert message.headers["x-first-death-reason"] == "delivery_limit"
        assert message.headers["x-first-death-queue"] == EVENT_QUEUE
    else:
        assert message.headers[EXCEPTION_TYPE_HEADER] == "PoisonMessageError"
    assert worker.process is not None
    assert worker.process.poll() is None, "the worker itself survived its lost processes"
    fire(worker, (14, "ok"))
    eventually(lambda: any(h["order_id"] == 14 for h in handled(injected_env)), timeout=20)


def test_thousand_events_with_failures_and_a_kill_lose_nothing(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str, record_property: Any
) -> None:
    total = 1000
    events = [(order_id, "always" if order_id % 10 == 0 else "slow") for order_id in range(total)]
    expected_failures = {order_id for order_id, behaviour in events if behaviour == "always"}
    worker = worker_factory("--pool=threads", "--concurrency=8")
    # The producer keeps publishing (with confirms, one by one) while the worker runs and is killed:
    # waiting for it first would let a fast worker finish before the kill on a slow machine.
    producer = worker.spawn(firing(*events))
    eventually(lambda: len(handled(injected_env)) >= 300, timeout=60)
    worker.kill()  # SIGKILL in the middle: whatever it had not acknowledged goes back to the queues
    killed_at = len(handled(injected_env))
    assert killed_at < total - len(expected_failures), "the kill came after the work: make handlers slower"
    worker_factory("--pool=threads", "--concurrency=8")
    _, errors = producer.communicate(timeout=120)
    assert producer.returncode == 0, errors

    succeeded = lambda: {h["order_id"] for h in handled(injected_env)} - expected_failures  # noqa: E731
    eventually(
        lambda: len(succeeded()) == total - len(expected_failures), timeout=120, message="not every event was handled"
    )
    # Wait for every failing event, not for a count: an event the killed worker had archived without
    # acknowledging is archived twice, so the archive can hold 100 messages before the last one arrives.
    archived_ids: Counter[int] = Counter()

    def every_failure_archived() -> bool:
        archived_ids.update(json.loads(message.body)[0][0] for message in archived(test_vhost_url))
        return set(archived_ids) >= expected_failures

    eventually(every_failure_archived, timeout=60, interval=0.5, message="not every failing event was archived")
    assert set(archived_ids) == expected_failures
    runs = Counter(h["order_id"] for h in handled(injected_env) if h["order_id"] not in expected_failures)
    handled_twice = sum(count - 1 for count in runs.values())
    archived_twice = sum(count - 1 for count in archived_ids.values())
    record_property("handled_twice", handled_twice)
    record_property("archived_twice", archived_twice)
    print(
        f"1,000 events, SIGKILL after {killed_at} handler runs: every event handled or archived; "
        f"duplicates: {handled_twice} handled twice, {archived_twice} archived twice"
    )
    # At least once: duplicates only of what the killed worker had taken and not acknowledged.
    assert handled_twice + archived_twice <= 16, "more duplicates than the killed worker had in flight"


def publish_raw(worker: Worker, body: bytes, headers: dict[str, Any], content_type: str = "application/json") -> None:
    """A message on the events exchange as a misbehaving producer sends it."""
    worker.run(
        "from kombu import Connection, Exchange, Producer\n"
        "import os\n"
        "with Connection(os.environ['CELERY_BROKER_URL']) as connection:\n"
        "    Producer(connection.channel()).publish(\n"
        f"        {body!r}, exchange=Exchange('events', type='topic', no_declare=True),\n"
        f"        routing_key='orders.order.created', headers={headers!r},\n"
        f"        content_type={content_type!r}, content_encoding='utf-8', declare=[])\n"
    )


@pytest.mark.parametrize(
    ("message", "exception_type"),
    [
        pytest.param("one argument too few", "TypeError", id="wrong-arguments"),
        pytest.param("a body that does not decode", "DecodeError", id="undecodable"),
        pytest.param("a task no handler is registered for", "NotRegistered", id="unknown-task"),
    ],
)
def test_a_message_that_can_never_succeed_is_archived_at_once_with_its_reason(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str, message: str, exception_type: str
) -> None:
    """Issue #13: such messages looped through the retry levels (243 times in 4 minutes) or were dropped."""
    worker = worker_factory("--pool=solo")
    task_headers = {"lang": "py", "id": "t-1", "root_id": "t-1", "retries": 0, "argsrepr": "()", "kwargsrepr": "{}"}
    if message == "one argument too few":
        worker.run(
            "from orders_app import app\n"
            "app.send_task('orders.order.created', args=(), routing_key='orders.order.created', "
            "exchange='events', declare=[])"
        )
    elif message == "a body that does not decode":
        publish_raw(worker, b'{"not json', task_headers | {"task": "orders.order.created"})
    else:
        publish_raw(
            worker,
            b'[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]',
            task_headers | {"task": "orders.nobody.handles.this"},
        )
    eventually(lambda: depth(test_vhost_url, "billing:archived") == 1, timeout=20, message="not archived")
    [archived_message] = archived(test_vhost_url)
    assert archived_message.headers[EXCEPTION_TYPE_HEADER] == exception_type
    # A looping message would come back within 3 s (the 1 s retry level): archived once, then gone from every queue.
    stays(
        lambda: all(
            depth(test_vhost_url, queue) == 0
            for queue in ("billing:archived", EVENT_QUEUE, "billing:retry", "billing:retry.1", "billing:retry.2")
        ),
        seconds=3,
        interval=0.5,
        message="the message came back to a queue",
    )
    assert handled(injected_env) == [], "the handler never ran"


def phases(env: dict[str, str], order_id: int) -> list[str]:
    return [h["phase"] for h in handled(env) if h["order_id"] == order_id and "phase" in h]


def test_a_rollout_lets_a_running_task_finish_within_the_grace_period(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str
) -> None:
    """Issue #13: SIGTERM (a rollout) while a 4 s task runs: Celery's warm shutdown (SIGTERM is not remapped) takes
    no new task, lets it finish and exits at once, long before its 30 s grace period ends."""
    assert "REMAP_SIGTERM" not in injected_env, "SIGTERM stays Celery's warm shutdown"
    worker = worker_factory("--pool=prefork", "--concurrency=1")
    fire(worker, (21, "long:4"))
    eventually(lambda: phases(injected_env, 21)[:1] == ["started"], timeout=20)
    started = time.monotonic()
    assert phases(injected_env, 21) == ["started"], "the task ended before the SIGTERM: nothing was tested"
    assert worker.stop_as_kubelet(grace_seconds=30) == 0, "gone within the grace period, before a SIGKILL"
    # A margin for a loaded machine: a worker waiting out its grace would take 30 s.
    assert time.monotonic() - started < 15, "gone once the task ended, not at the end of the grace period"
    assert phases(injected_env, 21) == ["started", "done"], "the task finished before the worker went"
    worker_factory("--pool=prefork", "--concurrency=1")
    stays(lambda: phases(injected_env, 21) == ["started", "done"], seconds=3, message="a completed task ran again")
    assert depth(test_vhost_url, EVENT_QUEUE) == 0


def test_a_task_longer_than_the_grace_period_is_handed_back_not_lost(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str
) -> None:
    """An 8 s task on a pod whose grace period is 3 s: the kubelet's SIGKILL ends it; its message, never
    acknowledged, goes back to the queue and the task runs again elsewhere, to its end."""
    worker = worker_factory("--pool=prefork", "--concurrency=1")
    fire(worker, (22, "long:8"))
    eventually(lambda: phases(injected_env, 22) == ["started"], timeout=20)
    assert worker.stop_as_kubelet(grace_seconds=3) is None, "still running at the end of the grace period"
    assert phases(injected_env, 22) == ["started"]
    worker_factory("--pool=prefork", "--concurrency=1")
    eventually(
        lambda: phases(injected_env, 22) == ["started", "started", "done"],
        timeout=30,
        message="the task handed back never ran to its end",
    )
    assert archived(test_vhost_url) == []


def innermost(value: Any) -> Any:
    while isinstance(value, dict) and len(value) == 1:
        [value] = value.values()
    return value


def test_a_header_py_amqp_raised_on_neither_stops_the_worker_nor_loops(
    worker_factory: Any, injected_env: dict[str, str], test_vhost_url: str
) -> None:
    """A timestamp after year 9999 (or a table nested 3,000 deep) in a message's headers raised out of py-amqp's
    decoder in the worker's drain_events (OSError for 2**63 - 1): Celery took it for a lost connection and reconnected
    about five times a second, the message delivered again first each time — on a classic queue for ever, nothing
    behind it ran (one prefork worker exited after 17 s, RESOURCE_LOCKED on its own pidbox queue), on a quorum queue
    until its delivery limit dead-lettered it into the archive. Any producer on the vhost could send it, to every
    service handling the event. It now runs like any other message, its headers kept as sent (amqp_tables)."""
    worker = worker_factory("--pool=prefork", "--concurrency=1")
    stamped = {"stamped": 2**63 - 1}
    deep = raw_headers.nested_item("deep", 3000)
    for order_id, behaviour in ((31, "ok"), (32, "always")):
        body, headers = raw_headers.task_message("orders.order.created", f"t-{order_id}", [order_id, behaviour])
        raw_headers.publish(test_vhost_url, "events", "orders.order.created", body, headers, stamped, deep)
    fire(worker, (33, "ok"))
    eventually(
        lambda: (
            depth(test_vhost_url, "billing:archived") == 1 and any(h["order_id"] == 33 for h in handled(injected_env))
        ),
        timeout=40,
        message="the messages never ran (the worker reconnects on the first?)",
    )
    assert Counter(h["order_id"] for h in handled(injected_env)) == {31: 1, 32: MAX_RETRIES + 1, 33: 1}
    assert "Connection to broker lost" not in worker.log()
    [message] = archived(test_vhost_url)
    assert (message.headers["id"], message.headers[EXCEPTION_TYPE_HEADER]) == ("t-32", "KeyError")
    assert message.headers["stamped"] == 2**63 - 1
    assert isinstance(message.headers["stamped"], amqp_tables.OutOfRangeTimestamp), "still a timestamp"
    assert isinstance(innermost(message.headers["deep"]), amqp_tables.NestedTooDeep)
    assert depth(test_vhost_url, EVENT_QUEUE) == 0
