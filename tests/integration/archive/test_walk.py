"""A walk of the archive on a real RabbitMQ: it spreads what it holds over channels (RabbitMQ scans a channel's
unacknowledged deliveries from the oldest for each acknowledgement, so one channel holding every passed-over message
made a selective replay quadratic), acknowledges each message on the channel it came on, and puts back what it did
not take in its original order — classic and quorum archives."""

from __future__ import annotations

from collections import Counter

import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.topology import plan
from tests.integration.archive.test_archive_tools import CANCELLED, CREATED, SPEC, archive_task, depth

ARCHIVED = 3 * operations.CHANNEL_SHARE + 100  # more than a share on several channels


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_walk_holds_at_most_two_shares_a_channel_and_puts_back_the_rest_in_order(
    test_vhost_url: str, queue_type: str
) -> None:
    queue = naming.archive_name("billing")
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec({**SPEC, "queueType": queue_type})))
        channel = connection.channel()
        order = [
            archive_task(channel, index, CREATED if index % 5 in (1, 3) else CANCELLED) for index in range(ARCHIVED)
        ]
        selected = {task_id for index, task_id in enumerate(order) if index % 5 in (1, 3)}

        walk = operations.Walk(connection, queue)
        delivered_on: Counter[int] = Counter()
        try:
            for item, message in walk:
                delivered_on[message.channel.channel_id] += 1
                if item.task_id in selected:
                    walk.ack(message)
        finally:
            walk.close()

        # The cancel of a consumer that took a share can only overrun by its window (one more share).
        assert max(delivered_on.values()) <= 2 * operations.CHANNEL_SHARE, delivered_on
        assert sum(delivered_on.values()) == ARCHIVED
        assert walk.received == ARCHIVED
        assert not walk.window_full

        taken = connection.channel()
        left = []
        while (message := taken.basic_get(queue, no_ack=False)) is not None:
            left.append(message.headers["id"])
        taken.close()  # put back (the vhost is this test's own)
    assert left == [task_id for task_id in order if task_id not in selected], "the rest, in its original order"
    assert depth(test_vhost_url, queue) == ARCHIVED - len(selected)
