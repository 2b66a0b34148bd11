"""A vhost's entities as the broker's management API lists them, and whether a service's plan is there exactly as
planned (pure).

A resync used to declare every service's whole plan again (one AMQP pipeline and a claim per service every 30 s:
a third of an idle operator's CPU at a thousand services). The broker lists a vhost's queues, exchanges and bindings
for every service on it at once; a resync whose plan and claim the listing shows exactly as they would be declared
declares nothing, and anything else — an entity missing or different, an item of an unexpected shape, no listing —
is declared as before, where the broker's own comparison stays the judge. So the listing only ever saves a declare
that would have changed nothing; it never decides a conflict.

The listing is the broker's untrusted answer: an item of any other shape is left out (as if missing), never an
error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from celery_event_operator.core.topology.plan import Topology

# What the listings are asked for (`columns=`): everything a redeclare compares, nothing else.
QUEUE_COLUMNS = "name,durable,auto_delete,exclusive,state,arguments"
# A queue in another state (down: its node is away; crashed, stopped, minority) answers a declare with an error.
# "live": what RabbitMQ 3.x lists for a queue whose statistics have not come yet.
SERVING_STATES = frozenset({"running", "idle", "flow", "live"})
EXCHANGE_COLUMNS = "name,type,durable,auto_delete,internal,arguments"
BINDING_COLUMNS = "source,destination,destination_type,routing_key,arguments"


@dataclasses.dataclass(frozen=True)
class ListedExchange:
    type: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ListedEntities:
    """The vhost's durable, not auto-deleted queues (name → arguments; not exclusive, and serving) and exchanges (not
    internal either), and its argument-less bindings to queues (exchange, queue, routing key): the only ones a plan
    can match."""

    queues: Mapping[str, Mapping[str, Any]]
    exchanges: Mapping[str, ListedExchange]
    bindings: frozenset[tuple[str, str, str]]


def _items(listed: Any) -> list[dict[str, Any]]:
    # JSON objects decode to dicts: no ABC check per item (tens of thousands of them at a thousand services).
    return [item for item in listed if isinstance(item, dict)] if isinstance(listed, list) else []


def _kept(item: Mapping[str, Any]) -> bool:
    """Declared as a plan declares: durable and not auto-deleted, with arguments as a table."""
    return item.get("durable") is True and item.get("auto_delete") is False and isinstance(item.get("arguments"), dict)


def entities_of(queues: Any, exchanges: Any, bindings: Any) -> ListedEntities:
    """The listings' JSON (lists of items, as the management API answers) as entities a plan can be checked
    against; items of any other shape are left out."""
    return ListedEntities(
        queues={
            item["name"]: item["arguments"]
            for item in _items(queues)
            if isinstance(item.get("name"), str)
            and item.get("exclusive") is False
            and item.get("state") in SERVING_STATES
            and _kept(item)
        },
        exchanges={
            item["name"]: ListedExchange(item["type"], item["arguments"])
            for item in _items(exchanges)
            if isinstance(item.get("name"), str)
            and isinstance(item.get("type"), str)
            and item.get("internal") is False
            and _kept(item)
        },
        # The default exchange's implicit binding of every queue (source "") is left out first: RabbitMQ refuses
        # any other binding of it, so no plan has one, and it is half the listing.
        bindings=frozenset(
            (source, destination, key)
            for item in _items(bindings)
            if (source := item.get("source"))
            and isinstance(source, str)
            and isinstance(destination := item.get("destination"), str)
            and isinstance(key := item.get("routing_key"), str)
            and item.get("destination_type") == "queue"
            and item.get("arguments") == {}
        ),
    )


def not_as_planned(topology: Topology, listed: ListedEntities) -> list[str]:
    """The entities of the plan the listing does not show exactly as a declare would make them (empty: all are)."""
    differing = []
    for exchange in topology.exchanges:
        found = listed.exchanges.get(exchange.name)
        if found is None or found.type != exchange.type or found.arguments:
            differing.append(exchange.name)
    for queue in topology.queues:
        if _as_declared(listed.queues.get(queue.name), queue.arguments) != dict(queue.arguments):
            differing.append(queue.name)
    for binding in topology.bindings:
        if (binding.exchange, binding.queue, binding.routing_key) not in listed.bindings:
            differing.append(f"{binding.exchange} → {binding.queue} ({binding.routing_key})")
    return differing


def _as_declared(listed: Mapping[str, Any] | None, planned: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A listed queue's arguments less the classic type RabbitMQ 4 records itself for a queue declared without one
    (a vhost whose default type is another lists that one: it differs, and the queue is declared)."""
    if listed is None or "x-queue-type" in planned or listed.get("x-queue-type") != "classic":
        return listed
    return {key: value for key, value in listed.items() if key != "x-queue-type"}


def exchange_arguments(listed: ListedEntities, name: str, exchange_type: str) -> Mapping[str, Any] | None:
    """The arguments of a listed exchange of that name and type (None: not listed so)."""
    found = listed.exchanges.get(name)
    return found.arguments if found is not None and found.type == exchange_type else None
