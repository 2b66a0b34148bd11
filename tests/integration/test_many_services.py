"""Many services on one operator (issue #11), classic and quorum side by side: every service keeps its status,
metrics and autoscaling, and a broken one delays none of the others; two shards split the services without gap
or overlap."""

from __future__ import annotations

import json
import pathlib
import re
import urllib.parse
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.broker.control import LINE_IDLE_SECONDS
from celery_event_operator.core import naming
from celery_event_operator.core.options import shard_of
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, admission_review

COUNT = 30
INTERVAL = 2
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"


def name(index: int) -> str:
    return f"svc-{index:02d}"


def event(index: int) -> str:
    return f"orders.created-{index:02d}"


def service(index: int, secret: str = "rabbitmq") -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name(index)},
        "spec": {
            "broker": {"secretRef": {"name": secret, "key": "url"}},
            "events": {"handlers": [{"name": event(index)}]},
            "retry": {"maxRetries": 1},
            "queueType": "quorum" if index % 2 else "classic",  # both kinds side by side, as teams run them
            "statusIntervalSeconds": INTERVAL,
            "workers": {"scaleTargetRef": {"kind": "Deployment", "name": f"{name(index)}-worker"}},
            "autoscaling": {
                "enabled": True,
                "minReplicas": 1,
                "maxReplicas": 100,
                "messagesPerReplica": 1,
                "scaleDownStabilizationSeconds": 0,
            },
        },
    }


def deployment(index: int) -> dict[str, Any]:
    labels = {"app": f"{name(index)}-worker", "celeryevents.io/service": name(index)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name(index)}-worker"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": labels["app"]}},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "w", "image": "w"}]}},
        },
    }


def secret(name: str, url: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"url": url}}


def status_of(api: EmulatedApi) -> dict[str, dict[str, Any]]:
    return {item["metadata"]["name"]: item.get("status") or {} for item in api.client.get(CES)["items"]}


def replicas_of(api: EmulatedApi) -> dict[str, int]:
    return {item["metadata"]["name"]: item["spec"]["replicas"] for item in api.client.get(DEPLOYMENTS)["items"]}


def publish_events(url: str, index: int, count: int) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for number in range(count):
            # Confirmed: a quorum queue may not hold yet what was published just before the connection closed.
            channel.basic_publish_confirm(amqp.Message(f"e{number}"), exchange="events", routing_key=event(index))


def publish_celery_events(url: str, index: int, count: int) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for number in range(count):
            body = json.dumps(
                {
                    "type": "task-received",
                    "hostname": f"celery@{name(index)}-worker-1",
                    "uuid": f"u{number}",
                    "name": event(index),
                }
            )
            channel.basic_publish(
                amqp.Message(body, content_type="application/json"), naming.event_exchange_name(name(index)), "task.r"
            )


def consumed(scrape: str) -> dict[str, float]:
    """celery_event_operator_events_consumed_total per service_name."""
    found = {}
    for line in scrape.splitlines():
        match = re.match(r"celery_event_operator_events_consumed_total\{(.*)\} (\S+)$", line)
        if match:
            service_name = re.search(r'service_name="([^"]*)"', match.group(1))
            if service_name:
                found[service_name.group(1)] = float(match.group(2))
    return found


def kept_by(operator: OperatorProcess) -> set[str]:
    """The services whose status this operator refreshes (its status-pass timestamps)."""
    return set(
        re.findall(r'celery_event_operator_status_pass_timestamp_seconds\{[^}]*name="([^"]*)"', operator.scrape())
    )


@pytest.fixture
def many(kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str) -> EmulatedApi:
    kube_api.client.create("/api/v1/namespaces/default/secrets", secret("rabbitmq", test_vhost_url))
    for index in range(COUNT):
        kube_api.client.create(DEPLOYMENTS, deployment(index))
    return kube_api


def test_thirty_services_each_keep_status_metrics_and_autoscaling_and_none_waits_for_a_broken_one(
    many: EmulatedApi,
    test_vhost_url: str,
    tmp_path: pathlib.Path,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
) -> None:
    api = many
    # A Secret whose password has an unescaped '/', and a service that names it.
    api.client.create("/api/v1/namespaces/default/secrets", secret("broken", "amqp://guest:pa/ss@127.0.0.1:5672/x"))
    operator = OperatorProcess(api.kubeconfig, tmp_path / "operator.log", resync_seconds=5).start()
    try:
        broken = service(99, secret="broken")
        api.client.create(CES, broken)
        for index in range(COUNT):
            api.client.create(CES, service(index))
        eventually(
            lambda: all(condition(api, "Ready", name(index)).get("status") == "True" for index in range(COUNT)),
            timeout=60,
            message="not every service became Ready",
        )
        assert condition(api, "Ready", name(99))["reason"] == "BrokerSecretInvalid"
        assert "pa/ss" not in json.dumps(api.client.get(f"{CES}/{name(99)}"))

        # The events queue of one service is deleted under its consumer.
        deleted = name(7)
        vhost_path = rabbitmq_management.vhost_path(test_vhost)
        types = {
            index: rabbitmq_management.request(
                "GET",
                f"/queues/{vhost_path}/{urllib.parse.quote(naming.handler_queue_name(name(index), event(index)))}",
            )["type"]
            for index in (0, 1)
        }
        assert types == {0: "classic", 1: "quorum"}
        queue = urllib.parse.quote(naming.monitor_queue_name(deleted), safe="")
        eventually(
            lambda: rabbitmq_management.request("GET", f"/queues/{vhost_path}/{queue}").get("consumers") == 1,
            timeout=30,
        )
        rabbitmq_management.request("DELETE", f"/queues/{vhost_path}/{queue}")

        for index in range(COUNT):
            publish_events(test_vhost_url, index, index + 1)
        # Two intervals after the broker's statistics show them (quorum queues' a little later), and margin for
        # 30 passes on a busy machine.
        eventually(
            lambda: all(status_of(api)[name(index)].get("queueLength") == index + 1 for index in range(COUNT)),
            timeout=2 * INTERVAL + rabbitmq.STATS_LAG_SECONDS + 25,
            message="queue lengths did not follow",
        )
        eventually(
            lambda: all(replicas_of(api)[f"{name(index)}-worker"] == index + 1 for index in range(COUNT)),
            timeout=2 * INTERVAL + 25,
            message="autoscaling did not act on every service",
        )

        for index in range(COUNT):
            publish_celery_events(test_vhost_url, index, 3)
        eventually(
            lambda: all(consumed(operator.scrape()).get(name(index)) == 3 for index in range(COUNT)),
            timeout=30,
            message="not every service has live metrics",
        )
        # The management API lists a closed connection (the test's publishers') for a moment after it closed.
        # Control lends work to a few more connections while it queues up; they close when idle.
        eventually(
            lambda: len(rabbitmq_management.connections(test_vhost)) <= 2,
            timeout=rabbitmq.STATS_LAG_SECONDS + LINE_IDLE_SECONDS + 10,
            message="more than the operator's two connections",
        )
    finally:
        operator.stop()


@pytest.fixture
def two_shards(many: EmulatedApi, tmp_path: pathlib.Path) -> Iterator[list[OperatorProcess]]:
    shards = [
        OperatorProcess(
            many.kubeconfig,
            tmp_path / f"shard-{index}.log",
            "--shard-count",
            "2",
            "--shard-index",
            str(index),
            resync_seconds=5,
        ).start()
        for index in range(2)
    ]
    yield shards
    for shard in shards:
        shard.stop()


def test_two_shards_keep_each_service_exactly_once_and_both_answer_the_webhook(
    many: EmulatedApi, two_shards: list[OperatorProcess]
) -> None:
    api = many
    for index in range(COUNT):
        api.client.create(CES, service(index))
    eventually(
        lambda: all(condition(api, "Ready", name(index)).get("status") == "True" for index in range(COUNT)),
        timeout=60,
        message="not every service became Ready with two shards",
    )
    everyone = {name(index) for index in range(COUNT)}
    eventually(lambda: kept_by(two_shards[0]) | kept_by(two_shards[1]) == everyone, timeout=20, message="a gap")
    first, second = kept_by(two_shards[0]), kept_by(two_shards[1])
    assert first & second == set(), "a service kept by both shards"
    assert first == {n for n in everyone if shard_of("default", n, 2) == 0}
    assert first, "the hash spread the services over both shards"
    assert second, "the hash spread the services over both shards"

    for shard in two_shards:
        for index in range(COUNT):
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{name(index)}-worker-x",
                    "namespace": "default",
                    "labels": {"celeryevents.io/service": name(index)},
                },
                "spec": {"containers": [{"name": "w", "image": "w"}]},
            }
            review = admission_review(pod)
            answer = eventually(lambda review=review, shard=shard: shard.admit(review), timeout=10)["response"]
            assert answer["allowed"] is True
            assert answer.get("patch"), f"shard answered no settings for {name(index)}"
