"""Metrics from Celery events with the real operator: real workers, pod deletions through the API,
garbage on the events queue."""

from __future__ import annotations

import base64
import contextlib
import json
import pathlib
import urllib.error
import urllib.parse
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection
from prometheus_client.parser import text_string_to_metric_families

from celery_event_devcluster import jsonpatch
from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.integration.injection.test_webhook import worker_pod
from tests.support import metric_names, rabbitmq
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, admission_review
from tests.support.waiting import stays
from tests.support.workers import Worker, as_kubelet_would
from tests.unit.chart.test_chart import CHART, render

APPS = REPO / "tests" / "integration" / "injection" / "apps"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
WORKERS = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "billing-worker"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "billing-worker"}},
        "template": {
            "metadata": {"labels": {"app": "billing-worker"}},
            "spec": {"containers": [{"name": "w", "image": "w"}]},
        },
    },
}
TASK = "orders.order.created"
QUEUE = "billing.orders.order.created"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(operator: OperatorProcess, service: str = "billing") -> Samples:
    return {
        (
            sample.name,
            tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("namespace", "service_name"))),
        ): sample.value
        for family in text_string_to_metric_families(operator.scrape())
        for sample in family.samples
        if sample.labels.get("service_name") == service
    }


def value(found: Samples, metric: str, **labels: str) -> float:
    return found.get((metric, tuple(sorted(labels.items()))), 0.0)


def workers_in(found: Samples) -> set[str]:
    return {dict(labels)["hostname"] for _, labels in found if "hostname" in dict(labels)} - {"generic"}


@pytest.fixture
def operator(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    create_broker_secret(kube_api, test_vhost_url)
    kube_api.client.create(DEPLOYMENTS, WORKERS)  # the service's scale target: replicas and desired replicas
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    service = billing_sample()
    service["spec"]["retry"] = {"maxRetries": 1}
    service["spec"]["events"]["handlers"] = [{"name": TASK}]
    service["spec"]["statusIntervalSeconds"] = 1
    kube_api.client.create(CES, service)
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True", timeout=20)
    eventually(lambda: _consuming(test_vhost_url), timeout=20, message="the events queue was never consumed")
    yield process
    process.stop()


def _consuming(url: str) -> bool:
    with Connection(url) as connection:
        try:
            return bool(connection.channel().queue_declare("billing.celeryev", passive=True).consumer_count)
        except amqp.exceptions.NotFound:
            return False


def publish_events(url: str, *events: dict[str, Any] | bytes) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for item in events:
            body = item if isinstance(item, bytes) else json.dumps(item)
            channel.basic_publish(
                amqp.Message(body, content_type="application/json"),
                exchange="billing:celeryev",
                routing_key="worker.heartbeat",
            )


def heartbeat(worker: str) -> dict[str, Any]:
    return {"type": "worker-heartbeat", "hostname": f"celery@{worker}", "active": 0, "freq": 2.0, "timestamp": 1.0}


def test_real_workers_produce_exact_counters(
    kube_api: EmulatedApi, operator: OperatorProcess, tmp_path: pathlib.Path
) -> None:
    pod = worker_pod({"celeryevents.io/service": "billing"})
    patch = json.loads(base64.b64decode(operator.admit(admission_review(pod))["response"]["patch"]))
    env = {
        **as_kubelet_would(jsonpatch.apply(pod, patch), kube_api.client, tmp_path / "settings"),
        "HANDLER_LOG": str(tmp_path / "handled.jsonl"),
    }
    worker = Worker(
        APPS, "orders_app", env, tmp_path / "worker.log", "--pool=solo", "--hostname=celery@billing-worker-7f9c-abcde"
    ).start()
    try:
        worker.run(
            "from orders_app import order_created\n"
            "for i in range(3): order_created(i, 'ok')\n"
            "for i in range(2): order_created(10 + i, 'always')\n"
            "order_created(20, 'flaky-once')\n"
            "order_created(30, 'flaky')"  # fails for good with ValueError (maxRetries 1)
        )
        pod_name = "billing-worker-7f9c-abcde"

        def settled() -> Samples:
            found = scrape(operator)
            assert value(found, "celery_task_failed_total", exception="KeyError", **task) == 2
            assert value(found, "celery_task_failed_total", exception="ValueError", **task) == 1
            assert value(found, "celery_task_succeeded_total", **task) == 4
            assert value(found, "celery_active_consumer_count", queue_name=QUEUE) == 1, "the worker consumes"
            # No order is guaranteed between the kinds (one CI run saw every outcome before the last task-received).
            # Publishes: 3 ok + 3 failing for good (fired, retry copy, archive copy) + 1 flaky-once (fired, retry).
            assert value(found, "celery_task_sent_total", name=TASK, hostname="generic", queue_name=QUEUE) == 14
            assert value(found, "celery_task_received_total", **task) == 11
            assert value(found, "celery_task_started_total", **task) == 11
            assert value(found, "celery_task_retried_total", exception="KeyError", **task) == 2
            assert value(found, "celery_task_retried_total", exception="ValueError", **task) == 2
            return found

        task = {"name": TASK, "hostname": pod_name, "queue_name": QUEUE}
        found = eventually(settled, timeout=30, message="the events did not add up")
        scraped = operator.scrape()
    finally:
        worker.stop()
    for kind, labels in (("failed", {"exception": "", **task}), ("rejected", task), ("revoked", task)):
        assert found[(f"celery_task_{kind}_total", tuple(sorted(labels.items())))] == 0, "celery-exporter's zero series"
    assert value(found, "celery_task_runtime_count", **task) == 4
    assert value(found, "celery_task_runtime_bucket", le="+Inf", **task) == 4
    # every start: 7 from their sending, the 4 retries from their receipt (the retry level's delay is deliberate)
    assert value(found, "celery_task_queue_wait_time_count", **task) == 11
    assert value(found, "celery_task_queue_wait_time_bucket", le="+Inf", **task) == 11
    assert value(found, "celery_task_queue_wait_time_bucket", le="5.0", **task) == 11, "nothing waited for long"
    assert value(found, "celery_worker_up", hostname=pod_name) == 1
    assert value(found, "celery_queue_length", queue_name=QUEUE) == 0
    assert ("celery_event_operator_archive_queue_length", (("queue_name", "billing:archived"),)) in found
    assert value(found, "celery_event_operator_retry_queue_length", queue_name="billing:retry") == 0
    assert value(found, "celery_event_operator_events_consumer_up") == 1
    assert value(found, "celery_event_operator_desired_replicas") == 1

    [rule] = [d for d in render({"metrics": {"prometheusRule": {"enabled": True}}}) if d["kind"] == "PrometheusRule"]
    used = metric_names.merged(
        metric_names.alert_uses(rule).items(),
        metric_names.readme_uses((REPO / "README.md").read_text()).items(),
        metric_names.CELERY_MIXIN.items(),
        metric_names.dashboard_uses(
            json.loads((CHART / "dashboards" / "celery-event-operator.json").read_text())
        ).items(),
    )
    assert {"celery_task_runtime_bucket", "celery_event_operator_reconciles_total"} <= set(used)
    assert metric_names.missing_from(scraped, used) == [], "alerts, README, dashboard or mixin use what is not exported"


def test_deleted_pod_series_go_at_once_and_rollouts_leave_live_pods_only(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    def pod(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"celeryevents.io/service": "billing"}},
            "spec": {"containers": [{"name": "worker", "image": "w"}]},
        }

    previous: list[str] = []
    for rollout in range(20):
        current = [f"worker-{rollout}-{index}" for index in range(10)]
        for name in current:
            kube_api.client.create(PODS, pod(name))
        publish_events(test_vhost_url, *(heartbeat(name) for name in current))
        for name in previous:
            kube_api.client.delete(f"{PODS}/{name}")
        previous = current
    eventually(
        lambda: workers_in(scrape(operator)) == set(previous), timeout=10, message="series of deleted pods stayed"
    )

    victim = previous[0]
    kube_api.client.delete(f"{PODS}/{victim}")
    eventually(
        lambda: victim not in workers_in(scrape(operator)),
        timeout=5,  # the watch event's way to the handler; without it only the 300 s silence sweep would drop them
        message="the deleted pod's series stayed",
    )
    publish_events(test_vhost_url, {"type": "worker-offline", "hostname": f"celery@{victim}", "timestamp": 2.0})
    eventually(lambda: value(scrape(operator), "celery_event_operator_events_consumed_total") >= 201, timeout=5)
    assert victim not in workers_in(scrape(operator)), "a late event does not bring the series back"


def test_pod_events_leave_no_log_line_but_a_deletion(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    """Issue #16, quiet by default: every event of every worker pod (a status change, a label) logged
    "Handler 'forget_deleted_pod' succeeded." at INFO; only a deletion has something to do."""
    kube_api.client.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chatty", "labels": {"celeryevents.io/service": "billing"}},
            "spec": {"containers": [{"name": "worker", "image": "w"}]},
        },
    )
    for number in range(5):
        kube_api.client.merge_patch(f"{PODS}/chatty", {"metadata": {"labels": {"change": str(number)}}})
    kube_api.client.delete(f"{PODS}/chatty")

    def handled() -> int:
        return operator.log().count("Handler 'forget_deleted_pod' succeeded.")

    eventually(lambda: handled() >= 1, timeout=10, message="the deletion was not handled")
    stays(lambda: handled() == 1, seconds=2, message="pod events other than the deletion were logged")


def test_garbage_is_counted_and_metrics_stay_correct(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    publish_events(
        test_vhost_url,
        b"\x00\x01\x02",
        b'{"hostname": "celery@x"}',
        b"[1, 2]",
        {"type": "task-received", "hostname": "celery@pod-a", "uuid": "u1", "name": "n", "args": "x" * 100_000},
        {"type": "task-received", "hostname": "celery@pod-a", "uuid": "u2", "name": "n"},
    )
    found = eventually(
        lambda: (
            value(scrape(operator), "celery_task_received_total", name="n", hostname="pod-a", queue_name="celery") == 1
            and scrape(operator)
        ),
        timeout=10,
    )
    # not JSON, no type, a batch of two non-events, one huge event
    assert value(found, "celery_event_operator_events_malformed_total") == 4
    assert operator.alive()


def test_the_events_consumer_readiness_turns_0_while_it_cannot_consume(
    operator: OperatorProcess, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    def consumer_up() -> float:
        return value(scrape(operator), "celery_event_operator_events_consumer_up")

    eventually(lambda: consumer_up() == 1, timeout=10, message="the consuming consumer was not reported up")
    vhost = rabbitmq_management.vhost_path(test_vhost)
    user = urllib.parse.quote(rabbitmq_management.request("GET", "/whoami")["name"])

    def allow_reading(read: str) -> None:
        permissions = {"configure": ".*", "write": ".*", "read": read}
        rabbitmq_management.request("PUT", f"/permissions/{vhost}/{user}", permissions)

    def refused() -> bool:
        # the management API lists a new connection late: close what it lists until the consumer is down
        for connection in rabbitmq_management.connections(test_vhost):
            name = urllib.parse.quote(connection["name"], safe="")
            with contextlib.suppress(urllib.error.HTTPError):  # closed meanwhile
                rabbitmq_management.request("DELETE", f"/connections/{name}")
        return consumer_up() == 0

    allow_reading("^$")  # the consumer reconnects and is refused its queue
    eventually(refused, timeout=30, message="a refused consumer was still reported up")
    allow_reading(".*")
    eventually(lambda: consumer_up() == 1, timeout=70, message="the consumer did not come back up")


def test_deleting_the_service_removes_its_series(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    publish_events(test_vhost_url, heartbeat("pod-z"))
    eventually(lambda: "pod-z" in workers_in(scrape(operator)), timeout=10)
    kube_api.client.delete(f"{CES}/billing")
    eventually(lambda: scrape(operator) == {}, timeout=15, message="the deleted service's series stayed")
