"""A broker set up as RabbitMQ advises for production from 4.x: the management API's statistics off
(`management_agent.disable_metrics_collector = true`; metrics by Prometheus). Its queue listings then carry no
counts and its consumer listing answers 400: counts must come from elsewhere, and what cannot be seen is said, never
read as zero. On a private node of each version of the matrix.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.broker.management import QueueListing
from celery_event_operator.core.broker.address import parse
from celery_event_operator.core.errors import ManagementUnavailableError
from tests.conftest import REPO, create_broker_secret
from tests.integration.scaling.test_autoscaling import CES, QUEUE, publish, replicas, service, topology_ready
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

pytestmark = pytest.mark.every_broker

STATISTICS_OFF = "management_agent.disable_metrics_collector = true\n"


@pytest.fixture(scope="module")
def rabbit() -> Iterator[PrivateRabbit]:
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))
    node = PrivateRabbit(base, management=True, config=STATISTICS_OFF)
    try:
        yield node.start()
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)


def hold(url: str, queue: str, count: int) -> Connection:
    """A consumer that takes `count` deliveries of `queue` and acknowledges none (close its connection to end it)."""
    connection = Connection(url)
    channel = connection.channel()
    channel.basic_qos(0, count, False)
    channel.basic_consume(queue, callback=lambda _message: None)
    connection.drain_events(timeout=5)
    return connection


def test_the_listings_count_from_the_queues_and_say_what_they_cannot_see(rabbit: PrivateRabbit) -> None:
    with Connection(rabbit.url) as connection:
        channel = connection.channel()
        channel.queue_declare("counted", durable=True, auto_delete=False)
        for _ in range(30):
            channel.basic_publish(amqp.Message("x"), routing_key="counted")
    holder = hold(rabbit.url, "counted", 10)

    async def listed() -> None:
        assert rabbit.management_url is not None
        listing = QueueListing(parse(rabbit.url), rabbit.management_url, None)
        try:
            counts = (await listing.queues(0))["counted"]
            assert (counts.ready, counts.unacknowledged, counts.consumers) == (20, 10, None)
            for unseen in (listing.consumers, listing.holdings):
                with pytest.raises(ManagementUnavailableError) as raised:
                    await unseen(0)
                assert "statistics are off" in str(raised.value)
                assert "disable_metrics_collector" in str(raised.value)
        finally:
            await listing.close()

    try:
        eventually(lambda: asyncio.run(_ready(rabbit, "counted", 20)), timeout=20, message="the counts never showed")
        asyncio.run(listed())
    finally:
        holder.close()


async def _ready(rabbit: PrivateRabbit, queue: str, ready: int) -> bool:
    assert rabbit.management_url is not None
    listing = QueueListing(parse(rabbit.url), rabbit.management_url, None)
    try:
        counts = (await listing.queues(0)).get(queue)
        return counts is not None and counts.ready == ready
    finally:
        await listing.close()


def test_status_and_scaling_count_waiting_and_held_messages(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path, rabbit: PrivateRabbit
) -> None:
    kube_api.kubectl("create", "--validate=false", "-f", str(REPO / "examples" / "billing-worker.yaml"))
    create_broker_secret(kube_api, rabbit.url + "stats-off", managementURL=rabbit.management_url or "")
    rabbit.node.ctl("add_vhost", "stats-off")
    rabbit.node.ctl("set_permissions", "-p", "stats-off", "guest", ".*", ".*", ".*")
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    try:
        kube_api.client.create(CES, service())
        eventually(lambda: topology_ready(kube_api), timeout=30)
        url = rabbit.url + "stats-off"
        publish(url, 300)
        holder = hold(url, QUEUE, 50)
        try:
            status = eventually(
                lambda: (
                    (found := kube_api.client.get(CES + "/billing").get("status", {})).get("queueLength") == 300
                    and found.get("consumers") == 1
                    and found
                ),
                timeout=30,
                message="the status did not count 250 waiting and 50 held messages, and one consumer",
            )
            assert status["consumers"] == 1
            eventually(lambda: replicas(kube_api) == 3, timeout=20, message="300 messages did not make 3 workers")
            assert condition(kube_api, "Ready")["status"] == "True"
        finally:
            holder.close()
    finally:
        operator.stop()
