"""What a broker restart keeps, measured on a private RabbitMQ node (the shared broker is never stopped).

Events wait in a service's handler queue and in its retry levels when the node stops; after it starts again,
every persistent event (Celery publishes persistent messages) is there, for both queue types: the queues are
durable, and retry levels keep counting their TTL, dead-lettering back to the handler queue. Transient
messages survive only in quorum queues (which persist everything). docs/user-guide/topology.md quotes these figures.
"""

from __future__ import annotations

from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.topology import apply
from celery_event_operator.core.topology import plan
from tests.integration.topology.test_apply import EVENT, spec
from tests.support import waiting
from tests.support.private_broker import PrivateRabbit

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

PERSISTENT, TRANSIENT = 2, 1


def depth(url: str, queue: str) -> int:
    with Connection(url) as connection:
        count: int = connection.channel().queue_declare(queue, passive=True).message_count
        return count


def publish(url: str, exchange: str, routing_key: str, count: int, delivery_mode: int, tag: str) -> None:
    with Connection(url) as connection:
        channel = connection.channel()
        for number in range(count):
            message = amqp.Message(f"{tag}-{number}", delivery_mode=delivery_mode)
            # Each waits for its confirm: without, a quorum queue once held 18 of 20 (the rest still in flight).
            channel.basic_publish_confirm(message, exchange=exchange, routing_key=routing_key)


def bodies(url: str, queue: str) -> list[str]:
    found = []
    with Connection(url) as connection:
        channel = connection.channel()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            found.append(message.body.decode() if isinstance(message.body, bytes) else message.body)
    return found


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_events_in_handler_queues_and_retry_levels_survive_a_broker_restart(
    private_rabbit: PrivateRabbit, queue_type: str, record_property: Any
) -> None:
    url = private_rabbit.url
    topology = plan.plan("billing", spec(queueType=queue_type, retry={"maxRetries": 5}))
    with Connection(url) as connection:
        apply.apply(connection, topology)
    handler_queue = f"billing.{EVENT}"
    publish(url, "events", EVENT, 100, PERSISTENT, "waiting")
    publish(url, "events", EVENT, 20, TRANSIENT, "transient")
    # The last level (back after 16 s): the restart comes while all of them wait there, however slowly a loaded
    # machine confirms 100 publications one by one.
    publish(url, "billing:retry.4", EVENT, 100, PERSISTENT, "retrying")
    assert (depth(url, "billing:retry.4"), depth(url, handler_queue)) == (100, 120)

    private_rabbit.stop()
    private_rabbit.start()

    # The node's first seconds may refuse connections or declares (a quorum leader still being elected);
    # dead-lettering back from the retry level is asynchronous: wait for all 200 to be in the handler queue.
    waiting.eventually(
        lambda: depth(url, "billing:retry.4") == 0 and depth(url, handler_queue) >= 200,
        timeout=60,
        message="the retry level never drained into the handler queue",
        retrying=(AssertionError, OSError, amqp.exceptions.AMQPError),
    )
    kept = bodies(url, handler_queue)
    kinds = {kind: sum(1 for body in kept if body.startswith(kind)) for kind in ("waiting", "retrying", "transient")}
    record_property("kept_after_restart", kinds)
    print(f"{queue_type}: after a broker restart the handler queue holds {kinds}")
    assert kinds["waiting"] == 100, "persistent events waiting in the handler queue"
    assert kinds["retrying"] == 100, "persistent events waiting in a retry level came back"
    assert kinds["transient"] == (20 if queue_type == "quorum" else 0)
