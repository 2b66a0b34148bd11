"""What each RabbitMQ version does with a delivery left unacknowledged (pure): the table the workers ask by and the
operator judges by.

With late acknowledgements a task holds its message until it ends. A broker that enforces an acknowledgement timeout
gives the message to another worker once it passes — while the first still runs the task. Measured and read:

- up to 4.2 the channel enforces the broker's `consumer_timeout` (rabbitmq.conf, 30 min by default) on every queue
  type, or from 3.12 a `consumer-timeout` queue argument or policy; a consumer's own `x-consumer-timeout` on
  basic.consume is accepted and ignored (measured on 3.10.8 and 4.0.5; the 3.11.15 backport never shipped). It fires
  by closing the channel (406 PRECONDITION_FAILED), and the message is delivered again;
- from 4.3 the quorum queue enforces it, honouring the timeout a consumer asks for (also above the broker's), and
  cancels the consumer (basic.cancel, to a client that takes cancel notifications, as py-amqp does) instead of
  closing the channel; classic queues enforce none at all, and refuse the argument (406 on basic.consume, from 4.3.2
  also on queue.declare — a worker asking for it could not consume). Measured on 4.3.6; later releases are taken as
  4.3 for quorum queues and as enforcing the broker's timeout on classic ones until measured.
Celery restarts its consumer after either (a cancel is a ConsumerCancelled, a connection error to it), and the task is
run again where the message is delivered.
"""

from __future__ import annotations

import dataclasses
import re

Version = tuple[int, ...]

IN_QUEUE_SINCE: Version = (4, 3, 0)  # quorum queues keep the timeout, per consumer; classic queues have none
# Measured on 4.3.6: a later release may time classic queues out again (rabbitmq-server#17037); until measured, a
# later classic queue is taken to enforce the broker's timeout — a warning too many rather than none.
MEASURED_UNTIL: Version = (4, 3, 999)


def parse(text: str | None) -> Version | None:
    """`3.10.8` → (3, 10, 8); None when the broker did not say (or said something else)."""
    found = re.match(r"^(\d+)\.(\d+)\.(\d+)", text or "")
    return tuple(int(part) for part in found.groups()) if found else None


@dataclasses.dataclass(frozen=True)
class AckTimeoutSupport:
    """How a broker of one version treats unacknowledged deliveries on one queue type."""

    enforced: bool  # some timeout gives a held delivery to another consumer
    per_consumer: bool  # a consumer's x-consumer-timeout is honoured (ask for it only then)


def ack_timeout_support(version: Version | None, queue_type: str) -> AckTimeoutSupport:
    """What the broker of `version` (None: unknown, taken as the oldest behaviour: no per-consumer timeout, the
    broker's enforced) does on a queue of `queue_type` (classic or quorum)."""
    if version is None or version < IN_QUEUE_SINCE:
        return AckTimeoutSupport(enforced=True, per_consumer=False)
    if queue_type == "quorum":
        return AckTimeoutSupport(enforced=True, per_consumer=True)
    return AckTimeoutSupport(enforced=version > MEASURED_UNTIL, per_consumer=False)


def consumer_arguments(server_version: str | None, queue_type: str, timeout_seconds: int | None) -> dict[str, int]:
    """The basic.consume arguments a worker asks for on a handler queue: its own acknowledgement timeout where the
    broker honours it, nothing where it would ignore or refuse it."""
    if timeout_seconds and ack_timeout_support(parse(server_version), queue_type).per_consumer:
        return {"x-consumer-timeout": timeout_seconds * 1000}
    return {}
