"""List, replay and purge a service's archive (I/O with py-amqp through kombu).

Reading never changes the archive. AMQP cannot browse a queue, so the tools consume messages without
acknowledging them, on channels of their own, and close them: the broker then returns every
unacknowledged message to its original position (measured on classic and quorum queues: order kept,
bench/replay_speed.py). They consume (basic.consume, one consumer at a time on a chain of channels: see Walk),
not one basic.get per message: a round trip per message made a replay of 20,000 archived events with 60 %
passed over run at ~130/s. Nothing is acknowledged but what was replayed — after the broker confirmed the
copies, confirmed in small batches — or purged, so a replay killed half-way leaves each message either still
archived or replayed, with at most the batch in flight both (CONFIRM_BATCH, CONFIRM_SECONDS).

A move holds the messages it passes over unacknowledged; RabbitMQ closes a channel whose deliveries
stay unacknowledged longer than its `consumer_timeout` (30 min by default), and a connection has a bounded number
of channels, so a long, rate-limited move (or one passing over more than a walk's channels hold) closes its
channels every SEGMENT_SECONDS (or when a walk may open no more) and walks the archive again from its head: what
it moved is gone from there, what it passed over is passed over again.
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
# A walk takes this many messages on one channel, then goes on on another (see Walk), and opens at most WALK_CHANNELS
# channels: 102,400 messages a walk (a consumer's window, in one channel, had AMQP's 16-bit limit: 65,535).
CHANNEL_SHARE = 512
WALK_CHANNELS = 200
# Replayed copies are confirmed by the broker in batches of at most this many, or this old: one round trip per
# batch instead of per message; a SIGKILL mid-batch replays at most the batch twice.
CONFIRM_BATCH = 64
CONFIRM_SECONDS = 0.05
CONFIRM_TIMEOUT_SECONDS = 60.0
IDLE_SECONDS = 1.0
RETURN_SECONDS, RETURN_POLL_SECONDS = 5.0, 0.02
QUIET_SECONDS = 0.1  # a consumer cancelled with room in its window: what was in flight to it has come by then
CATCH_UP_SECONDS = 0.1  # a consumer with room in its window and nothing delivered for this long has seen all there is


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
    # Set when the move was one walk over every message the archive held when it began: what it saw then is the
    # archive's count, without walking it again.
    whole: bool = False
    archived: int = 0  # messages that walk saw
    selected: int = 0  # of which the selection took (moved, or left: unroutable, beyond the limit)
    # Of which were archived before the selection's start (known archive time): a replay that sees every one of
    # those it began with still archived knows that no other client holds any (replay/runner.py).
    earlier: int = 0


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
    """Every message the archive held when the walk began, once, oldest first, left unacknowledged (on channels of
    its own: closing them puts back what was not acknowledged).

    One consumer at a time, in order: once a consumer took CHANNEL_SHARE messages it is cancelled (its channel
    stays open, holding what it delivered: an acknowledgement after the cancel is valid) and the walk goes on with
    a new channel and consumer on the same queue. RabbitMQ finds an acknowledged delivery by scanning its
    channel's unacknowledged deliveries from the oldest (rabbit_channel:collect_acks, rabbitmq-server#1511): with
    one channel holding every passed-over message, each acknowledgement cost O(passed over) and a selective replay
    O(selected x passed over) — 2.7 ms an acknowledgement with 10,000 held. Each one now scans at most a share.
    Each message is acknowledged on the channel it came on. What was not acknowledged is put back channel by
    channel, oldest first (close), so it keeps its original order (classic: to its place; quorum: returned in
    return order) — measured for a walk that ends; after a SIGKILL the broker returns it itself, in an order not
    measured on quorum queues.
    A walk opens at most WALK_CHANNELS channels; one that would need more ends short (`window_full`): the move
    walks again. Copies are published on another connection (Confirmed), so the deliveries the broker sends ahead
    never hold up the publishing.
    """

    def __init__(self, connection: Connection, queue: str) -> None:
        self._connection = connection
        first = connection.channel()
        self.channels = [first]
        self.queue = queue
        self.ready = _depth(first, queue)  # what the walk takes: later arrivals are after the start
        self.window_full = False
        self.received = 0
        self._delivered: collections.deque[amqp.Message] = collections.deque()
        self._consumer: tuple[Any, str] | None = None
        self._taken_by_consumer = self._acked_of_consumer = 0
        self._held: dict[Any, set[int]] = {}  # each channel's delivery tags not acknowledged
        # A connection has at most channel_max channels (2,047 by default on RabbitMQ; 0: no limit but the 16-bit
        # channel number): leave some to its other uses.
        channel_max = int(connection.connection.channel_max or 65_535)
        self._most_channels = max(1, min(WALK_CHANNELS, channel_max - 16))
        self._consume(first)

    def _consume(self, channel: Any) -> None:
        self._taken_by_consumer = self._acked_of_consumer = 0
        channel.basic_qos(0, CHANNEL_SHARE, False)
        self._consumer = (channel, channel.basic_consume(self.queue, callback=self._deliver, no_ack=False))

    def _deliver(self, message: amqp.Message) -> None:
        self._taken_by_consumer += 1
        self._held.setdefault(message.channel, set()).add(message.delivery_tag)
        self._delivered.append(message)

    def _next_channel(self) -> None:
        """Go on with a new consumer on a new channel, unless the walk has as many channels as it may open."""
        self._cancel()
        if len(self.channels) < self._most_channels:
            channel = self._connection.channel()
            self.channels.append(channel)
            self._consume(channel)

    def _cancel(self) -> None:
        """Cancel the current consumer once its window is full (or nothing more comes and nothing is ready): then
        nothing is in flight to it. A quorum queue's deliveries in flight at a cancel come after the cancel-ok,
        and py-amqp rejects those back to the queue (measured: out of order)."""
        assert self._consumer is not None
        channel, tag = self._consumer
        while self._taken_by_consumer - self._acked_of_consumer < CHANNEL_SHARE:
            if not self._drain(channel, QUIET_SECONDS):
                break
        channel.basic_cancel(tag)
        self._consumer = None

    def _drain(self, channel: Any, timeout: float = IDLE_SECONDS) -> bool:
        """Wait for deliveries; False when none came and nothing is ready (the rest expired, or was taken by
        another client meanwhile; a lazy queue may pause while it reads from disk)."""
        connection = channel.connection
        connection.heartbeat_tick()  # with heartbeats on, the broker drops a connection whose holder died
        try:
            connection.drain_events(timeout=timeout)
        except TimeoutError:
            return _depth(channel, self.queue) > 0
        return True

    def __iter__(self) -> Iterator[tuple[Archived, amqp.Message]]:
        while self.received < self.ready:
            if (
                self._consumer is not None
                and self._taken_by_consumer >= CHANNEL_SHARE
                and self.received + len(self._delivered) < self.ready
            ):
                self._next_channel()
            if not self._delivered:
                if self._consumer is None:
                    self.window_full = True
                    return
                if not self._drain(self._consumer[0]):
                    return
                continue
            message = self._delivered.popleft()
            position = self.received
            self.received += 1
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

    def ack(self, message: amqp.Message) -> None:
        channel = message.channel  # acknowledged on the channel it came on: delivery tags are per channel
        channel.basic_ack(message.delivery_tag)
        self._held[channel].discard(message.delivery_tag)
        if self._consumer is not None and channel is self._consumer[0]:
            self._acked_of_consumer += 1

    def close(self) -> None:
        """Put back what was not acknowledged, channel by channel, oldest first: each channel's deliveries returned
        at once (basic.nack, multiple, requeue), then the channel closed (the close-ok orders the next channel's
        return after it). Closing alone returned a cancelled consumer's deliveries out of order on a quorum queue
        (measured: part of the first channel's after the later channels').
        The current consumer is cancelled first: returned messages would be delivered to it again."""
        if self._consumer is not None:
            self._cancel()
        returning = sum(len(held) for held in self._held.values())
        expected = _depth(self.channels[0], self.queue) + returning if returning else 0
        for channel in self.channels:
            held = self._held.get(channel)
            if held:
                channel.send_method(amqp.spec.Basic.Nack, "Lbb", (max(held), True, True))  # py-amqp has no basic_nack
            channel.close()
        if returning:
            self._wait_for_returns(expected)

    def _wait_for_returns(self, expected: int) -> None:
        """The broker puts returned messages back a moment later (measured: 4,608 of 20,000 back just after 40
        channels closed): a walk that follows at once would take only those and have to walk again. Waits until the
        archive holds them — a bounded time: another client may take some meanwhile."""
        channel = self._connection.channel()
        try:
            deadline = time.monotonic() + RETURN_SECONDS
            while _depth(channel, self.queue) < expected and time.monotonic() < deadline:
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
    walk_on: bool = False,
) -> Tally:
    """Replay (or purge) the selected archived messages, oldest first, at most `limit` of them, until `stop`.

    A replayed message is acknowledged only once the broker confirmed its copy; one that no queue takes
    (mandatory publish returned) stays archived and is counted as unroutable. With `walk_on`, a move that reached
    its limit walks on to the end of the archive, taking nothing more, so that it saw the archive whole (the
    operator's replay counts what is left from it instead of walking the archive again).
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
        selected = earlier = 0
        try:
            walked_to_the_end, cut = True, False
            for item, message in one.walk:
                if one.due():
                    one.settle()
                beyond = limit is not None and tally.done + one.pending >= limit
                if stop.is_set() or (beyond and not walk_on):
                    cut = True
                    break
                if time.monotonic() > segment_ends:
                    walked_to_the_end = False
                    break
                earlier += selection.archived_before_start(item)
                if not selection.matches(item):
                    continue
                selected += 1
                if beyond:
                    continue
                if pace.wait():
                    cut = True
                    break
                one.take(item, message)
            one.settle()
            walked_to_the_end = walked_to_the_end and not one.walk.window_full
            seen_all = walked_to_the_end and not cut and one.walk.received == one.walk.ready
            tally.whole, tally.archived, tally.selected = passes == 1 and seen_all, one.walk.ready, selected
            tally.earlier = earlier
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
