"""List, replay and purge a service's archive (I/O with py-amqp through kombu).

Reading never changes the archive. AMQP cannot browse a queue, so the tools take messages without
acknowledging them, on a channel of their own, and close it: the broker then returns every
unacknowledged message to its original position. (A basic.get + requeue per message would do the
same one by one; holding them until the end also keeps one listing free of the messages it already
saw.) Nothing is acknowledged but what was replayed — after the broker confirmed the copy — or
purged, so a replay killed half-way leaves each message either still archived or replayed, with at
most the one in flight both.

A move holds the messages it passes over unacknowledged; RabbitMQ closes a channel whose deliveries
stay unacknowledged longer than its `consumer_timeout` (30 min by default), so a long, rate-limited move
closes its channel every SEGMENT_SECONDS and walks the archive again from its head: what it moved is gone
from there, what it passed over is passed over again.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator.core import naming
from celery_event_operator.core.archive.messages import Archived, Selection, describe, replay_headers
from celery_event_operator.core.errors import ArchiveNotFoundError

Progress = Callable[[int, int], None]
SEGMENT_SECONDS = 600.0


@dataclasses.dataclass
class Survey:
    archived: int  # messages in the archive
    matched: int  # of which the selection takes
    sample: list[Archived]  # the first matching ones, oldest first (as many as asked for)


@dataclasses.dataclass
class Tally:
    """What a move did (updated as it goes: another thread may read it meanwhile)."""

    done: int = 0  # replayed (the copy confirmed) or purged
    unroutable: int = 0  # a replay found no queue for it: it stays archived
    first: Archived | None = None
    last: Archived | None = None


@dataclasses.dataclass
class Summary:
    archived: int = 0  # messages in the archive when the tool started
    matched: int = 0
    done: int = 0  # replayed or purged (or, with --dry-run, would be)
    unroutable: int = 0  # replay found no queue for it: it stays archived
    target: str = ""


def _body(message: amqp.Message) -> bytes:
    body = message.body
    return body.encode() if isinstance(body, str) else bytes(body)


def _depth(channel: Any, queue: str) -> int:
    try:
        count: int = channel.queue_declare(queue, passive=True).message_count
    except amqp.exceptions.NotFound:
        raise ArchiveNotFoundError(
            f"there is no archive queue {queue!r} on this broker (is the archive enabled, and are the vhost and "
            "the serviceName right?)"
        ) from None
    return count


def _browse(channel: Any, queue: str) -> Iterator[tuple[Archived, amqp.Message]]:
    """Every message of the queue once, oldest first, left unacknowledged."""
    count = _depth(channel, queue)
    for position in range(count):
        channel.connection.heartbeat_tick()  # with heartbeats on, the broker drops a connection whose holder died
        message = channel.basic_get(queue, no_ack=False)
        if message is None:
            return
        properties = dict(message.properties)
        yield (
            describe(
                position,
                _body(message),
                properties.get("application_headers") or {},
                properties,
                message.delivery_info.get("routing_key", ""),
            ),
            message,
        )


def archive_size(connection: Connection, service: str) -> int:
    channel = connection.channel()
    try:
        return _depth(channel, naming.archive_name(service))
    finally:
        channel.close()


def list_archive(connection: Connection, service: str, selection: Selection) -> list[Archived]:
    channel = connection.channel()
    try:
        return [item for item, _ in _browse(channel, naming.archive_name(service)) if selection.matches(item)]
    finally:
        channel.close()  # nothing was acknowledged: every message goes back where it was


def survey(connection: Connection, service: str, selection: Selection, keep: int = 0) -> Survey:
    """How many archived messages the selection takes, and the first `keep` of them; changes nothing."""
    channel = connection.channel()
    found = Survey(archived=_depth(channel, naming.archive_name(service)), matched=0, sample=[])
    try:
        for item, _ in _browse(channel, naming.archive_name(service)):
            if selection.matches(item):
                found.matched += 1
                if len(found.sample) < keep:
                    found.sample.append(item)
    finally:
        channel.close()  # nothing was acknowledged: every message goes back where it was
    return found


def replay_route(channel: Any, service: str) -> Callable[[str], tuple[str, str]]:
    """Back to this service's handler queues only: through its recover exchange (by the event's key),
    or, without retry levels, straight to the handler queue. The shared events exchange would hand
    the event again to every other service that handled it fine."""
    recover = naming.recover_name(service)
    try:
        channel.exchange_declare(recover, "topic", passive=True)
    except amqp.exceptions.NotFound:
        return lambda event: ("", naming.handler_queue_name(service, event))
    return lambda event: (recover, event)


class Pace:
    """At most `rate` messages a second, on a schedule (the time a move itself takes counts)."""

    def __init__(self, rate: float | None, stop: threading.Event) -> None:
        self._interval = 1 / rate if rate else 0.0
        self._stop = stop
        self._next = time.monotonic()

    def wait(self) -> bool:
        """Wait for the next slot; True when stopped meanwhile."""
        if not self._interval:
            return self._stop.is_set()
        now = time.monotonic()
        self._next = max(self._next + self._interval, now - self._interval)  # no burst after a pause
        return self._stop.wait(self._next - now) if self._next > now else self._stop.is_set()


def move(
    connection: Connection,
    service: str,
    selection: Selection,
    *,
    purge: bool = False,
    limit: int | None = None,
    rate: float | None = None,
    tally: Tally | None = None,
    stop: threading.Event | None = None,
    progress: Callable[[Tally], None] | None = None,
) -> Tally:
    """Replay (or purge) the selected archived messages, oldest first, at most `limit` of them, until `stop`.

    A replayed message is acknowledged only once the broker confirmed its copy; one that no queue takes
    (mandatory publish returned) stays archived and is counted as unroutable.
    """
    tally = tally if tally is not None else Tally()
    stop = stop or threading.Event()
    pace = Pace(rate, stop)
    queue = naming.archive_name(service)
    route = _route(connection, service) if not purge else None
    returned: list[str] = []
    walked_to_the_end = False
    while not walked_to_the_end and not stop.is_set() and (limit is None or tally.done < limit):
        channel = connection.channel()
        channel.events["basic_return"].add(lambda exc, exchange, key, message: returned.append(key))
        segment_ends = time.monotonic() + SEGMENT_SECONDS
        try:
            walked_to_the_end = True
            for item, message in _browse(channel, queue):
                if stop.is_set() or (limit is not None and tally.done >= limit):
                    break
                if time.monotonic() > segment_ends:
                    walked_to_the_end = False
                    break
                if not selection.matches(item):
                    continue
                if route is not None:
                    properties = dict(message.properties)
                    properties["application_headers"] = replay_headers(properties.get("application_headers") or {})
                    exchange, key = route(item.event)
                    returned.clear()
                    channel.basic_publish_confirm(
                        amqp.Message(_body(message), **properties), exchange=exchange, routing_key=key, mandatory=True
                    )
                    if returned:  # no queue took it (a handler no longer planned): it stays archived
                        tally.unroutable += 1
                        continue
                channel.basic_ack(message.delivery_tag)  # a replayed one only once its copy is confirmed
                tally.done += 1
                tally.first = tally.first or item
                tally.last = item
                if progress is not None:
                    progress(tally)
                if pace.wait():
                    break
        finally:
            channel.close()  # what was not moved goes back to its place in the archive
    return tally


def _route(connection: Connection, service: str) -> Callable[[str], tuple[str, str]]:
    channel = connection.channel()
    try:
        return replay_route(channel, service)
    finally:
        channel.close()


def replay(
    connection: Connection,
    service: str,
    selection: Selection,
    *,
    limit: int | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    progress: Progress | None = None,
) -> Summary:
    """The command line's replay: what was archived when it started and is selected, at most `limit`."""
    selection = dataclasses.replace(selection, started_at=time.time())
    surveyed = survey(connection, service, selection)
    total = surveyed.matched if limit is None else min(limit, surveyed.matched)
    summary = Summary(archived=surveyed.archived, matched=surveyed.matched)
    channel = connection.channel()
    try:
        summary.target = replay_route(channel, service)("<event>")[0] or "the handler queues (default exchange)"
    finally:
        channel.close()
    if dry_run:
        summary.done = total
        return summary
    tally = move(
        connection,
        service,
        selection,
        limit=limit,
        rate=rate,
        progress=None if progress is None else lambda tally: progress(tally.done, total),
    )
    summary.done, summary.unroutable = tally.done, tally.unroutable
    return summary


def purge(connection: Connection, service: str, selection: Selection) -> Summary:
    queue = naming.archive_name(service)
    summary = Summary(archived=archive_size(connection, service))
    if selection.everything:
        channel = connection.channel()
        try:
            summary.matched = summary.done = int(channel.queue_purge(queue) or 0)
        finally:
            channel.close()
        return summary
    tally = move(connection, service, selection, purge=True)
    summary.matched = summary.done = tally.done
    return summary
