"""The applier against a real RabbitMQ (a vhost per test), checked through the management API
and with raw AMQP messages."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.broker.management import QueueListing
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.options import DEFAULT_INSTALLATION_ID
from celery_event_operator.core.service.ownership import Claimant, holder_of, shown_ours
from celery_event_operator.core.topology import plan
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import ListedEntities, exchange_arguments, not_as_planned
from tests.support import rabbitmq
from tests.support.kube import eventually
from tests.support.waiting import stays

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

EVENT = "orders.order.created"


def spec(**changes: Any) -> Any:
    return parse_spec(
        {"broker": {"secretRef": {"name": "rabbitmq"}}, "events": {"handlers": [{"name": EVENT}]}, **changes}
    )


@pytest.fixture
def connection(test_vhost_url: str) -> Iterator[Connection]:
    with Connection(test_vhost_url, connect_timeout=5) as connected:
        connected.ensure_connection(max_retries=1)
        yield connected


@pytest.fixture
def channel(connection: Connection) -> Iterator[Any]:
    opened = connection.channel()
    yield opened
    if opened.is_open:
        opened.close()


def publish(channel: Any, exchange: str, routing_key: str, body: str = "event") -> None:
    channel.basic_publish(amqp.Message(body, delivery_mode=2), exchange=exchange, routing_key=routing_key)


def get(channel: Any, queue: str, timeout: float = 10) -> amqp.Message:
    return eventually(
        lambda: channel.basic_get(queue), timeout=timeout, interval=0.05, message=f"nothing arrived in {queue}"
    )


def depth(channel: Any, queue: str) -> int:
    count: int = channel.queue_declare(queue, passive=True).message_count
    return count


def expected_snapshot(topology: plan.Topology) -> dict[str, Any]:
    return {
        "queues": {q.name: dict(q.arguments) for q in topology.queues},
        "exchanges": {e.name: e.type for e in topology.exchanges},
        "bindings": {(b.exchange, b.queue, b.routing_key) for b in topology.bindings},
    }


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({}, id="classic-defaults"),
        pytest.param({"queueType": "quorum", "deliveryLimit": 3, "retry": {"maxRetries": 3}}, id="quorum"),
        pytest.param({"retry": {"maxRetries": 0}, "archive": {"enabled": False}}, id="bare"),
        pytest.param({"events": {"exchange": "domain", "handlers": [{"name": "a"}, {"name": "b.c"}]}}, id="custom"),
    ],
)
def test_broker_holds_exactly_the_plan(
    connection: Connection, rabbitmq_management: rabbitmq.Management, test_vhost: str, changes: dict[str, Any]
) -> None:
    topology = plan.plan("billing", spec(**changes))
    report = apply.apply(connection, topology)
    assert report.problems == []
    assert rabbitmq.snapshot(rabbitmq_management, test_vhost) == expected_snapshot(topology)

    again = apply.apply(connection, topology, Declared.of(topology))
    assert (again.problems, again.recreated, again.removed) == ([], [], [])

    # What a resync checks instead of declaring: the broker's own listing shows this plan and the claim as declared.
    claimant = Claimant(DEFAULT_INSTALLATION_ID, "shop", "billing", "u1")
    assert apply.claim(connection, "billing", claimant.arguments()) is None
    listed = asyncio.run(entities(connection, rabbitmq_management))
    assert not_as_planned(topology, listed) == []
    assert shown_ours(exchange_arguments(listed, "billing:owner", "fanout"), claimant)
    channel = connection.channel()
    handler = next(queue.name for queue in topology.queues if queue.role == "events")
    channel.queue_unbind(handler, topology.bindings[0].exchange, topology.bindings[0].routing_key)
    channel.exchange_delete(topology.exchanges[-1].name)
    channel.queue_delete(topology.queues[-1].name)
    listed = asyncio.run(entities(connection, rabbitmq_management))
    binding = topology.bindings[0]
    gone = [f"{binding.exchange} → {binding.queue} ({binding.routing_key})", topology.exchanges[-1].name]
    assert set(not_as_planned(topology, listed)) >= {*gone, topology.queues[-1].name}


async def entities(connection: Connection, management: rabbitmq.Management) -> ListedEntities:
    """The vhost's entities as the operator lists them (its own adapter, the broker's management API)."""
    listing = QueueListing(broker_address.parse(connection.as_uri(include_password=True)), management.base, None)
    try:
        listing.entities(0)  # asked: listed meanwhile
        for _ in range(100):
            await asyncio.sleep(0.1)
            listed = listing.entities(60)
            if listed is not None:
                return listed
        raise AssertionError("the vhost's entities were never listed")
    finally:
        await listing.close()


def test_event_lands_in_its_queue_and_a_reject_returns_after_one_second(connection: Connection, channel: Any) -> None:
    apply.apply(connection, plan.plan("billing", spec(retry={"maxRetries": 2})))
    publish(channel, "events", EVENT)
    publish(channel, "events", "orders.order.unhandled")
    message = get(channel, f"billing.{EVENT}")
    assert message.body == "event"
    assert depth(channel, f"billing.{EVENT}") == 0, "the unhandled key routes nowhere in this service"

    rejected_at = time.monotonic()
    channel.basic_reject(message.delivery_tag, requeue=False)
    returned = get(channel, f"billing.{EVENT}")
    elapsed = time.monotonic() - rejected_at
    assert 0.9 <= elapsed < 10, f"came back after {elapsed:.2f}s"  # never early; a loaded machine may be late
    hops = [(death["queue"], death["reason"]) for death in returned.headers["x-death"]]
    assert hops == [("billing:retry", "expired"), (f"billing.{EVENT}", "rejected")]
    assert returned.delivery_info["routing_key"] == EVENT


def test_last_retry_level_returns_after_its_delay(connection: Connection, channel: Any) -> None:
    apply.apply(connection, plan.plan("billing", spec(retry={"maxRetries": 2})))
    sent_at = time.monotonic()
    publish(channel, "billing:retry.1", EVENT)  # how a runtime schedules attempt 2: 2^1 s
    get(channel, f"billing.{EVENT}")
    elapsed = time.monotonic() - sent_at
    assert 1.9 <= elapsed < 10, f"came back after {elapsed:.2f}s"  # never early; a loaded machine may be late


def test_quorum_delivery_limit_sends_a_poison_message_to_the_archive(connection: Connection, channel: Any) -> None:
    apply.apply(connection, plan.plan("billing", spec(queueType="quorum", deliveryLimit=2, retry={"maxRetries": 1})))
    publish(channel, "events", EVENT)
    queue = f"billing.{EVENT}"
    for _ in range(3):  # a worker that crashes on this message every time: it is requeued
        channel.basic_reject(get(channel, queue).delivery_tag, requeue=True)
    archived = get(channel, "billing:archived")
    assert archived.headers["x-death"][0]["reason"] == "delivery_limit"
    assert archived.headers["x-death"][0]["queue"] == queue
    assert depth(channel, queue) == 0, "deliveryLimit 2: the third requeue dead-letters it"


def test_changed_archive_length_recreates_an_empty_archive(
    connection: Connection, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    apply.apply(connection, plan.plan("billing", spec()))
    bigger = plan.plan("billing", spec(archive={"maxLength": 20_000}))
    report = apply.apply(connection, bigger, Declared.of(bigger))
    assert report.problems == []
    assert report.recreated == ["billing:archived"]
    assert rabbitmq.snapshot(rabbitmq_management, test_vhost) == expected_snapshot(bigger)


def test_changed_archive_length_on_a_full_archive_is_reported_and_loses_nothing(
    connection: Connection, channel: Any
) -> None:
    apply.apply(connection, plan.plan("billing", spec()))
    for index in range(3):
        publish(channel, "billing:archived", EVENT, body=f"archived-{index}")
    eventually(lambda: depth(channel, "billing:archived") == 3)
    bigger = plan.plan("billing", spec(archive={"maxLength": 20_000}))
    report = apply.apply(connection, bigger, Declared.of(bigger))
    [problem] = report.problems
    assert problem.entity == "billing:archived"
    assert "x-max-length" in problem.message
    assert "3 messages" in problem.message
    assert report.recreated == []
    assert depth(channel, "billing:archived") == 3


QUEUE_TYPES = [pytest.param({}, id="classic"), pytest.param({"queueType": "quorum"}, id="quorum")]


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_lowered_retries_remove_empty_levels_and_keep_a_draining_one(
    connection: Connection, channel: Any, queue_type: dict[str, str]
) -> None:
    before = plan.plan("billing", spec(retry={"maxRetries": 3}, **queue_type))
    apply.apply(connection, before)
    publish(channel, "billing:retry.2", EVENT)  # 4 s level, still holding a message
    eventually(lambda: depth(channel, "billing:retry.2") == 1)

    after = plan.plan("billing", spec(retry={"maxRetries": 1}, **queue_type))
    report = apply.apply(connection, after, Declared.of(before))
    assert report.removed == ["billing:retry.1"]
    assert [q.name for q in report.kept] == ["billing:retry.2"]
    remembered = report.remembered(after, Declared.of(before))
    assert ("queue", "billing:retry.2") in remembered.entities

    get(channel, f"billing.{EVENT}", timeout=8)  # it drained back to its handler queue, nothing lost
    final = apply.apply(connection, after, remembered)
    assert final.removed == ["billing:retry.2"]
    assert final.remembered(after, remembered) == Declared.of(after)
    with pytest.raises(amqp.exceptions.NotFound):
        connection.channel().queue_declare("billing:retry.2", passive=True)


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_dropped_handler_is_unbound_at_once_and_removed_when_empty(
    connection: Connection, channel: Any, queue_type: dict[str, str]
) -> None:
    both = plan.plan("billing", spec(events={"handlers": [{"name": "a"}, {"name": "b"}]}, **queue_type))
    apply.apply(connection, both)
    publish(channel, "events", "b")
    eventually(lambda: depth(channel, "billing.b") == 1)

    only_a = plan.plan("billing", spec(events={"handlers": [{"name": "a"}]}, **queue_type))
    report = apply.apply(connection, only_a, Declared.of(both))
    assert [q.name for q in report.kept] == ["billing.b"]
    publish(channel, "events", "b")
    stays(lambda: depth(channel, "billing.b") == 1, seconds=0.3, message="no longer bound, yet new events piled up")

    channel.basic_ack(get(channel, "billing.b").delivery_tag)
    assert apply.apply(connection, only_a, report.remembered(only_a, Declared.of(both))).removed == ["billing.b"]


def test_hand_deleted_entities_come_back(
    connection: Connection, channel: Any, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    topology = plan.plan("billing", spec(retry={"maxRetries": 1}))
    apply.apply(connection, topology)
    channel.queue_delete(f"billing.{EVENT}")
    channel.exchange_delete("billing:recover")
    channel.queue_unbind("billing:retry", "billing:retry", "")
    apply.apply(connection, topology, Declared.of(topology))
    assert rabbitmq.snapshot(rabbitmq_management, test_vhost) == expected_snapshot(topology)


def test_shared_exchange_of_another_type_is_reported_not_recreated(connection: Connection, channel: Any) -> None:
    channel.exchange_declare("events", "direct", durable=True, auto_delete=False)
    report = apply.apply(connection, plan.plan("billing", spec()))
    [problem] = report.problems
    assert problem.entity == "events"
    assert "never recreates" in problem.message
    channel.exchange_declare("events", "direct", durable=True, auto_delete=False, passive=True)  # untouched


def test_owned_exchange_of_another_type_is_recreated(connection: Connection, channel: Any) -> None:
    channel.exchange_declare("billing:recover", "direct", durable=True, auto_delete=False)
    report = apply.apply(connection, plan.plan("billing", spec(retry={"maxRetries": 1})))
    assert report.problems == []
    assert report.recreated == ["billing:recover"]


@pytest.mark.parametrize("queue_type", QUEUE_TYPES)
def test_delete_removes_empty_entities_keeps_full_ones_and_the_shared_exchange(
    connection: Connection,
    channel: Any,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    queue_type: dict[str, str],
) -> None:
    topology = plan.plan("billing", spec(retry={"maxRetries": 2}, **queue_type))
    apply.apply(connection, topology)
    publish(channel, "billing:archived", EVENT)
    eventually(lambda: depth(channel, "billing:archived") == 1)
    report = apply.delete(connection, topology, Declared.of(topology))
    assert [q.name for q in report.kept] == ["billing:archived"]
    left = rabbitmq.snapshot(rabbitmq_management, test_vhost)
    assert set(left["queues"]) == {"billing:archived"}
    assert set(left["exchanges"]) == {"events", "billing:archived"}


def test_an_obsolete_quorum_queue_with_a_consumer_is_kept(connection: Connection, channel: Any) -> None:
    before = plan.plan("billing", spec(events={"handlers": [{"name": "a"}, {"name": "b"}]}, queueType="quorum"))
    apply.apply(connection, before)
    channel.basic_consume("billing.b", callback=lambda message: None)  # holds it: it may have unacked messages
    only_a = plan.plan("billing", spec(events={"handlers": [{"name": "a"}]}, queueType="quorum"))
    report = apply.apply(connection, only_a, Declared.of(before))
    assert [(q.name, q.consumers) for q in report.kept] == [("billing.b", 1)]


def test_the_first_claim_of_a_service_name_wins_and_only_its_holder_releases_it(
    connection: Connection, rabbitmq_management: rabbitmq.Management, test_vhost: str
) -> None:
    first = Claimant("team-a", "shop", "billing", "u1").arguments()
    second = Claimant("team-a", "shop2", "billing", "u2").arguments()
    assert apply.claim(connection, "billing", first) is None
    assert apply.claim(connection, "billing", first) is None, "claiming again confirms it"
    refusal = apply.claim(connection, "billing", second)
    assert refusal is not None
    assert holder_of(None, refusal).describe(Claimant("team-a", "shop2", "billing", "u2")) == "shop/billing"
    assert apply.release(connection, "billing", second) is not None, "another's claim is not released"
    path = f"/exchanges/{rabbitmq_management.vhost_path(test_vhost)}/billing%3Aowner"
    assert rabbitmq_management.request("GET", path)["arguments"]["x-owner-namespace"] == "shop"
    assert apply._declared_at_once(connection, plan.plan("billing", spec())), "the channel serves on after a refusal"
    assert apply.release(connection, "billing", first) is None
    assert apply.claim(connection, "billing", second) is None, "released: the next claimant has it"


def test_a_refusal_names_the_holder_of_a_claim_whose_ids_are_as_long_as_real_ones(connection: Connection) -> None:
    """Without a management API the holder is read from the refusal, which RabbitMQ cuts at 255 bytes: with the
    default installation id and uids of the API's length, ours and the holder's id do not both fit."""
    first = Claimant(DEFAULT_INSTALLATION_ID, "shop", "billing", str(uuid.uuid4()))
    second = Claimant(DEFAULT_INSTALLATION_ID, "shop2", "billing", str(uuid.uuid4()))
    assert apply.claim(connection, "billing", first.arguments()) is None
    for refused in (apply.claim, apply.release):
        refusal = refused(connection, "billing", second.arguments())
        assert refusal is not None
        holder = holder_of(None, refusal)
        assert holder.describe(second) == "shop/billing"
        assert holder.same_resource_as(first), "the holder's uid is read too (a changed installation id)"
    assert apply.release(connection, "billing", first.arguments()) is None, "the holder still releases it"
