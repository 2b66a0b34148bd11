"""A walk of a classic archive on a real RabbitMQ: spread over a chain of channels (RabbitMQ scans a channel's
unacknowledged deliveries from the oldest for each acknowledgement, so one channel holding every passed-over message
made a selective replay quadratic), each consumer's window exactly its share of what the archive held when the walk
began — so messages arriving meanwhile stay in the archive, after what was there — and what stays put back in its
original order, also after the walking process is killed. A quorum archive keeps its one-channel walk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from typing import Any

import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.archive.messages import Selection
from celery_event_operator.core.errors import UnsupportedOperationError
from celery_event_operator.core.topology import plan
from tests.integration.archive.test_archive_tools import CANCELLED, CREATED, SPEC, archive_task, depth, drain, listed
from tests.support.kube import eventually

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

QUEUE = naming.archive_name("billing")
ARCHIVED = 3 * operations.CHANNEL_SHARE + 100  # shares on several channels, the last one partly filled
ARRIVALS = 30


def fill(connection: Connection, queue_type: str) -> tuple[list[str], set[str]]:
    """The archive in its order, and the ids of the orders.order.created events in it (two in five)."""
    apply.apply(connection, plan.plan("billing", parse_spec({**SPEC, "queueType": queue_type})))
    channel = connection.channel()
    order = [archive_task(channel, index, CREATED if index % 5 in (1, 3) else CANCELLED) for index in range(ARCHIVED)]
    channel.close()
    return order, {task_id for index, task_id in enumerate(order) if index % 5 in (1, 3)}


def archived_ids(connection: Connection) -> list[str]:
    """The archive's messages in their order (taken unacknowledged, then put back: the vhost is this test's)."""
    channel = connection.channel()
    found = []
    while (message := channel.basic_get(QUEUE, no_ack=False)) is not None:
        found.append(message.headers["id"])
    channel.close()
    return found


class Arrivals:
    """Messages archived by another client while a walk runs (one every `every` calls)."""

    def __init__(self, url: str, every: int) -> None:
        self._connection = Connection(url)
        self._channel = self._connection.channel()
        self._every, self._calls = every, 0
        self.ids: list[str] = []

    def __call__(self, *_: Any) -> None:
        self._calls += 1
        if self._calls % self._every == 0 and len(self.ids) < ARRIVALS:
            self.ids.append(archive_task(self._channel, 100_000 + len(self.ids), CREATED))

    def close(self) -> None:
        self._connection.release()


def test_a_classic_walk_holds_a_share_a_channel_takes_no_arrival_and_puts_back_the_rest_in_order(
    test_vhost_url: str,
) -> None:
    with Connection(test_vhost_url) as connection:
        order, selected = fill(connection, "classic")
        arrivals = Arrivals(test_vhost_url, every=50)
        walk = operations.Walk(connection, QUEUE, "classic", acknowledges=True)
        delivered_on: Counter[int] = Counter()
        try:
            for item, message in walk:
                arrivals()
                delivered_on[message.channel.channel_id] += 1
                if item.task_id in selected:
                    walk.ack(message)
            left_ready = depth(test_vhost_url, QUEUE)
        finally:
            walk.close()
            arrivals.close()

        assert len(delivered_on) > 1, "spread over channels"
        assert max(delivered_on.values()) <= operations.CHANNEL_SHARE, delivered_on
        assert (walk.received, sum(delivered_on.values()), walk.window_full) == (ARCHIVED, ARCHIVED, False)
        assert len(arrivals.ids) == ARRIVALS
        assert left_ready == ARRIVALS, "the arrivals stay ready in the archive: no consumer of the walk took one"
        assert archived_ids(connection) == [task_id for task_id in order if task_id not in selected] + arrivals.ids, (
            "what stays in its original order, the arrivals after it"
        )


def test_a_classic_replay_with_arrivals_moves_what_was_there_once_and_leaves_the_arrivals_after_the_rest(
    test_vhost_url: str,
) -> None:
    with Connection(test_vhost_url) as connection:
        order, selected = fill(connection, "classic")
        arrivals = Arrivals(test_vhost_url, every=2)  # on the move's progress: after each confirmed batch
        try:
            tally = operations.move(
                connection,
                "billing",
                Selection(events=frozenset({CREATED})),
                progress=arrivals,
                queue_type="classic",
            )
        finally:
            arrivals.close()
        assert arrivals.ids, "messages arrived during the walk"
        assert (tally.done, tally.selected, tally.archived, tally.whole) == (
            len(selected),
            len(selected),
            ARCHIVED,
            True,
        )
        replayed = Counter(
            message.headers["id"] for message in drain(test_vhost_url, naming.handler_queue_name("billing", CREATED))
        )
        assert replayed == Counter(selected), "each selected one replayed once, no arrival"
        assert archived_ids(connection) == [task_id for task_id in order if task_id not in selected] + arrivals.ids


def test_a_survey_of_a_classic_archive_counts_what_it_held_and_leaves_arrivals_untouched(test_vhost_url: str) -> None:
    with Connection(test_vhost_url) as connection:
        order, selected = fill(connection, "classic")
        survey = operations.survey(connection, "billing", Selection(events=frozenset({CREATED})), 3, "classic")
        assert (survey.archived, survey.matched, survey.whole) == (ARCHIVED, len(selected), True)
        assert [item.task_id for item in survey.sample] == [task_id for task_id in order if task_id in selected][:3]
        assert archived_ids(connection) == order


def test_a_classic_walk_longer_than_its_channels_hold_is_reported_cut_short(
    test_vhost_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(operations, "WALK_CHANNELS", 2)
    # A count or a listing walks on one consumer unless the archive is larger than its window: so it is, here.
    monkeypatch.setattr(operations, "PREFETCH_LIMIT", 1000)
    with Connection(test_vhost_url) as connection:
        order, selected = fill(connection, "classic")
        survey = operations.survey(connection, "billing", Selection(events=frozenset({CREATED})), 0, "classic")
        assert (survey.archived, survey.whole) == (ARCHIVED, False)
        assert survey.matched < len(selected)
        listing = operations.list_archive(connection, "billing", Selection(), "classic")
        assert (listing.whole, listing.seen) == (False, 2 * operations.CHANNEL_SHARE)
        with pytest.raises(UnsupportedOperationError):
            operations.replay(connection, "billing", Selection(), dry_run=True, queue_type="classic")
        tally = operations.move(
            connection, "billing", Selection(events=frozenset({CREATED})), purge=True, queue_type="classic"
        )
        assert (tally.done, tally.whole) == (len(selected), False), "walked again until done, not seen whole"
        assert archived_ids(connection) == [task_id for task_id in order if task_id not in selected]


def test_a_move_whose_walk_holds_nothing_it_may_take_says_so_instead_of_walking_for_ever(
    test_vhost_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The archive's first walk-full (2 channels here) holds none of the selected events: the next walk would hold
    the same ones. Before, the command line's replay walked them again and again (here: until the test's stop)."""
    monkeypatch.setattr(operations, "WALK_CHANNELS", 2)
    with Connection(test_vhost_url) as connection:
        order, _ = fill(connection, "classic")
        beyond = frozenset(order[2 * operations.CHANNEL_SHARE :])
        stop = threading.Event()
        timer = threading.Timer(20, stop.set)
        timer.start()
        try:
            with pytest.raises(UnsupportedOperationError, match="none of the archive's first 1024 messages"):
                operations.move(
                    connection, "billing", Selection(task_ids=beyond), queue_type="classic", stop=stop, purge=True
                )
        finally:
            timer.cancel()
        assert not stop.is_set(), "said at once"
        assert archived_ids(connection) == order, "nothing taken"


def test_a_quorum_walk_stays_on_one_channel(test_vhost_url: str) -> None:
    with Connection(test_vhost_url) as connection:
        order, _ = fill(connection, "quorum")
        walk = operations.Walk(connection, QUEUE, "quorum")
        try:
            channels = {message.channel.channel_id for _, message in walk}
        finally:
            walk.close()
        assert len(channels) == 1
        assert archived_ids(connection) == order


def test_a_classic_replay_killed_half_way_with_arrivals_keeps_the_order_and_loses_nothing(
    test_vhost_url: str,
) -> None:
    with Connection(test_vhost_url) as connection:
        order, selected = fill(connection, "classic")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery_event_operator.cli",
            "archive",
            "replay",
            "billing",
            "--broker-url",
            test_vhost_url,
            "--queue-type",
            "classic",
            "--event",
            CREATED,
            "--rate",
            "100",  # 100 → 694 replayed takes ~7 s: the kill lands in the middle even on a busy machine
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    handler_queue = naming.handler_queue_name("billing", CREATED)
    arrivals = Arrivals(test_vhost_url, every=1)
    try:
        eventually(lambda: depth(test_vhost_url, handler_queue) >= 100, timeout=30)
        for _ in range(ARRIVALS):
            arrivals()
        eventually(lambda: depth(test_vhost_url, handler_queue) >= 200, timeout=30)
    finally:
        arrivals.close()
    process.send_signal(signal.SIGKILL)
    process.wait(10)

    handler_ids = [message.headers["id"] for message in drain(test_vhost_url, handler_queue)]
    assert 200 <= len(handler_ids) < len(selected)
    eventually(lambda: depth(test_vhost_url, QUEUE) >= ARCHIVED + ARRIVALS - len(handler_ids), timeout=30)
    with Connection(test_vhost_url) as connection:
        left = archived_ids(connection)
    assert set(handler_ids) | set(left) == set(order) | set(arrivals.ids), "each message archived or replayed"
    in_both = set(handler_ids) & set(left)
    # Copies are confirmed in batches (what was taken within CONFIRM_SECONDS), and the pace may let a burst of
    # CATCH_UP_SECONDS through after a stall (a run on a loaded machine had 10 both): at 100/s, about 15.
    in_flight = 100 * (operations.CONFIRM_SECONDS + operations.CATCH_UP_SECONDS) + 2
    assert len(in_both) <= in_flight, "at most the batch in flight is both"
    assert left == [task_id for task_id in order if task_id in set(left)] + arrivals.ids, (
        "what stays in its original order, the arrivals after it"
    )
    assert Counter(handler_ids).most_common(1)[0][1] == 1
    assert not set(arrivals.ids) & set(handler_ids), "no arrival replayed by a walk that began before it"
    assert listed(test_vhost_url)[-1]["task_id"] == arrivals.ids[-1]


def test_a_count_of_a_classic_archive_takes_it_on_one_consumer(test_vhost_url: str) -> None:
    """A count acknowledges nothing: one consumer takes the whole archive at once, where a chain would leave most of
    it ready to another client's basic.get while it counts (the count then came up short)."""
    with Connection(test_vhost_url) as connection:
        fill(connection, "classic")
        walk = operations.Walk(connection, QUEUE, "classic")
        try:
            assert (walk.chained, len(walk.channels)) == (False, 1)
            assert sum(1 for _ in walk) == ARCHIVED
        finally:
            walk.close()
