"""Whether the broker's listing shows a plan exactly as a declare would leave it (core/topology/listed.py): a table of
what differs, and the listing read as the untrusted answer it is."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.service.ownership import Claimant, shown_ours
from celery_event_operator.core.topology import plan
from celery_event_operator.core.topology.listed import entities_of, exchange_arguments, not_as_planned
from tests.unit.flow.fakes import listing_of, resource

TOPOLOGY = plan.plan("billing", parse_spec(resource()["spec"]))
OURS = Claimant("default", "shop", "billing", "u1")
LISTING = listing_of(TOPOLOGY, OURS)


def changed(kind: str, name: str, **fields: Any) -> dict[str, Any]:
    listing = copy.deepcopy(LISTING)
    for item in listing[kind]:
        if item.get("name", item.get("destination")) == name:
            item.update(fields)
    return listing


def without(kind: str, name: str) -> dict[str, Any]:
    listing = copy.deepcopy(LISTING)
    listing[kind] = [item for item in listing[kind] if item.get("name", item.get("routing_key")) != name]
    return listing


def differing(listing: dict[str, Any]) -> list[str]:
    return not_as_planned(TOPOLOGY, entities_of(listing["queues"], listing["exchanges"], listing["bindings"]))


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        (LISTING, []),
        (without("queues", "billing.order"), ["billing.order"]),
        (changed("queues", "billing:retry.1", arguments={"x-message-ttl": 1}), ["billing:retry.1"]),
        (changed("queues", "billing.order", arguments={"x-queue-type": "quorum"}), ["billing.order"]),
        (changed("queues", "billing.order", arguments={**TOPOLOGY.queues[0].arguments, "x-queue-type": "classic"}), []),
        (changed("queues", "billing:archived", durable=False), ["billing:archived"]),
        (changed("queues", "billing:archived", auto_delete=True), ["billing:archived"]),
        (changed("queues", "billing:archived", exclusive=True), ["billing:archived"]),
        (changed("queues", "billing:archived", state="down"), ["billing:archived"]),
        (changed("queues", "billing:archived", state="idle"), []),
        (changed("exchanges", "billing:recover", type="fanout"), ["billing:recover"]),
        (changed("exchanges", "events", internal=True), ["events"]),
        (changed("exchanges", "events", arguments={"alternate-exchange": "x"}), ["events"]),
        (without("exchanges", "billing:retry.3"), ["billing:retry.3"]),
        (without("bindings", "order"), ["events → billing.order (order)", "billing:recover → billing.order (order)"]),
        (
            changed("bindings", "billing.order", arguments={"x-match": "all"}),
            [
                "events → billing.order (order)",
                "billing:recover → billing.order (order)",
            ],
        ),
        (
            changed("bindings", "billing:archived", destination_type="exchange"),
            ["billing:archived → billing:archived ()"],
        ),
        (
            {"queues": None, "exchanges": {}, "bindings": "x"},
            [e.name for e in TOPOLOGY.exchanges]
            + [q.name for q in TOPOLOGY.queues]
            + [f"{b.exchange} → {b.queue} ({b.routing_key})" for b in TOPOLOGY.bindings],
        ),
    ],
    ids=[
        "as planned",
        "queue missing",
        "queue argument differs",
        "queue argument added",
        "queue with the classic type RabbitMQ 4 records",
        "queue not durable",
        "queue auto-deleted",
        "queue exclusive",
        "queue down (its node away: a declare is refused)",
        "queue idle",
        "exchange type differs",
        "exchange internal",
        "exchange with an argument",
        "exchange missing",
        "binding missing",
        "binding with arguments only",
        "binding to an exchange of that name",
        "listings of another shape",
    ],
)
def test_what_the_listing_does_not_show_as_planned(listing: dict[str, Any], expected: list[str]) -> None:
    assert differing(listing) == expected


@pytest.mark.parametrize(
    ("listing", "ours"),
    [
        (LISTING, True),
        (listing_of(TOPOLOGY, Claimant("default", "shop2", "billing", "u2")), False),
        (listing_of(TOPOLOGY), False),
        (changed("exchanges", "billing:owner", type="topic"), False),
        (changed("exchanges", "billing:owner", durable=False), False),
        (changed("exchanges", "billing:owner", arguments={**OURS.arguments(), "x-owner-name": "other"}), True),
    ],
    ids=["ours", "another's", "none", "not a fanout", "not durable", "only the id compared, as RabbitMQ does"],
)
def test_a_claim_is_shown_ours_only_as_declaring_it_would_answer(listing: dict[str, Any], ours: bool) -> None:
    listed = entities_of(listing["queues"], listing["exchanges"], listing["bindings"])
    assert shown_ours(exchange_arguments(listed, "billing:owner", "fanout"), OURS) is ours


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=20,
)
ITEM = st.fixed_dictionaries(
    {},
    optional={
        key: JSON | st.sampled_from(["billing.order", "events", "queue", True, False, {}])
        for key in (
            "name",
            "type",
            "durable",
            "auto_delete",
            "internal",
            "arguments",
            "source",
            "destination",
            "destination_type",
            "routing_key",
        )
    },
)


@given(st.lists(ITEM | JSON, max_size=6), st.lists(ITEM | JSON, max_size=6), JSON | st.lists(ITEM, max_size=6))
def test_any_answer_is_read_without_an_error(queues: Any, exchanges: Any, bindings: Any) -> None:
    listed = entities_of(queues, exchanges, bindings)
    not_as_planned(TOPOLOGY, listed)
    shown_ours(exchange_arguments(listed, "billing:owner", "fanout"), OURS)


def test_the_default_exchanges_implicit_bindings_are_left_out() -> None:
    """RabbitMQ lists one per queue (half the listing) and refuses any other binding of "": no plan has one."""
    implicit = {"source": "", "destination": "billing.order", "destination_type": "queue", "arguments": {}}
    listed = entities_of([], [], [{**implicit, "routing_key": "billing.order"}, *LISTING["bindings"]])
    assert ("", "billing.order", "billing.order") not in listed.bindings
    assert listed.bindings == entities_of([], [], LISTING["bindings"]).bindings
    assert not_as_planned(TOPOLOGY, entities_of(LISTING["queues"], LISTING["exchanges"], LISTING["bindings"])) == []
