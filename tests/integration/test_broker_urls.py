"""Broker URLs as Celery users write them (issue 26): a team pastes its working CELERY_BROKER_URL into the
Secret and gets a Ready service. The real operator on the emulated API, the real RabbitMQ.

These URLs name the broker's vhost `/`, which every user of the shared broker sees: the services here have
names (and an events exchange) of this run's own, and everything they declare there is removed afterwards.
"""

from __future__ import annotations

import pathlib
import secrets
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator.core import naming
from tests.integration.test_secrets_and_faults import CES, create_secret, service
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import stays

ROOT = "/"


def url_forms(amqp_url: str) -> dict[str, str]:
    """The forms of Celery's and kombu's documentation that were refused, on the test run's broker."""
    parts = urllib.parse.urlsplit(amqp_url)
    login = f"{parts.username or 'guest'}:{parts.password or 'guest'}@{parts.hostname}"
    port = parts.port or 5672
    assert port == 5672, "the form without a port needs the broker on AMQP's default port"
    return {
        "pyamqp-double-slash": f"pyamqp://{login}:{port}//",
        "amqp-double-slash": f"amqp://{login}:{port}//",
        "no-port": f"amqp://{login}//",
        "pyamqp-encoded-slash": f"pyamqp://{login}:{port}/%2F",
    }


def remove_entities(management: rabbitmq.Management, prefix: str) -> None:
    """Whatever is left on `/` with this run's names (the services' own deletion removes theirs)."""
    vhost = management.vhost_path(ROOT)
    for kind in ("queues", "exchanges"):
        for entity in management.request("GET", f"/{kind}/{vhost}?columns=name"):
            if entity["name"].startswith(prefix):
                name = urllib.parse.quote(entity["name"], safe="")
                management.request("DELETE", f"/{kind}/{vhost}/{name}")


@pytest.fixture
def prefix(rabbitmq_management: rabbitmq.Management) -> Iterator[str]:
    chosen = f"ceo-urls-{secrets.token_hex(4)}"
    yield chosen
    remove_entities(rabbitmq_management, chosen)


@pytest.fixture
def running(kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    yield process
    process.stop()


def on_root(management: rabbitmq.Management, queue: str) -> dict[str, Any]:
    found: dict[str, Any] = management.request(
        "GET", f"/queues/{management.vhost_path(ROOT)}/{urllib.parse.quote(queue, safe='')}"
    )
    return found


def test_celery_broker_urls_give_a_ready_service_on_the_root_vhost(
    prefix: str,  # first: its clean-up runs once the operator has stopped
    kube_api: EmulatedApi,
    running: OperatorProcess,
    amqp_url: str,
    rabbitmq_management: rabbitmq.Management,
) -> None:
    names = {}
    for index, (form, url) in enumerate(url_forms(amqp_url).items()):
        name = names[form] = f"{prefix}-{index}"
        create_secret(kube_api, name, url=url)
        body = service(name, name, deletionPolicy="delete", statusIntervalSeconds=1)
        body["spec"]["events"]["exchange"] = f"{prefix}.events"
        kube_api.client.create(CES, body)

    def ready(name: str) -> dict[str, Any]:
        found = condition(kube_api, "Ready", name)
        assert found.get("status") == "True", found  # shown as the last state when it never is
        return found

    for form, name in names.items():
        assert eventually(lambda name=name: ready(name), timeout=30, message=f"{form}: never Ready")["reason"] == (
            "Reconciled"
        ), form
        eventually(
            lambda name=name: condition(kube_api, "MonitoringReady", name).get("status") == "True",
            timeout=20,
            message=f"{form}: the operator's own AMQP client did not consume on '/'",
        )
        # Queue lengths through the management API, on '/' (%2F in its paths).
        eventually(
            lambda name=name: kube_api.client.get(f"{CES}/{name}").get("status", {}).get("queueLength") == 0,
            timeout=20,
            message=f"{form}: no queue length in status",
        )
        assert on_root(rabbitmq_management, f"{name}.orders.order.created")["vhost"] == ROOT, form
        eventually(  # `consumers` comes with the queue's statistics, up to STATS_LAG_SECONDS later
            lambda name=name: on_root(rabbitmq_management, naming.monitor_queue_name(name)).get("consumers") == 1,
            timeout=rabbitmq.STATS_LAG_SECONDS + 5,
            message=f"{form}: no events consumer on '/'",
        )

    for name in names.values():
        kube_api.client.delete(f"{CES}/{name}")
    eventually(lambda: kube_api.client.get(CES)["items"] == [], timeout=30, message="the services were not released")

    def none_left() -> bool:
        vhost = rabbitmq_management.vhost_path(ROOT)
        listed = rabbitmq_management.request("GET", f"/queues/{vhost}?columns=name")
        return not [queue["name"] for queue in listed if queue["name"].startswith(prefix)]

    eventually(none_left, timeout=10, message="deletionPolicy delete did not remove the services' queues from '/'")
    stays(none_left, seconds=3, message="a deleted service's queues came back")
