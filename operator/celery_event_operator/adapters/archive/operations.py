"""List, replay and purge a service's archive (I/O with py-amqp through kombu).

Reading never changes the archive. AMQP cannot browse a queue, so the tools consume messages without
acknowledging them, on a channel of their own, and close it: the broker then returns every
unacknowledged message to its original position (measured on classic and quorum queues: order kept,
bench/replay_speed.py). They consume (basic.consume, one consumer whose window covers the archive: see Walk),
not one basic.get per message: a round trip per message made a replay of 20,000 archived events with 60 %
passed over run at ~130/s. Nothing is acknowledged but what was replayed — after the broker confirmed the
copies, confirmed in small batches — or purged, so a replay killed half-way leaves each message either still
archived or replayed, with at most the batch in flight both (CONFIRM_BATCH, CONFIRM_SECONDS).

A move holds the messages it passes over unacknowledged; RabbitMQ closes a channel whose deliveries
stay unacknowledged longer than its `consumer_timeout` (30 min by default), and a prefetch count has 16 bits,
so a long, rate-limited move (or one passing over more than PREFETCH_LIMIT messages) closes its channel every
SEGMENT_SECONDS (or when its window is full) and walks the archive again from its head: what it moved is gone
from there, what it passed over is passed over again.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator.core import naming
from celery_event_operator.core.archive.messages import Archived, Selection, describe, replay_headers
from celery_event_operator.core.errors import ArchiveNotFoundError, BrokerUnavailableError

Progress = Callable[[int, int | None], None]  # done, of how many (None: not counted yet)
SEGMENT_SECONDS = 600.0
PREFETCH_LIMIT = 65_535  # AMQP's prefetch count is a 16-bit number
# Replayed copies are confirmed by the broker in batches of at most this many, or this old: one round trip per
# batch instead of per message; a SIGKILL mid-batch replays at most the batch twice.
CONFIRM_BATCH = 64
CONFIRM_SECONDS = 0.05
CONFIRM_TIMEOUT_SECONDS = 60.0
IDLE_SECONDS = 1.0
TICK_SECONDS = 1.0  # heartbeats are 30 s apart (replay/runner.py): ticking once a second keeps them
RETURN_SECONDS, RETURN_POLL_SECONDS = 10.0, 0.01  # how long a closed walk waits for what it put back, polled
CATCH_UP_SECONDS = 0.1  # a consumer with room in its window and nothing delivered for this long has seen all there is


@dataclasses.dataclass
class Survey:
    archived: int  # messages in the archive
    matched: int  # of which the selection takes
    sample: list[Archived]  # the first matching ones, oldest first (as many as asked for)
    seen: int = 0  # messages the walk was given: fewer than `archived` when another client took some meanwhile


@dataclasses.dataclass
class Tally:
    """What a move did (updated as it goes: another thread may read it meanwhile)."""

    done: int = 0  # replayed (the copy confirmed) or purged
    unroutable: int = 0  # a replay found no queue for it: it stays archived
    first: Archived | None = None
    last: Archived | None = None
    # Set when the move was one walk over every message the archive held when it began: what it saw then is the
    # archive's count, without walking it again.
    whole: bool = False
    archived: int = 0  # messages that walk saw
    selected: int = 0  # of which the selection took (moved, or left: unroutable, beyond the limit)


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


class Walk:
    """Every message the archive held when the walk began, once, oldest first, left unacknowledged (on a channel of
    its own: closing it puts back what was not acknowledged).

    One consumer whose prefetch window covers the archive (up to AMQP's 16-bit limit): what it passes over stays
    unacknowledged and keeps its place. Consumers restarted with a smaller window lost the order on quorum queues
    (measured: returned in another order); one consumer kept it on classic and quorum queues. A walk that passed
    over a whole window ends short (`window_full`): the move walks again. Copies are published on another
    connection (Confirmed), so the deliveries the broker sends ahead never hold up the publishing.
    """

    def __init__(self, connection: Connection, queue: str) -> None:
        self.channel = connection.channel()
        self.queue = queue
        self.ready = _depth(self.channel, queue)  # what the walk takes: later arrivals are after the start
        self.prefetch = max(1, min(PREFETCH_LIMIT, self.ready))
        self.unacked = 0
        self.window_full = False
        self.received = 0
        self._ticked = 0.0
        self._delivered: collections.deque[amqp.Message] = collections.deque()
        self.channel.basic_qos(0, self.prefetch, False)
        self.channel.basic_consume(queue, callback=self._delivered.append, no_ack=False)

    def __iter__(self) -> Iterator[tuple[Archived, amqp.Message]]:
        connection = self.channel.connection
        while self.received < self.ready:
            if not self._delivered:
                if self.unacked >= self.prefetch:
                    self.window_full = True
                    return
                self._tick(connection)
                try:
                    connection.drain_events(timeout=IDLE_SECONDS)
                except TimeoutError:
                    # A lazy queue may pause while it reads from disk: the walk ends only when nothing is ready
                    # (the rest expired, or was taken by another client meanwhile).
                    if _depth(self.channel, self.queue) == 0:
                        return
                continue
            message = self._delivered.popleft()
            position = self.received
            self.received += 1
            self.unacked += 1
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

    def _tick(self, connection: Any) -> None:
        """Heartbeats kept (with them on, the broker drops a connection whose holder died), once a second: per
        drain, py-amqp's tick cost the walk time and, with debug logging, wrote two lines per message."""
        now = time.monotonic()
        if now - self._ticked >= TICK_SECONDS:
            self._ticked = now
            connection.heartbeat_tick()

    def ack(self, message: amqp.Message) -> None:
        self.channel.basic_ack(message.delivery_tag)
        self.unacked -= 1

    def close(self) -> None:
        """What was not acknowledged goes back to its place in the archive — a moment after its channel closed
        (measured on a quorum archive: empty just after, 20,000 back a few milliseconds later): a walk that began
        then would see part of the archive, or none of it, as all there is. So it waits, RETURN_SECONDS at most, until
        the archive holds them again (arrivals only add to it; another client may take some meanwhile)."""
        held, connection = self.unacked, self.channel.connection
        if not held:
            self.channel.close()
            return
        try:
            expected = _depth(self.channel, self.queue) + held  # ready meanwhile (arrivals), and what it gives back
        except (amqp.exceptions.AMQPError, OSError):
            expected = 0  # the connection failed: the broker puts them back when it drops it
        self.channel.close()
        if expected:
            _wait_for(connection, self.queue, expected)


def _wait_for(connection: Any, queue: str, count: int) -> None:
    channel = connection.channel()
    try:
        deadline = time.monotonic() + RETURN_SECONDS
        while _depth(channel, queue) < count and time.monotonic() < deadline:
            time.sleep(RETURN_POLL_SECONDS)
    finally:
        channel.close()


def archive_size(connection: Connection, service: str) -> int:
    channel = connection.channel()
    try:
        return _depth(channel, naming.archive_name(service))
    finally:
        channel.close()


def list_archive(connection: Connection, service: str, selection: Selection) -> list[Archived]:
    walk = Walk(connection, naming.archive_name(service))
    try:
        return [item for item, _ in walk if selection.matches(item)]
    finally:
        walk.close()  # nothing was acknowledged: every message goes back where it was


def survey(connection: Connection, service: str, selection: Selection, keep: int = 0) -> Survey:
    """How many archived messages the selection takes, and the first `keep` of them; changes nothing."""
    walk = Walk(connection, naming.archive_name(service))
    found = Survey(archived=walk.ready, matched=0, sample=[])
    try:
        for item, _ in walk:
            if selection.matches(item):
                found.matched += 1
                if len(found.sample) < keep:
                    found.sample.append(item)
        found.seen = walk.received
    finally:
        walk.close()  # nothing was acknowledged: every message goes back where it was
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
    """At most `rate` messages a second, on a schedule (the time a move itself takes counts). Time spent walking
    over passed-over messages is made up within CATCH_UP_SECONDS (a short burst, never more); a longer pause is not.
    """

    def __init__(self, rate: float | None, stop: threading.Event) -> None:
        self._interval = 1 / rate if rate else 0.0
        self._stop = stop
        self._next = time.monotonic()

    def wait(self) -> bool:
        """Wait for the next slot; True when stopped meanwhile."""
        if not self._interval:
            return self._stop.is_set()
        now = time.monotonic()
        self._next = max(self._next + self._interval, now - CATCH_UP_SECONDS)
        return self._stop.wait(self._next - now) if self._next > now else self._stop.is_set()


class Confirmed:
    """Publishes on a channel of its own in confirm mode; `settle` waits for the broker's confirms of everything
    published and says which copies no queue took (mandatory, returned)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection.clone()  # not the walk's: its deliveries must not hold up the confirms
        self.channel = self._connection.channel()
        self.channel.confirm_select()
        self._published = 0
        self._unconfirmed: set[int] = set()
        self._nacked = False
        self._sent: dict[int, tuple[str, str, bytes]] = {}
        self._returned: set[int] = set()
        self.channel.events["basic_ack"].add(self._on_ack)
        self.channel.events["basic_nack"].add(self._on_nack)
        self.channel.events["basic_return"].add(self._on_return)

    def publish(self, message: amqp.Message, exchange: str, key: str) -> int:
        self._published += 1
        self._unconfirmed.add(self._published)
        self._sent[self._published] = (exchange, key, _body(message))
        self.channel.basic_publish(message, exchange=exchange, routing_key=key, mandatory=True)
        return self._published

    def settle(self) -> set[int]:
        """Wait for every confirm; the publications that were returned (no queue took them)."""
        while self._unconfirmed:
            self._connection.drain_events(timeout=CONFIRM_TIMEOUT_SECONDS)
        if self._nacked:
            raise BrokerUnavailableError("the broker refused to take replayed copies (negative confirm)")
        returned, self._returned = self._returned, set()
        self._sent.clear()
        return returned

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._unconfirmed -= set(range(min(self._unconfirmed, default=tag), tag + 1)) if multiple else {tag}

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._nacked = True
        self._on_ack(tag, multiple)

    def _on_return(self, _error: Any, exchange: str, key: str, message: amqp.Message) -> None:
        # A return comes before the confirm of its publication: the earliest unconfirmed one alike is it.
        sent = (exchange, key, _body(message))
        found = next((tag for tag in sorted(self._unconfirmed - self._returned) if self._sent[tag] == sent), None)
        if found is not None:
            self._returned.add(found)

    def close(self) -> None:
        self._connection.release()


class _Pass:
    """One walk of the archive: the selected messages' copies published, confirmed in batches, and their originals
    acknowledged once confirmed (or, for a purge, acknowledged in batches); the rest held until the walk closes."""

    def __init__(
        self,
        connection: Connection,
        queue: str,
        route: Callable[[str], tuple[str, str]] | None,
        tally: Tally,
        progress: Callable[[Tally], None] | None,
    ) -> None:
        self.walk = Walk(connection, queue)
        self._publisher = Confirmed(connection) if route is not None else None
        self._route = route
        self._tally = tally
        self._progress = progress
        self._batch: list[tuple[Archived, amqp.Message, int]] = []
        self._began = 0.0

    @property
    def pending(self) -> int:
        return len(self._batch)

    def due(self) -> bool:
        return bool(self._batch) and (
            len(self._batch) >= CONFIRM_BATCH or time.monotonic() - self._began > CONFIRM_SECONDS
        )

    def take(self, item: Archived, message: amqp.Message) -> None:
        if not self._batch:
            self._began = time.monotonic()
        tag = 0
        if self._publisher is not None and self._route is not None:
            properties = dict(message.properties)
            properties["application_headers"] = replay_headers(properties.get("application_headers") or {})
            exchange, key = self._route(item.event)
            tag = self._publisher.publish(amqp.Message(_body(message), **properties), exchange, key)
        self._batch.append((item, message, tag))

    def settle(self) -> None:
        returned = self._publisher.settle() if self._publisher is not None else set()
        tally = self._tally
        for item, message, tag in self._batch:
            if tag in returned:  # no queue took it (a handler no longer planned): it stays archived
                tally.unroutable += 1
                continue
            self.walk.ack(message)  # a replayed one only once its copy is confirmed
            tally.done += 1
            tally.first = tally.first or item
            tally.last = item
        self._batch.clear()
        if self._progress is not None:
            self._progress(tally)

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
        self.walk.close()  # what was not moved goes back to its place in the archive


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
    walked_to_the_end = False
    passes = 0
    while not walked_to_the_end and not stop.is_set() and (limit is None or tally.done < limit):
        one = _Pass(connection, queue, route, tally, progress)
        passes += 1
        segment_ends = time.monotonic() + SEGMENT_SECONDS
        selected = 0
        try:
            walked_to_the_end, cut = True, False
            for item, message in one.walk:
                if one.due():
                    one.settle()
                if stop.is_set() or (limit is not None and tally.done + one.pending >= limit):
                    cut = True
                    break
                if time.monotonic() > segment_ends:
                    walked_to_the_end = False
                    break
                if not selection.matches(item):
                    continue
                selected += 1
                if pace.wait():
                    cut = True
                    break
                one.take(item, message)
            one.settle()
            walked_to_the_end = walked_to_the_end and not one.walk.window_full
            seen_all = walked_to_the_end and not cut and one.walk.received == one.walk.ready
            tally.whole, tally.archived, tally.selected = passes == 1 and seen_all, one.walk.ready, selected
        finally:
            one.close()
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
    """The command line's replay: what was archived when it started and is selected, at most `limit`.

    Without a limit (or a dry run) it walks the archive once: the move counts what it selects as it goes (a
    survey first would walk 20,000 archived events twice to replay 8,000 of them); only a move that needed more
    than one walk counts what it left with a survey afterwards."""
    selection = dataclasses.replace(selection, started_at=time.time())
    channel = connection.channel()
    try:
        summary = Summary(archived=_depth(channel, naming.archive_name(service)))
        summary.target = replay_route(channel, service)("<event>")[0] or "the handler queues (default exchange)"
    finally:
        channel.close()
    total: int | None = None
    if dry_run or limit is not None:
        surveyed = survey(connection, service, selection)
        summary.archived, summary.matched = surveyed.archived, surveyed.matched
        total = surveyed.matched if limit is None else min(limit, surveyed.matched)
    if dry_run:
        summary.done = total or 0
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
    if total is None:
        left = tally.selected - tally.done if tally.whole else survey(connection, service, selection).matched
        summary.matched = tally.done + left
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
