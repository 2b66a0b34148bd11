"""Make the broker hold a service's planned topology, safely (I/O with py-amqp through kombu).

Declaring is idempotent. RabbitMQ refuses to redeclare an entity with other arguments
(PRECONDITION_FAILED, which closes the channel): an owned exchange is then recreated (exchanges hold
no messages), a queue only when it is empty; a non-empty queue is reported and never touched.
Entities the plan no longer has are removed once empty; a handler queue is first unbound, so it
stops filling up while it waits to drain.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator.core import naming
from celery_event_operator.core.service import ownership
from celery_event_operator.core.topology import declared, plan
from celery_event_operator.core.topology.declared import Declared, DeclaredQueue
from celery_event_operator.core.topology.outcome import EntityState, Problem, QueueState, Report
from celery_event_operator.core.topology.plan import Topology

_ARGUMENT_IN_ERROR = re.compile(r"inequivalent arg '([^']+)'")
PRECONDITION_FAILED = 406

# The id of the probe that reads a claim's holder from a refusal: no claimant's id (installation/namespace/name/uid).
_PROBE_ID = "?"


class _Channel:
    """A channel that stays usable after RabbitMQ closed it for a channel-level error.

    py-amqp reopens ("revives") a channel the broker closed, under the same object: it is reused, never
    replaced — replacing it leaked one open channel per refused declare (1,761 after 1,000 services).
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._channel: Any = None

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """`channel.<method>(*args, **kwargs)` of py-amqp, on an open channel."""
        if self._channel is None or not self._channel.is_open:
            self._channel = self._connection.channel()
        return getattr(self._channel, method)(*args, **kwargs)

    def close(self) -> None:
        if self._channel is not None and self._channel.is_open:
            self._channel.close()
        self._channel = None


def _argument_named(error: amqp.exceptions.AMQPError) -> str:
    match = _ARGUMENT_IN_ERROR.search(str(getattr(error, "reply_text", "")) or str(error))
    return match.group(1) if match else "arguments"


def _declare_queue(channel: _Channel, queue: plan.Queue) -> QueueState:
    ok = channel.call(
        "queue_declare", queue.name, durable=True, auto_delete=False, exclusive=False, arguments=dict(queue.arguments)
    )
    return QueueState(queue.name, queue.role, ok.message_count, ok.consumer_count)


def _peek(channel: _Channel, name: str) -> QueueState | None:
    """Depth and consumers of an existing queue, None when there is none."""
    try:
        ok = channel.call("queue_declare", name, passive=True)
    except amqp.exceptions.NotFound:
        return None
    else:
        return QueueState(name, None, ok.message_count, ok.consumer_count)


def _delete_if_empty(channel: _Channel, name: str, queue_type: str | None = "classic") -> QueueState | None:
    """Delete an empty queue; returns the state of a non-empty one, which stays.

    A classic queue is deleted with `if-empty`, atomically. Quorum queues refuse that flag (540
    NOT_IMPLEMENTED, which closes the connection): one with no ready messages and no consumers (so none
    unacknowledged either) is deleted without it. A message published between the check and the delete
    is lost with the queue; an obsolete queue is unbound first, so only a publisher that still names it
    directly (a worker on old settings, in that moment) can hit the gap. A queue of unknown type (an
    older record) is treated as quorum: the check-then-delete is safe for both types.
    """
    state = _peek(channel, name)
    if state is None:
        return None
    if queue_type == "classic":
        if state.messages:
            return state
        try:
            channel.call("queue_delete", name, if_empty=True)
        except amqp.exceptions.PreconditionFailed:  # a message arrived in between: it stays
            return _peek(channel, name)
        return None
    if state.messages or state.consumers:
        return state
    channel.call("queue_delete", name)
    return None


def _declare_exchange(channel: _Channel, exchange: plan.Exchange) -> None:
    channel.call("exchange_declare", exchange.name, exchange.type, durable=True, auto_delete=False)


def _ensure_exchange(channel: _Channel, exchange: plan.Exchange, report: Report) -> None:
    try:
        _declare_exchange(channel, exchange)
    except amqp.exceptions.PreconditionFailed as exc:
        argument = _argument_named(exc)
        if exchange.shared:
            report.problems.append(
                Problem(
                    exchange.name,
                    (
                        f"the shared exchange {exchange.name!r} exists with another {argument} "
                        f"(wanted a durable {exchange.type} exchange); the operator never recreates it"
                    ),
                )
            )
            return
        channel.call("exchange_delete", exchange.name)
        _declare_exchange(channel, exchange)
        report.recreated.append(exchange.name)


def _ensure_queue(channel: _Channel, queue: plan.Queue, report: Report) -> None:
    try:
        _declare_queue(channel, queue)
    except amqp.exceptions.PreconditionFailed as exc:
        argument = _argument_named(exc)
    else:
        return
    kept = _delete_if_empty(channel, queue.name, queue.queue_type)
    if kept is None:
        _declare_queue(channel, queue)
        report.recreated.append(queue.name)
        return
    wanted = queue.arguments.get(argument, "none")
    report.problems.append(
        Problem(
            queue.name,
            (
                f"queue {queue.name!r} was declared with another {argument} (wanted {wanted}); it holds "
                f"{kept.messages} messages, so it is kept as it is and recreated once empty"
            ),
        )
    )


def _remove_obsolete(channel: _Channel, topology: Topology, obsolete: Declared, report: Report) -> None:
    staying = {exchange.name for exchange in topology.exchanges}
    draining: list[DeclaredQueue] = []
    for queue in sorted(obsolete.queues, key=lambda queue: queue.name):
        for exchange, routing_key in queue.bindings:
            if exchange in staying:  # so that it stops filling up while it waits to drain
                with contextlib.suppress(amqp.exceptions.NotFound):  # already unbound or gone
                    channel.call("queue_unbind", queue.name, exchange, routing_key)
        kept = _delete_if_empty(channel, queue.name, queue.queue_type)
        if kept is None:
            report.note_removed(("queue", queue.name))
        else:
            report.kept.append(kept)
            draining.append(queue)
    # An exchange stays while a queue that waits to drain is bound to it or dead-letters into it.
    needed = {exchange for queue in draining for exchange, _ in queue.bindings}
    needed |= {queue.dead_letter_exchange for queue in draining if queue.dead_letter_exchange}
    for exchange in sorted(obsolete.exchanges - needed):
        channel.call("exchange_delete", exchange)
        report.note_removed(("exchange", exchange))


def _declared_at_once(connection: Connection, topology: Topology) -> bool:
    """The whole plan declared without waiting for each answer (no-wait), then one round trip that confirms it.

    The usual case — everything already as planned, as at every resync — costs one round trip instead of one
    per entity. False when the broker refused something: it closed the channel, and the careful path finds out
    what and repairs it.
    """
    channel = _resync_channel(connection)
    try:
        for exchange in topology.exchanges:
            channel.exchange_declare(exchange.name, exchange.type, durable=True, auto_delete=False, nowait=True)
        for queue in topology.queues:
            channel.queue_declare(
                queue.name, durable=True, auto_delete=False, arguments=dict(queue.arguments), nowait=True
            )
        for binding in topology.bindings:
            channel.queue_bind(binding.queue, binding.exchange, binding.routing_key, nowait=True)
        channel.basic_qos(0, 0, False)  # answered after everything above, or the channel is closed instead
    except amqp.exceptions.ChannelError:
        return False  # py-amqp reopened the channel the broker closed: it stays usable
    return True


# The at-once declare of every resync uses one channel per connection, kept open: opening and closing a channel
# each time cost two more round trips per service and resync (channel.open alone was 7 % of the idle operator's
# samples at 1,000 services). Keyed weakly: a dropped connection takes its channel along.
_resync_channels: weakref.WeakKeyDictionary[Connection, Any] = weakref.WeakKeyDictionary()


def _resync_channel(connection: Connection) -> Any:
    channel = _resync_channels.get(connection)
    if channel is None or not channel.is_open:
        channel = _resync_channels[connection] = connection.channel()
    return channel


def apply(connection: Connection, topology: Topology, previous: Declared = declared.NOTHING) -> Report:
    """Declare the plan, repair what differs, and remove what the plan dropped (when empty)."""
    obsolete = previous.obsolete(topology)
    if not obsolete and _declared_at_once(connection, topology):
        return Report()
    report = Report()
    channel = _Channel(connection)
    try:
        for exchange in topology.exchanges:
            _ensure_exchange(channel, exchange, report)
        for queue in topology.queues:
            _ensure_queue(channel, queue, report)
        broken = {problem.entity for problem in report.problems}
        for binding in topology.bindings:
            if binding.exchange in broken:
                continue
            channel.call("queue_bind", binding.queue, binding.exchange, binding.routing_key)
        _remove_obsolete(channel, topology, obsolete, report)
    finally:
        channel.close()
    return report


def delete(connection: Connection, topology: Topology, previous: Declared = declared.NOTHING) -> Report:
    """Remove every entity of the service that is empty; report the others. The shared exchange stays."""
    report = Report()
    channel = _Channel(connection)
    empty_plan = Topology(topology.service, tuple(e for e in topology.exchanges if e.shared), (), ())
    try:
        _remove_obsolete(channel, empty_plan, previous | Declared.of(topology), report)
    finally:
        channel.close()
    return report


def inspect(connection: Connection, topology: Topology) -> list[EntityState]:
    """The planned entities as the broker has them; declares nothing (passive checks only)."""
    channel = _Channel(connection)
    states: list[EntityState] = []
    try:
        for exchange in topology.exchanges:
            try:
                channel.call("exchange_declare", exchange.name, exchange.type, passive=True)
            except amqp.exceptions.NotFound:
                states.append(EntityState("exchange", exchange.name, present=False))
            else:
                states.append(EntityState("exchange", exchange.name, present=True))
        for queue in topology.queues:
            peeked = _peek(channel, queue.name)
            states.append(
                EntityState(
                    "queue",
                    queue.name,
                    peeked is not None,
                    peeked.messages if peeked else None,
                    peeked.consumers if peeked else None,
                )
            )
    finally:
        channel.close()
    return states


def consumers(connection: Connection, queues: list[str]) -> dict[str, int]:
    """The consumers of each of `queues` that exists (passive declares only, one channel)."""
    channel = _Channel(connection)
    try:
        return {name: peeked.consumers for name in queues if (peeked := _peek(channel, name)) is not None}
    finally:
        channel.close()


def claim(connection: Connection, service: str, arguments: dict[str, str]) -> str | None:
    """Claim the service's topology (core/service/ownership.py): None when the claim is ours (made now or before),
    else the broker's refusal, which names the value it holds. On the resync channel: one round trip per resync
    (a refusal closes the channel; py-amqp reopens it under the same object)."""
    channel = _resync_channel(connection)
    name = naming.owner_exchange_name(service)
    try:
        channel.exchange_declare(name, "fanout", durable=True, auto_delete=False, arguments=dict(arguments))
    except amqp.exceptions.PreconditionFailed as exc:
        return _naming_the_holder(connection, service, _refusal_text(exc))
    return None


def claim_existing(connection: Connection, service: str, arguments: dict[str, str]) -> tuple[bool, str | None]:
    """Whether a claim of the service existed before, and `claim`'s answer (made now when there was none)."""
    channel = _Channel(connection)
    try:
        channel.call("exchange_declare", naming.owner_exchange_name(service), "fanout", passive=True)
    except amqp.exceptions.NotFound:
        existed = False
    else:
        existed = True
    finally:
        channel.close()
    return existed, claim(connection, service, arguments)


def release(connection: Connection, service: str, arguments: dict[str, str]) -> str | None:
    """Release the service's claim when it is ours (checked by claiming it: a claim held by another stays); None
    when it is released (or there was none), else the refusal that names the holder."""
    channel = _Channel(connection)
    try:
        _declare_claim(channel, service, arguments)
        channel.call("exchange_delete", naming.owner_exchange_name(service))
    except amqp.exceptions.PreconditionFailed as exc:
        refusal = _refusal_text(exc)
    else:
        return None
    finally:
        channel.close()
    return _naming_the_holder(connection, service, refusal)


def take_over(connection: Connection, service: str, arguments: dict[str, str], *, held: str) -> str | None:
    """Release the claim held under id `held` (it stays when it is held under another by now) and claim it with
    `arguments`: None when the claim is ours."""
    refusal = release(connection, service, {ownership.ID_ARGUMENT: held})
    return refusal if refusal is not None else claim(connection, service, arguments)


def _declare_claim(channel: _Channel, service: str, arguments: dict[str, str]) -> None:
    name = naming.owner_exchange_name(service)
    channel.call("exchange_declare", name, "fanout", durable=True, auto_delete=False, arguments=dict(arguments))


def _refusal_text(error: amqp.exceptions.AMQPError) -> str:
    return str(getattr(error, "reply_text", "") or error)


def _naming_the_holder(connection: Connection, service: str, refusal: str) -> str:
    """`refusal`, or when RabbitMQ cut it (at 255 bytes) before the holder's id, the refusal of a declare whose own
    id is one character, which leaves room for the holder's: what names it without a management API. A claim the
    probe made (the holder released it meanwhile) is deleted at once; the refusal then stays as it was."""
    if ownership.holder_of(None, refusal).id is not None:
        return refusal
    channel = _Channel(connection)
    try:
        _declare_claim(channel, service, {ownership.ID_ARGUMENT: _PROBE_ID})
        channel.call("exchange_delete", naming.owner_exchange_name(service))
    except amqp.exceptions.PreconditionFailed as exc:
        return _refusal_text(exc)
    finally:
        channel.close()
    return refusal
