"""spec → the exact RabbitMQ entities of one service (pure).

Names and arguments are those celery-amqp-events declares, so a service written with that library
finds every entity exactly as it would declare it (RabbitMQ compares arguments on every declare):

    E                 topic exchange, shared by the vhost, never deleted by the operator
    S.<event>         queue per handler, bound to E and to S:recover with key <event>;
                      x-dead-letter-exchange S:retry (a reject goes to retry level 0)
                      (quorum: S:archived, see `plan`)
    S:retry, S:retry.<n>   fanout exchange + queue per level n < maxRetries;
                      x-message-ttl 2^n s, x-dead-letter-exchange S:recover
    S:recover         topic exchange routing an expired retry back to S.<event> by its key
    S:archived        fanout exchange + queue; x-message-ttl, x-max-length, x-queue-mode lazy
    S:celeryev        the workers' Celery events (topic), and the operator's queue of them,
    S.celeryev        bounded; only with spec.monitoring.enabled

With maxRetries 0 there are no retry levels and no recover exchange, and (as in the library) a
classic handler queue has no dead-letter exchange. Quorum mode (not in the library) makes every
queue a quorum queue; dead-lettering between levels is then at-least-once, which needs
`x-overflow: reject-publish`, and `x-delivery-limit` sends a message that is requeued forever (a
worker crashing on it) to the archive.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from celery_event_operator.core import naming
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.naming import archive_name, handler_queue_name, recover_name, retry_name

__all__ = [
    "Binding",
    "Exchange",
    "Queue",
    "Topology",
    "archive_name",
    "handler_queue_name",
    "plan",
    "recover_name",
    "retry_name",
]

ExchangeType = Literal["topic", "fanout"]
QueueRole = Literal["events", "retry", "archive", "monitor"]
# The operator's queue of the service's Celery events: bounded, so that nothing grows on the broker
# while the operator is away (a minute of TTL, 100,000 messages, gone 10 minutes after its consumer).
MONITOR_QUEUE_ARGUMENTS: Mapping[str, ArgumentValue] = {
    "x-message-ttl": 60_000,
    "x-max-length": 100_000,
    "x-expires": 600_000,
}
ArgumentValue = int | str
DEFAULT_DELIVERY_LIMIT = 20


@dataclasses.dataclass(frozen=True)
class Exchange:
    name: str
    type: ExchangeType
    shared: bool = False  # the vhost's events exchange: declared, never deleted or recreated


@dataclasses.dataclass(frozen=True)
class Queue:
    name: str
    role: QueueRole
    arguments: Mapping[str, ArgumentValue]

    @property
    def queue_type(self) -> str:
        """The queue type: classic (RabbitMQ's default) or quorum."""
        return str(self.arguments.get("x-queue-type", "classic"))


@dataclasses.dataclass(frozen=True)
class Binding:
    exchange: str
    queue: str
    routing_key: str


@dataclasses.dataclass(frozen=True)
class Topology:
    service: str
    exchanges: tuple[Exchange, ...]
    queues: tuple[Queue, ...]
    bindings: tuple[Binding, ...]


def retry_delay_ms(level: int) -> int:
    return int(2**level) * 1000


def _quorum(arguments: dict[str, ArgumentValue], *, dead_lettered: bool) -> dict[str, ArgumentValue]:
    quorum: dict[str, ArgumentValue] = {"x-queue-type": "quorum"}
    if dead_lettered:
        quorum |= {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}
    return arguments | quorum


def plan(service: str, spec: CeleryEventServiceSpec) -> Topology:
    quorum = spec.queue_type == "quorum"
    levels = spec.retry.max_retries
    archive = spec.archive.enabled
    events = spec.events.exchange

    exchanges = [Exchange(events, "topic", shared=True)]
    queues: list[Queue] = []
    bindings: list[Binding] = []

    handler_arguments: dict[str, ArgumentValue] = {}
    if quorum:
        # What a quorum handler queue dead-letters is a message over its delivery limit (a worker
        # crashed on it every time): it goes to the archive. Routed back through the retry levels it
        # would form a cycle without a `rejected` hop, which RabbitMQ refuses to deliver (measured:
        # at-least-once strands it in the retry queue). Retries are published to the levels instead.
        if archive:
            handler_arguments["x-dead-letter-exchange"] = archive_name(service)
    elif levels:
        handler_arguments["x-dead-letter-exchange"] = retry_name(service, 0)
    if quorum:
        handler_arguments = _quorum(handler_arguments, dead_lettered="x-dead-letter-exchange" in handler_arguments)
        handler_arguments["x-delivery-limit"] = spec.delivery_limit or DEFAULT_DELIVERY_LIMIT

    for handler in spec.events.handlers:
        name = handler_queue_name(service, handler.name)
        queues.append(Queue(name, "events", handler_arguments))
        bindings.append(Binding(events, name, handler.name))
        if levels:
            bindings.append(Binding(recover_name(service), name, handler.name))

    for level in range(levels):
        name = retry_name(service, level)
        arguments: dict[str, ArgumentValue] = {
            "x-message-ttl": retry_delay_ms(level),
            "x-dead-letter-exchange": recover_name(service),
        }
        exchanges.append(Exchange(name, "fanout"))
        queues.append(Queue(name, "retry", _quorum(arguments, dead_lettered=True) if quorum else arguments))
        bindings.append(Binding(name, name, ""))
    if levels:
        exchanges.append(Exchange(recover_name(service), "topic"))

    if archive:
        name = archive_name(service)
        arguments = {"x-message-ttl": spec.archive.message_ttl_seconds * 1000, "x-max-length": spec.archive.max_length}
        # Quorum queues reject x-queue-mode; classic ones carry it as the library declares it.
        arguments = _quorum(arguments, dead_lettered=False) if quorum else arguments | {"x-queue-mode": "lazy"}
        exchanges.append(Exchange(name, "fanout"))
        queues.append(Queue(name, "archive", arguments))
        bindings.append(Binding(name, name, ""))

    if spec.monitoring.enabled:
        # Where the workers send their Celery events (Celery declares it alike: a durable topic exchange).
        exchanges.append(Exchange(naming.event_exchange_name(service), "topic"))
        queues.append(Queue(naming.monitor_queue_name(service), "monitor", MONITOR_QUEUE_ARGUMENTS))
        bindings.append(Binding(naming.event_exchange_name(service), naming.monitor_queue_name(service), "#"))

    return Topology(service, tuple(exchanges), tuple(queues), tuple(bindings))
