"""The planner, table-tested: names and arguments exactly as celery-amqp-events declares them."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.api.models import MAX_RETRIES_CAP, parse_spec
from celery_event_operator.core.topology import plan
from celery_event_operator.core.topology.declared import Declared, DeclaredQueue
from celery_event_operator.core.topology.plan import Binding, Exchange, Queue


def spec(**changes: Any) -> Any:
    return parse_spec(
        {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "events": {"handlers": [{"name": "orders.order.created"}]},
            **changes,
        }
    )


def test_defaults_equal_celery_amqp_events() -> None:
    topology = plan.plan("billing", spec(retry={"maxRetries": 2}, monitoring={"enabled": False}))
    assert topology.exchanges == (
        Exchange("events", "topic", shared=True),
        Exchange("billing:retry", "fanout"),
        Exchange("billing:retry.1", "fanout"),
        Exchange("billing:recover", "topic"),
        Exchange("billing:archived", "fanout"),
    )
    assert topology.queues == (
        Queue("billing.orders.order.created", "events", {"x-dead-letter-exchange": "billing:retry"}),
        Queue("billing:retry", "retry", {"x-message-ttl": 1000, "x-dead-letter-exchange": "billing:recover"}),
        Queue("billing:retry.1", "retry", {"x-message-ttl": 2000, "x-dead-letter-exchange": "billing:recover"}),
        Queue(
            "billing:archived",
            "archive",
            {"x-message-ttl": 604_800_000, "x-max-length": 10_000, "x-queue-mode": "lazy"},
        ),
    )
    assert topology.bindings == (
        Binding("events", "billing.orders.order.created", "orders.order.created"),
        Binding("billing:recover", "billing.orders.order.created", "orders.order.created"),
        Binding("billing:retry", "billing:retry", ""),
        Binding("billing:retry.1", "billing:retry.1", ""),
        Binding("billing:archived", "billing:archived", ""),
    )


@pytest.mark.parametrize("max_retries", [0, 1, 10, MAX_RETRIES_CAP])
def test_retry_levels(max_retries: int) -> None:
    topology = plan.plan("s", spec(retry={"maxRetries": max_retries}))
    retry_queues = [q for q in topology.queues if q.role == "retry"]
    assert [q.name for q in retry_queues] == [plan.retry_name("s", n) for n in range(max_retries)]
    assert [q.arguments["x-message-ttl"] for q in retry_queues] == [2**n * 1000 for n in range(max_retries)]
    has_recover = any(e.name == "s:recover" for e in topology.exchanges)
    assert has_recover == (max_retries > 0)
    [handler] = [q for q in topology.queues if q.role == "events"]
    # celery-amqp-events declares no dead-letter exchange without retries: neither do we (classic).
    assert ("x-dead-letter-exchange" in handler.arguments) == (max_retries > 0)


def test_default_max_retries_is_ten_levels_up_to_512_seconds() -> None:
    retry_queues = [q for q in plan.plan("s", spec()).queues if q.role == "retry"]
    assert len(retry_queues) == 10
    assert retry_queues[-1].arguments["x-message-ttl"] == 512_000


@pytest.mark.parametrize(
    ("archive", "expected"),
    [
        pytest.param({"enabled": False}, None, id="disabled"),
        pytest.param(
            {"messageTTLSeconds": 60, "maxLength": 5},
            {"x-message-ttl": 60_000, "x-max-length": 5, "x-queue-mode": "lazy"},
            id="custom",
        ),
    ],
)
def test_archive(archive: dict[str, Any], expected: dict[str, Any] | None) -> None:
    topology = plan.plan("s", spec(archive=archive))
    archives = [q for q in topology.queues if q.role == "archive"]
    assert [q.arguments for q in archives] == ([expected] if expected else [])
    assert any(e.name == "s:archived" for e in topology.exchanges) == (expected is not None)


def test_custom_events_exchange_and_several_handlers() -> None:
    topology = plan.plan("s", spec(events={"exchange": "domain", "handlers": [{"name": "a.b"}, {"name": "c"}]}))
    assert topology.exchanges[0] == Exchange("domain", "topic", shared=True)
    assert [b for b in topology.bindings if b.exchange == "domain"] == [
        Binding("domain", "s.a.b", "a.b"),
        Binding("domain", "s.c", "c"),
    ]
    assert "domain" not in Declared.of(topology).exchanges, "the shared exchange is never the service's to delete"


@pytest.mark.parametrize(
    ("changes", "handler_arguments", "retry_arguments", "archive_arguments"),
    [
        pytest.param(
            {"deliveryLimit": 5},
            {
                "x-dead-letter-exchange": "s:archived",
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-delivery-limit": 5,
            },
            {
                "x-message-ttl": 1000,
                "x-dead-letter-exchange": "s:recover",
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
            {"x-message-ttl": 604_800_000, "x-max-length": 10_000, "x-queue-type": "quorum"},
            id="quorum",
        ),
        pytest.param(
            {},
            {
                "x-dead-letter-exchange": "s:archived",
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-delivery-limit": plan.DEFAULT_DELIVERY_LIMIT,
            },
            None,
            None,
            id="quorum-default-delivery-limit",
        ),
        pytest.param(
            {"retry": {"maxRetries": 0}},
            {
                "x-dead-letter-exchange": "s:archived",
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-delivery-limit": plan.DEFAULT_DELIVERY_LIMIT,
            },
            None,
            None,
            id="quorum-without-retries",
        ),
        pytest.param(
            {"archive": {"enabled": False}},
            {"x-queue-type": "quorum", "x-delivery-limit": plan.DEFAULT_DELIVERY_LIMIT},
            None,
            None,
            id="quorum-without-archive-drops-what-exceeds-the-limit",
        ),
    ],
)
def test_quorum(
    changes: dict[str, Any],
    handler_arguments: dict[str, Any],
    retry_arguments: dict[str, Any] | None,
    archive_arguments: dict[str, Any] | None,
) -> None:
    topology = plan.plan("s", spec(queueType="quorum", **changes))
    by_role = {q.role: q.arguments for q in reversed(topology.queues)}  # first queue of each role
    assert by_role["events"] == handler_arguments
    if retry_arguments is not None:
        assert by_role["retry"] == retry_arguments
    if archive_arguments is not None:
        assert by_role["archive"] == archive_arguments
    assert all(q.arguments.get("x-queue-type") == "quorum" for q in topology.queues if q.role != "monitor")


def test_obsolete_entities_after_lowering_retries_and_dropping_a_handler() -> None:
    before = plan.plan("s", spec(retry={"maxRetries": 3}, events={"handlers": [{"name": "a"}, {"name": "b"}]}))
    after = plan.plan("s", spec(retry={"maxRetries": 1}, events={"handlers": [{"name": "a"}]}))
    obsolete = Declared.of(before).obsolete(after)
    assert sorted(obsolete.exchanges) == ["s:retry.1", "s:retry.2"]
    assert sorted(obsolete.queues, key=lambda queue: queue.name) == [
        DeclaredQueue("s.b", (("events", "b"), ("s:recover", "b")), "s:retry", "classic"),
        DeclaredQueue("s:retry.1", (("s:retry.1", ""),), "s:recover", "classic"),
        DeclaredQueue("s:retry.2", (("s:retry.2", ""),), "s:recover", "classic"),
    ]


def test_declared_record_round_trips_and_reads_the_first_format() -> None:
    declared = Declared.of(plan.plan("s", spec(retry={"maxRetries": 2})))
    assert Declared.from_json(declared.to_json()) == declared
    quorum = Declared.of(plan.plan("s", spec(queueType="quorum")))
    assert {q.queue_type for q in Declared.from_json(quorum.to_json()).queues} == {"quorum", "classic"}, (
        "the monitor queue stays classic"
    )
    untyped = Declared.from_json('{"exchanges": [], "queues": [{"name": "s.a", "bindings": []}]}')
    assert [q.queue_type for q in untyped.queues] == [None], "records older than the type: unknown"
    legacy = Declared.from_json('["s.a", "s:retry"]')
    assert legacy.entities == {("queue", "s.a"), ("exchange", "s.a"), ("queue", "s:retry"), ("exchange", "s:retry")}


def test_monitoring_adds_the_event_exchange_and_a_bounded_queue() -> None:
    with_monitoring = plan.plan("billing", spec())
    without = plan.plan("billing", spec(monitoring={"enabled": False}))
    added = Declared.of(with_monitoring).entities - Declared.of(without).entities
    assert added == {("exchange", "billing:celeryev"), ("queue", "billing.celeryev")}
    [queue] = [q for q in with_monitoring.queues if q.role == "monitor"]
    assert queue.arguments == {"x-message-ttl": 60_000, "x-max-length": 100_000, "x-expires": 600_000}
    assert Binding("billing:celeryev", "billing.celeryev", "#") in with_monitoring.bindings
