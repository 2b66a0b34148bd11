"""Metrics from Celery events with the real operator: real workers, pod deletions through the API,
garbage on the events queue."""

from __future__ import annotations

import base64
import contextlib
import json
import pathlib
import re
import time
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
from tests.support import metric_names, promparse, rabbitmq
from tests.support.kube import EmulatedApi, condition, events, eventually
from tests.support.operator_process import OperatorProcess, admission_review, worker_pod
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


def service_spec(name: str, monitoring: dict[str, Any] | None = None) -> dict[str, Any]:
    service = billing_sample()
    service["metadata"]["name"] = name
    service["spec"]["retry"] = {"maxRetries": 1}
    service["spec"]["events"]["handlers"] = [{"name": TASK}]
    service["spec"]["statusIntervalSeconds"] = 1
    service["spec"]["monitoring"] = {"enabled": True, **(monitoring or {})}
    if name != "billing":
        del service["spec"]["workers"]
    return service


def start_operator(
    kube_api: EmulatedApi, url: str, log: pathlib.Path, *args: str, services: dict[str, dict[str, Any]]
) -> OperatorProcess:
    """The operator with these services (name → spec.monitoring) Ready and consuming their events."""
    create_broker_secret(kube_api, url)
    kube_api.client.create(DEPLOYMENTS, WORKERS)  # billing's scale target: replicas and desired replicas
    process = OperatorProcess(kube_api.kubeconfig, log, *args, resync_seconds=1).start()
    for name, monitoring in services.items():
        kube_api.client.create(CES, service_spec(name, monitoring))
    for name in services:
        eventually(lambda name=name: condition(kube_api, "Ready", name).get("status") == "True", timeout=20)
        eventually(
            lambda name=name: _consuming(url, name),
            timeout=20,
            message=f"the events queue of {name} was never consumed",
        )
    return process


@pytest.fixture
def monitoring_spec() -> dict[str, Any]:
    """billing's spec.monitoring beyond `enabled` (a test parametrizes it to change it)."""
    return {}


@pytest.fixture
def operator(
    kube_api: EmulatedApi,
    crd_installed: dict[str, Any],
    test_vhost_url: str,
    tmp_path: pathlib.Path,
    monitoring_spec: dict[str, Any],
) -> Iterator[OperatorProcess]:
    process = start_operator(kube_api, test_vhost_url, tmp_path / "operator.log", services={"billing": monitoring_spec})
    yield process
    process.stop()


def _consuming(url: str, service: str = "billing") -> bool:
    with Connection(url) as connection:
        try:
            return bool(connection.channel().queue_declare(f"{service}.celeryev", passive=True).consumer_count)
        except amqp.exceptions.NotFound:
            return False


def publish_events(url: str, *events: dict[str, Any] | bytes | list[dict[str, Any]], service: str = "billing") -> None:
    """Each item one message (a list: Celery's batch of events in one message)."""
    with Connection(url) as connection:
        channel = connection.channel()
        for item in events:
            body = item if isinstance(item, bytes) else json.dumps(item)
            channel.basic_publish(
                amqp.Message(body, content_type="application/json"),
                exchange=f"{service}:celeryev",
                routing_key="worker.heartbeat",
            )


def heartbeat(worker: str) -> dict[str, Any]:
    return {"type": "worker-heartbeat", "hostname": f"celery@{worker}", "active": 0, "freq": 2.0, "timestamp": 1.0}


@pytest.mark.parametrize(
    "monitoring_spec",
    [
        pytest.param({}, id="per-service-series"),
        pytest.param({"perPodTaskSeries": True}, id="per-pod-series"),
    ],
)
def test_real_workers_produce_exact_counters(
    kube_api: EmulatedApi, operator: OperatorProcess, tmp_path: pathlib.Path, monitoring_spec: dict[str, Any]
) -> None:
    """By default task series carry no `hostname` (what the celery-mixin queries, whatever the pods); with
    `perPodTaskSeries` they carry the pod's, as celery-exporter's. The counts are the same either way."""
    per_pod = bool(monitoring_spec)
    pod = worker_pod({"celeryevents.io/service": "billing"})
    patch = json.loads(base64.b64decode(operator.admit(admission_review(pod))["response"]["patch"]))
    env = {
        **as_kubelet_would(jsonpatch.apply(pod, patch), kube_api.client, tmp_path / "settings"),
        "HANDLER_LOG": str(tmp_path / "handled.jsonl"),
    }
    worker = Worker(
        APPS, "orders_app", env, tmp_path / "worker.log", "--pool=solo", "--hostname=celery@billing-worker-7f9c-abcde"
    ).start()
    pod_name = "billing-worker-7f9c-abcde"
    task = {"name": TASK, "queue_name": QUEUE, **({"hostname": pod_name} if per_pod else {})}
    sent = {"name": TASK, "queue_name": QUEUE, **({"hostname": "generic"} if per_pod else {})}
    try:
        worker.run(
            "from orders_app import order_created\n"
            "for i in range(3): order_created(i, 'ok')\n"
            "for i in range(2): order_created(10 + i, 'always')\n"
            "order_created(20, 'flaky-once')\n"
            "order_created(30, 'flaky')"  # fails for good with ValueError (maxRetries 1)
        )

        def settled() -> Samples:
            found = scrape(operator)
            assert value(found, "celery_task_failed_total", exception="KeyError", **task) == 2
            assert value(found, "celery_task_failed_total", exception="ValueError", **task) == 1
            assert value(found, "celery_task_succeeded_total", **task) == 4
            assert value(found, "celery_active_consumer_count", queue_name=QUEUE) == 1, "the worker consumes"
            # No order is guaranteed between the kinds (one CI run saw every outcome before the last task-received).
            # Publishes: 3 ok + 3 failing for good (fired, retry copy, archive copy) + 1 flaky-once (fired, retry).
            assert value(found, "celery_task_sent_total", **sent) == 14
            assert value(found, "celery_task_received_total", **task) == 11
            assert value(found, "celery_task_started_total", **task) == 11
            assert value(found, "celery_task_retried_total", exception="KeyError", **task) == 2
            assert value(found, "celery_task_retried_total", exception="ValueError", **task) == 2
            # Gauges of the queues as last listed (each status pass): a retry waiting at the last listing shows
            # until the next one.
            assert value(found, "celery_queue_length", queue_name=QUEUE) == 0
            assert value(found, "celery_event_operator_retry_queue_length", queue_name="billing:retry") == 0
            return found

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
    assert ("celery_event_operator_archive_queue_length", (("queue_name", "billing:archived"),)) in found
    assert value(found, "celery_event_operator_events_consumer_up") == 1
    assert value(found, "celery_event_operator_desired_replicas") == 1
    task_series = [dict(labels) for metric, labels in found if metric.startswith("celery_task_")]
    assert {"hostname" in labels for labels in task_series} == {per_pod}, "hostname on every task series, or none"

    [rule] = [d for d in render({"metrics": {"prometheusRule": {"enabled": True}}}) if d["kind"] == "PrometheusRule"]
    used = metric_names.merged(
        metric_names.alert_uses(rule).items(),
        metric_names.documented_uses((REPO / metric_names.METRICS_PAGE).read_text()).items(),
        metric_names.CELERY_MIXIN.items(),
        metric_names.dashboard_uses(
            json.loads((CHART / "dashboards" / "celery-event-operator.json").read_text())
        ).items(),
    )
    assert {"celery_task_runtime_bucket", "celery_event_operator_reconciles_total"} <= set(used)
    # Series that exist once what they count happened, which this workload never makes: scraped by their own tests.
    elsewhere = {
        "celery_event_operator_task_reruns_total": "tests/integration/lifecycle/test_long_tasks.py",
        "celery_event_operator_estimated_wait_seconds": "tests/integration/cluster/test_wait_target_on_cluster.py",
    }
    missing = metric_names.missing_from(scraped, {k: v for k, v in used.items() if k not in elsewhere})
    assert missing == [], "alerts, the metrics reference, dashboard or mixin use what is not exported"
    assert set(elsewhere) <= set(used), "still documented"
    assert promparse.refusal(scraped.encode()) is None, "Prometheus' own parser reads the scrape"


def task_events(worker: str, number: int) -> list[dict[str, Any]]:
    """A task of `worker` from receipt to success (or failure, every third), as one batch of events."""
    uuid = f"{worker}-{number}"
    host = f"celery@{worker}"
    outcome = (
        {"type": "task-failed", "hostname": host, "uuid": uuid, "exception": "KeyError('x')"}
        if number % 3 == 0
        else {"type": "task-succeeded", "hostname": host, "uuid": uuid, "runtime": 0.1}
    )
    return [
        {"type": "task-received", "hostname": host, "uuid": uuid, "name": f"orders.step{number % 5}"},
        {"type": "task-started", "hostname": host, "uuid": uuid, "timestamp": 1.0},
        outcome,
    ]


def test_deleted_pod_series_go_at_once_and_rollouts_leave_live_pods_only(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    """Per-pod series (celery_worker_up) go with their pod; the task series of the service stay the same
    series through every rollout, and their counters only grow (no reset, no new series per rollout)."""

    def pod(name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"celeryevents.io/service": "billing"}},
            "spec": {"containers": [{"name": "worker", "image": "w"}]},
        }

    def task_series() -> Samples:
        return {key: count for key, count in scrape(operator).items() if key[0].startswith("celery_task_")}

    def received(found: Samples) -> float:
        return sum(count for (metric, _), count in found.items() if metric == "celery_task_received_total")

    previous: list[str] = []
    first: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for rollout in range(20):
        current = [f"worker-{rollout}-{index}" for index in range(10)]
        for name in current:
            kube_api.client.create(PODS, pod(name))
        publish_events(test_vhost_url, *(heartbeat(name) for name in current))
        publish_events(test_vhost_url, *(task_events(name, number) for name in current for number in range(5)))
        for name in previous:
            kube_api.client.delete(f"{PODS}/{name}")
        previous = current
        found = eventually(
            lambda rollout=rollout: received(series := task_series()) == 50 * (rollout + 1) and series,
            timeout=10,
            message="the task counters did not add up across rollouts",
        )
        first = first or set(found)
        assert set(found) == first, "the task series changed with a rollout"
    eventually(
        lambda: workers_in(scrape(operator)) == set(previous), timeout=10, message="series of deleted pods stayed"
    )

    victim = previous[0]
    kube_api.client.delete(f"{PODS}/{victim}")
    eventually(
        lambda: victim not in workers_in(scrape(operator)),
        timeout=5,  # the watch event's way to the operator; without it only the 300 s silence sweep would drop them
        message="the deleted pod's series stayed",
    )
    consumed = value(scrape(operator), "celery_event_operator_events_consumed_total")
    publish_events(test_vhost_url, {"type": "worker-offline", "hostname": f"celery@{victim}", "timestamp": 2.0})
    eventually(lambda: value(scrape(operator), "celery_event_operator_events_consumed_total") > consumed, timeout=5)
    assert victim not in workers_in(scrape(operator)), "a late event does not bring the series back"


def distinct(found: Samples, metric: str, label: str) -> set[str]:
    return {dict(labels)[label] for name, labels in found if name == metric}


def test_a_flood_of_task_names_is_bounded_counted_and_reported_once_and_costs_no_other_service(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """A producer that names every task differently (a bug, or anyone who can publish to the exchange) gets
    its first 500 names (the default) and the rest counted under `__overflow__`, once reported; a second
    service on the same operator keeps its exact series throughout."""
    operator = start_operator(
        kube_api, test_vhost_url, tmp_path / "operator.log", services={"billing": {}, "shipping": {}}
    )
    try:
        flood = [
            {"type": "task-received", "hostname": "celery@pod-a", "uuid": f"u{n}", "name": f"generated.{n}"}
            for n in range(5_000)
        ]
        publish_events(test_vhost_url, *(flood[start : start + 100] for start in range(0, 5_000, 100)))
        publish_events(test_vhost_url, *(task_events("ship-1", number) for number in range(30)), service="shipping")
        billing = eventually(
            lambda: value(found := scrape(operator), "celery_event_operator_events_consumed_total") == 5_000 and found,
            timeout=30,
            message="the flood was not consumed",
        )
        names = distinct(billing, "celery_task_received_total", "name")
        assert len(names - {"__overflow__"}) == 500, "the default bound on task names"
        assert value(billing, "celery_task_received_total", name="__overflow__", queue_name="celery") == 4_500
        assert value(billing, "celery_event_operator_label_values_overflowed_total", label="name") == 4_500
        assert sum(n for (metric, _), n in billing.items() if metric == "celery_task_received_total") == 5_000

        shipping = scrape(operator, "shipping")
        assert distinct(shipping, "celery_task_received_total", "name") == {f"orders.step{n}" for n in range(5)}
        assert value(shipping, "celery_task_received_total", name="orders.step0", queue_name="celery") == 6
        assert (
            value(shipping, "celery_task_failed_total", name="orders.step0", queue_name="celery", exception="KeyError")
            == 2
        )
        assert value(shipping, "celery_task_succeeded_total", name="orders.step1", queue_name="celery") == 4
        assert not [key for key in shipping if "__overflow__" in dict(key[1]).values()]
        overflowed = {dict(labels)["label"]: n for (metric, labels), n in shipping.items() if "overflowed" in metric}
        assert overflowed == {"name": 0, "exception": 0, "queue_name": 0, "hostname": 0}

        def reported() -> list[dict[str, Any]]:
            return events(kube_api, "MetricLabelsOverflowed")

        [event] = eventually(reported, timeout=10, message="the overflow was not reported")
        assert event["type"] == "Warning"
        assert event["involvedObject"]["name"] == "billing"
        assert "500 kept" in event["message"], event["message"]
        seen = int(re.search(r"about ([\d,]+) task names", event["message"]).group(1).replace(",", ""))  # type: ignore[union-attr]
        # Announced by the first status pass that sees the overflow, which may come while the flood is consumed.
        assert 500 < seen <= 5_500, event["message"]
        publish_events(test_vhost_url, *(flood[start : start + 100] for start in range(0, 1_000, 100)))
        stays(lambda: len(reported()) == 1, seconds=3, message="the overflow was reported again")
    finally:
        operator.stop()


def test_operator_wide_defaults_and_the_spec_that_overrides_them(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """`--per-pod-task-series` and `--max-task-names` set the defaults; a service's spec.monitoring wins."""
    operator = start_operator(
        kube_api,
        test_vhost_url,
        tmp_path / "operator.log",
        "--per-pod-task-series",
        "--max-task-names",
        "2",
        services={"billing": {}, "shipping": {"perPodTaskSeries": False, "maxTaskNames": 3}},
    )
    try:
        for service in ("billing", "shipping"):
            publish_events(test_vhost_url, *(task_events("pod-a", number) for number in range(5)), service=service)
        billing = eventually(
            lambda: (
                len(found := scrape(operator)) > 0
                and value(found, "celery_event_operator_events_consumed_total") == 15
                and found
            ),
            timeout=10,
        )
        shipping = eventually(
            lambda: (
                value(found := scrape(operator, "shipping"), "celery_event_operator_events_consumed_total") == 15
                and found
            ),
            timeout=10,
        )
        assert distinct(billing, "celery_task_received_total", "name") == {
            "orders.step0",
            "orders.step1",
            "__overflow__",
        }
        assert distinct(billing, "celery_task_received_total", "hostname") == {"pod-a"}
        assert len(distinct(shipping, "celery_task_received_total", "name")) == 4
        assert not [key for key in shipping if key[0].startswith("celery_task_") and "hostname" in dict(key[1])]
    finally:
        operator.stop()


def test_pod_events_leave_no_log_line(kube_api: EmulatedApi, operator: OperatorProcess) -> None:
    """Issue #16, quiet by default: every event of every worker pod (a status change, a label) once logged
    "Handler 'forget_deleted_pod' succeeded." at INFO. The operator's own watch of the pods logs none of them but
    the deletion's series going (at DEBUG, this test's level)."""
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
    time.sleep(3)
    logged = [line for line in operator.log().splitlines() if "chatty" in line]
    assert len(logged) <= 1, f"a pod's events were logged: {logged}"
    assert all("series of worker default/chatty removed" in line for line in logged), logged


def test_garbage_is_counted_and_metrics_stay_correct(
    kube_api: EmulatedApi, operator: OperatorProcess, test_vhost_url: str
) -> None:
    publish_events(
        test_vhost_url,
        b"\x00\x01\x02",
        b'{"hostname": "celery@x"}',
        b"[1, 2]",
        {"type": "task-received", "hostname": "celery@pod-a", "uuid": "u1", "name": "n", "args": "x" * 100_000},
        # issue 40: a lone surrogate (valid JSON) made every scrape answer 500; a value of 310 digits made
        # Prometheus refuse the page
        b'{"type": "task-sent", "hostname": "celery@p", "uuid": "s1", "name": "bad\\ud800"}',
        b'{"type": "worker-heartbeat", "hostname": "celery@pod-a", "active": %s}' % (b"9" * 310),
        {"type": "task-received", "hostname": "celery@pod-a", "uuid": "u2", "name": "n"},
    )
    found = eventually(
        lambda: (
            value(scrape(operator), "celery_task_received_total", name="n", queue_name="celery") == 1
            and scrape(operator)
        ),
        timeout=10,
    )
    # not JSON, no type, a batch of two non-events, one huge event
    assert value(found, "celery_event_operator_events_malformed_total") == 4
    assert value(found, "celery_task_sent_total", name="bad\ufffd", queue_name="celery") == 1
    for field in ("name", "active"):
        assert value(found, "celery_event_operator_event_values_refused_total", field=field) == 1
    assert promparse.refusal(operator.scrape().encode()) is None
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
