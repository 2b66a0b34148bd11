"""A replay's first walk is its count (its broker runner on a real RabbitMQ, the operator's own code without the
API): it begins on the archive's size, and may end from what that walk saw only when the walk was given every
message the archive held when the replay began and none archived since in their place. Otherwise it counts again:
one of its events may be held by another client, and `Replayed` would then be said with that event still archived.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.adapters.replay.runner import ReplayRunner
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.archive.messages import Selection
from celery_event_operator.core.broker.settings import settings_from_secret
from celery_event_operator.core.errors import UnsupportedOperationError
from celery_event_operator.core.replay.conclusion import ArchiveSeen
from celery_event_operator.core.topology import plan
from tests.integration.archive.test_archive_tools import CREATED, SPEC, archive_task

QUEUE = naming.archive_name("billing")
ARCHIVED = 20


def arrival(channel: amqp.Channel) -> None:
    """An event archived now, after the replay started (its archived-at header says so)."""
    archive_task(channel, ARCHIVED, CREATED, archived_at=time.time() + 5)


def archived_with_a_runner(
    url: str, connection: Connection, queue_type: str, runner_class: type[ReplayRunner] = ReplayRunner
) -> tuple[amqp.Channel, ReplayRunner]:
    """`ARCHIVED` events archived (before the test's replay starts), and the replay's broker runner."""
    apply.apply(connection, plan.plan("billing", parse_spec({**SPEC, "queueType": queue_type})))
    channel = connection.channel()
    for index in range(ARCHIVED):
        archive_task(channel, index, CREATED)
    settings = settings_from_secret({"url": url}, namespace="default", secret="rabbitmq", spec=parse_spec(SPEC))
    return channel, runner_class(settings, queue_type)


def first_walk(url: str, queue_type: str, *, grab: bool) -> tuple[ArchiveSeen, int, ArchiveSeen | None]:
    """The runner's first look (the size), then, with `grab`, another client takes one of the archived events (and
    holds it) while one arrives; then its first walk: what it looked at, what the walk moved, what it concludes."""
    with Connection(url) as connection:
        channel, runner = archived_with_a_runner(url, connection, queue_type)
        selection = Selection(started_at=time.time())

        async def replay() -> tuple[ArchiveSeen, int, ArchiveSeen | None]:
            looked = await runner.observe("billing", selection, count=False)
            if grab:
                assert channel.basic_get(QUEUE, no_ack=False) is not None  # held until this test ends
                arrival(channel)
            moved = await runner.move("billing", selection, purge=False, limit=None, rate=None)
            return looked, moved.done, await runner.seen_after_move("billing")

        try:
            return asyncio.run(replay())
        finally:
            runner.close()


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_first_walk_given_every_event_it_began_with_is_its_count(test_vhost_url: str, queue_type: str) -> None:
    looked, moved, concluded = first_walk(test_vhost_url, queue_type, grab=False)
    assert (looked.archived, looked.selected) == (ARCHIVED, None), "begun on the archive's size, not counted"
    assert moved == ARCHIVED
    assert concluded == ArchiveSeen(0, 0, 0), "ends from what the walk saw: nothing left, nothing held"


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_first_walk_given_an_arrival_in_place_of_a_held_event_counts_again(
    test_vhost_url: str, queue_type: str
) -> None:
    """Before the check, the walk's 19 moved and 0 selected left read as matched 19, replayed 19 — while the event
    the other client held went back to the archive after `Replayed`."""
    looked, moved, concluded = first_walk(test_vhost_url, queue_type, grab=True)
    assert looked.archived == ARCHIVED
    assert moved == ARCHIVED - 1, "the held one was not given to the walk; the arrival was, and is not taken"
    assert concluded is None, "counted again (where the held event is seen held), not ended from the walk"


def begin_on(url: str, queue_type: str, runner_class: type[ReplayRunner] = ReplayRunner) -> ArchiveSeen:
    """What a replay begins on: the runner's look at the archive's size (`ARCHIVED` archived events)."""
    with Connection(url) as connection:
        _, runner = archived_with_a_runner(url, connection, queue_type, runner_class)
        try:
            return asyncio.run(runner.observe("billing", Selection(started_at=time.time()), count=False))
        finally:
            runner.close()


def test_an_archive_larger_than_one_walk_is_refused_before_anything_moves(
    test_vhost_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when it counted first: beyond one walk its first walk could not count it (nor end), so it waits with the
    reason. The bound is lowered to the test's archive (65,535 on one consumer otherwise)."""
    monkeypatch.setattr(operations, "PREFETCH_LIMIT", ARCHIVED - 1)
    with pytest.raises(UnsupportedOperationError, match=f"more messages than one walk can count \\({ARCHIVED}\\)"):
        begin_on(test_vhost_url, "quorum")


def test_a_size_read_after_another_client_took_some_is_not_begun_on(test_vhost_url: str) -> None:
    """Nothing held when the statistics were asked, then a client takes one (as `archive list` does) before the size
    is read: the size is short of what was ready, so what was taken counts as held, and the replay waits — before,
    it began on the rest, and ended Replayed with the taken ones still archived once they were back."""
    grabbed: list[Any] = []

    class Grabbing(ReplayRunner):
        async def _held_elsewhere(self, service: str, *, refreshed_only: bool = False) -> tuple[int | None, int | None]:
            found = await super()._held_elsewhere(service, refreshed_only=refreshed_only)
            connection = Connection(test_vhost_url)
            channel = connection.channel()
            grabbed.append((connection, channel.basic_get(QUEUE, no_ack=False)))
            return found

    try:
        seen = begin_on(test_vhost_url, "classic", Grabbing)
    finally:
        for connection, _ in grabbed:
            connection.release()
    assert grabbed[0][1] is not None
    assert (seen.archived, seen.selected, seen.held_elsewhere) == (0, None, 1), "waits: one is held"
