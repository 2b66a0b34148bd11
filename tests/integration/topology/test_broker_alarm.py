"""A broker that blocks publishers (a memory alarm on a private RabbitMQ node with its management API): its services
say so within two status intervals, with one Warning and a metric, and recover when it clears (issue #26)."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import pytest

from tests.conftest import create_broker_secret
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
INTERVAL = 5
SERVICES = ("billing", "shipping")


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq", "key": "url"}},
            "events": {"handlers": [{"name": "orders.order.created"}]},
            "statusIntervalSeconds": INTERVAL,
        },
    }


def ready(api: EmulatedApi, name: str) -> dict[str, Any]:
    return condition(api, "Ready", name)


def alarm_series(operator: OperatorProcess) -> dict[str, float]:
    return {
        line.split('service_name="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in operator.scrape().splitlines()
        if line.startswith("celery_event_operator_broker_alarms{")
    }


@pytest.mark.parametrize("private_rabbit", [{"management": True}], indirect=True)
def test_a_memory_alarm_is_shown_on_the_services_and_cleared(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], private_rabbit: PrivateRabbit, tmp_path: pathlib.Path
) -> None:
    assert private_rabbit.management_url is not None
    create_broker_secret(kube_api, private_rabbit.url, managementURL=private_rabbit.management_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=30).start()
    try:
        for name in SERVICES:
            kube_api.client.create(CES, service(name))
        eventually(lambda: all(ready(kube_api, n).get("status") == "True" for n in SERVICES), timeout=30)
        eventually(lambda: alarm_series(operator) == dict.fromkeys(SERVICES, 0.0), timeout=2 * INTERVAL + 10)

        private_rabbit.set_memory_watermark(0.000001)
        raised = time.monotonic()
        eventually(
            lambda: all(ready(kube_api, n).get("reason") == "BrokerAlarm" for n in SERVICES),
            timeout=2 * INTERVAL + 10,
            interval=0.2,
            message="the alarm was not shown (two status intervals, and the loaded machine's margin)",
        )
        shown_after = time.monotonic() - raised
        for name in SERVICES:
            reachable = condition(kube_api, "BrokerReachable", name)
            assert (reachable["status"], reachable["reason"]) == ("False", "BrokerAlarm")
            assert reachable["message"].startswith("memory alarm on node ceo-private-")
            assert "cannot publish retries, archives or events" in reachable["message"]
        assert alarm_series(operator) == dict.fromkeys(SERVICES, 1.0)

        private_rabbit.set_memory_watermark(0.4)
        cleared = time.monotonic()
        eventually(
            lambda: all(ready(kube_api, n).get("status") == "True" for n in SERVICES),
            timeout=2 * INTERVAL + 10,
            interval=0.2,
            message="not Ready after the alarm cleared (two status intervals, and the loaded machine's margin)",
        )
        print(f"\nalarm shown after {shown_after:.1f} s, cleared after {time.monotonic() - cleared:.1f} s")
        assert condition(kube_api, "BrokerReachable", "billing")["reason"] == "Connected"
        assert alarm_series(operator) == dict.fromkeys(SERVICES, 0.0)

        def events() -> list[tuple[str, str, str]]:
            items = kube_api.client.get("/api/v1/namespaces/default/events")["items"]
            return sorted(
                (e["involvedObject"]["name"], e["type"], e["reason"])
                for e in items
                if e["reason"] in ("BrokerAlarm", "Connected")
            )

        # kopf posts Events from a queue of its own: they may come a little after the status.
        expected = sorted(
            [(n, "Warning", "BrokerAlarm") for n in SERVICES] + [(n, "Normal", "Connected") for n in SERVICES]
        )
        eventually(lambda: events() == expected, timeout=5, message=f"one Warning and one recovery each: {events()}")
    finally:
        operator.stop()
