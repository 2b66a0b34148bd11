"""A broker outage on a private RabbitMQ node (the shared broker is never stopped): status says so,
the operator keeps running, and the topology is back after the broker returns, without a restart."""

from __future__ import annotations

import pathlib
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from tests.conftest import billing_sample, create_broker_secret
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"


def queue_exists(url: str, name: str) -> bool:
    with Connection(url, connect_timeout=3) as connection:
        try:
            connection.channel().queue_declare(name, passive=True)
        except amqp.exceptions.NotFound:
            return False
        return True


def test_outage_is_reported_and_the_topology_comes_back(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], private_rabbit: PrivateRabbit, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, private_rabbit.url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    try:
        kube_api.client.create(CES, billing_sample())
        eventually(lambda: condition(kube_api, "Ready").get("status") == "True", timeout=20)

        private_rabbit.stop()
        down = eventually(
            lambda: (
                condition(kube_api, "BrokerReachable").get("status") == "False"
                and condition(kube_api, "BrokerReachable")
            ),
            timeout=20,
            message="outage not reported",
        )
        assert down["reason"] == "BrokerUnreachable"
        assert f"127.0.0.1:{private_rabbit.port}" in down["message"]
        assert condition(kube_api, "Ready")["status"] == "False"
        assert operator.alive()

        private_rabbit.wipe()  # a replaced broker: nothing of the topology survives
        private_rabbit.start()
        eventually(
            lambda: condition(kube_api, "Ready").get("status") == "True",
            timeout=90,
            message="not Ready again after the broker returned",
        )
        assert queue_exists(private_rabbit.url, "billing.orders.order.created"), "the topology was not re-declared"
        assert operator.alive()
        # kopf posts Events from a queue of its own: they may come a little after the status.
        eventually(
            lambda: (
                {("Warning", "BrokerUnreachable"), ("Normal", "Connected")}
                <= {(e["type"], e["reason"]) for e in kube_api.client.get("/api/v1/namespaces/default/events")["items"]}
            ),
            timeout=5,
            message="no Event for the outage and the recovery",
        )
    finally:
        operator.stop()
