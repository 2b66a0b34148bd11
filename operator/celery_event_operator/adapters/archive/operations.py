"""List, replay and purge a service's archive (I/O with py-amqp through kombu).

Reading never changes the archive. AMQP cannot browse a queue, so the tools consume messages without
acknowledging them, on channels of their own, and close them: the broker then returns every
unacknowledged message to its original position (measured on classic and quorum queues: order kept,
bench/replay_speed.py). They consume (basic.consume: one consumer whose window covers the archive, or, for a move of a
classic archive, a chain of consumers on as many channels: see Walk),
not one basic.get per message: a round trip per message made a replay of 20,000 archived events with 60 %
passed over run at ~130/s. Nothing is acknowledged but what was replayed — after the broker confirmed the
copies, confirmed in small batches — or purged, so a replay killed half-way leaves each message either still
archived or replayed, with at most the batch in flight both (CONFIRM_BATCH, CONFIRM_SECONDS).

A move holds the messages it passes over unacknowledged; RabbitMQ closes a channel whose deliveries
stay unacknowledged longer than its `consumer_timeout` (30 min by default), a prefetch count has 16 bits and a
connection a bounded number of channels, so a long, rate-limited move (or one passing over more than a walk holds:
PREFETCH_LIMIT, or WALK_CHANNELS x CHANNEL_SHARE on a classic archive) closes its channels every SEGMENT_SECONDS
(or when its walk is full) and walks the archive again from its head: what it moved is gone from there, what it
passed over is passed over again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.core import naming
from celery_event_operator.core.archive.messages import Archived, Selection, describe, replay_headers
from celery_event_operator.core.errors import ArchiveNotFoundError, BrokerUnavailableError, UnsupportedOperationError

# A header py-amqp cannot decode (a timestamp after year 9999, a table nested too deep) raised out of the walk's
# drain_events: every list, replay and purge stopped at it. Decoded now as any other value: see amqp_tables.
amqp_tables.install()

Progress = Callable[[int, int | None], None]  # done, of how many (None: not counted yet)
SEGMENT_SECONDS = 600.0
PREFETCH_LIMIT = 65_535  # AMQP's prefetch count is a 16-bit number
# A chained walk (a move of a classic archive: see Walk) takes at most this many messages on one channel, then goes
# on on another, and opens at most WALK_CHANNELS channels: 102,400 messages a walk.
CHANNEL_SHARE = 512
WALK_CHANNELS = 200
# Replayed copies are confirmed by the broker in batches of at most this many, or this old: one round trip per
# batch instead of per message; a SIGKILL mid-batch replays at most the batch twice.
CONFIRM_BATCH = 64
CONFIRM_SECONDS = 0.05
CONFIRM_TIMEOUT_SECONDS = 60.0
IDLE_SECONDS = 1.0
TICK_SECONDS = 1.0  # heartbeats are 30 s apart (replay/runner.py): ticking once a second keeps them
RETURN_SECONDS, RETURN_POLL_SECONDS = 10.0, 0.01  # how long a closed walk waits for what it put back, polled
# A walk that acknowledged waits this long before it closes, and, when it held nothing more, as long after to look
# whether any acknowledged message came back (see Walk._wait_for_returns).
ACK_CHECK_SECONDS = 0.1
CATCH_UP_SECONDS = 0.1  # a consumer with room in its window and nothing delivered for this long has seen all there is


@dataclasses.dataclass
class Survey:
    archived: int  # messages in the archive
    matched: int  # of which the selection takes
    sample: list[Archived]  # the first matching ones, oldest first (as many as asked for)
    # False when the walk ended short (window_full): the counts cover only the messages it saw
    whole: bool = True
    seen: int = 0  # messages the walk was given: fewer than `archived` when another client took some meanwhile
    originals: int = 0  # of those, archived before the selection's start (selected or not)


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
    # False once a walk's close showed acknowledgements the broker did not apply: what it moved may still be archived
    applied: bool = True
    archived: int = 0  # messages that walk was to take (what the archive held when it began, within the bound)
    selected: int = 0  # of which the selection took (moved, or left: unroutable, beyond the limit)
    # of which were archived once the selection's start had passed (arrivals: never taken), or at an unknown time:
    # not surely among what the archive held when the replay began
    late: int = 0


@dataclasses.dataclass
class Summary:
    archived: int = 0  # messages in the archive when the tool started
    matched: int = 0
    done: int = 0  # replayed or purged (or, with --dry-run, would be)
    unroutable: int = 0  # replay found no queue for it: it stays archived
    target: str = ""
    whole: bool = True  # False when the count of what matched covers only the archive's first messages (at least)


def _body(message: amqp.Message) -> bytes:
    """The bytes the producer published: py-amqp hands over a body decoded with its content_encoding when that
    decodes it (any codec the producer names, one that yields a lone surrogate included), and the codec encodes it
    back — or, for a codec that cannot encode what it decoded, UTF-8 with the surrogates as they are."""
    body = message.body
    if not isinstance(body, str):
        return bytes(body)
    try:
        return body.encode(message.properties.get("content_encoding") or "utf-8")
    except (LookupError, UnicodeError):
        return body.encode("utf-8", "surrogatepass")


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

    A walk that acknowledges nothing (a count, a listing), and any walk of a quorum archive (or one of unknown
    type): one consumer whose prefetch window covers the archive (up to
    AMQP's 16-bit limit): what it passes over stays unacknowledged and keeps its place. Consumers restarted with a
    smaller window lost the order on quorum queues (measured: returned in another order, and after a SIGKILL or a
    channel closed mid-walk in no fixed order); one consumer kept it. A walk that passed over a whole window ends
    short (`window_full`): the move walks again.

    A walk of a classic archive that acknowledges (a move), or that is larger than one window: a chain of
    channels, one consumer at a time. RabbitMQ finds an acknowledged delivery by
    scanning its channel's unacknowledged deliveries from the oldest (rabbitmq-server#1511): one channel holding
    every passed-over message made a selective replay O(selected x passed over). Each consumer's window is
    min(CHANNEL_SHARE, what the walk began with less what earlier consumers took), so the chain's windows add up to
    the archive's count when the walk began and the last consumer never takes a message that arrived after: those
    stay in the archive, after what was there. A consumer is cancelled once its window is full, and nothing taken on
    its channel is acknowledged before (an acknowledgement would open its window to one more message). Each message
    is acknowledged on the channel it came on; what stays is put back channel by channel, oldest first. A classic
    queue puts a returned message back at its original position (measured: order kept, also after a SIGKILL of
    the walking process). A walk that would need more than WALK_CHANNELS channels ends short (`window_full`).

    Copies are published on another connection (Confirmed), so the deliveries the broker sends ahead never hold up
    the publishing.
    """

    def __init__(
        self,
        connection: Connection,
        queue: str,
        queue_type: str | None = None,
        bound: int | None = None,
        *,
        acknowledges: bool = False,
    ) -> None:
        self._connection = connection
        first = connection.channel()
        self.channels = [first]
        self.queue = queue
        # What the walk takes: later arrivals are after the start. With a bound, only the archive's first `bound`
        # messages (a replay's: what the archive held when it began, less what it moved — arrivals are after).
        depth = _depth(first, queue)
        self.ready = depth if bound is None else max(0, min(depth, bound))
        # The chain is for walks that acknowledge (a count or a listing acknowledges nothing): one consumer takes
        # the whole archive at once, where the chain leaves most of it ready to another client's basic.get while it
        # counts (a probe's took 38 of 6,000) — unless the archive is larger than one consumer's window.
        self.chained = queue_type == "classic" and (acknowledges or self.ready > PREFETCH_LIMIT)
        self.window_full = False
        self.received = 0
        self._unacked = 0
        self._ticked = 0.0
        self._acked = False
        # False when, once closed, the archive held more than it should have had every acknowledgement been applied
        self.returned_exactly = True
        self._delivered: collections.deque[amqp.Message] = collections.deque()
        self._held: dict[Any, set[int]] = {}  # each channel's delivery tags not acknowledged
        self._consumer: tuple[Any, str] | None = None
        self._window = self._taken = 0  # the current consumer's window, and what it took of it
        self._taken_before = 0  # what the chain's earlier consumers took
        # A connection has at most channel_max channels (2,047 by default on RabbitMQ; 0: no limit but the 16-bit
        # channel number): leave some to its other uses.
        channel_max = int(connection.connection.channel_max or 65_535)
        self._most_channels = max(1, min(WALK_CHANNELS, channel_max - 16)) if self.chained else 1
        self._consume(first)

    def _consume(self, channel: Any) -> None:
        share = CHANNEL_SHARE if self.chained else PREFETCH_LIMIT
        self._window = max(1, min(share, self.ready - self._taken_before))
        self._taken = 0
        channel.basic_qos(0, self._window, False)
        self._consumer = (channel, channel.basic_consume(self.queue, callback=self._deliver, no_ack=False))

    def _deliver(self, message: amqp.Message) -> None:
        self._taken += 1
        self._held.setdefault(message.channel, set()).add(message.delivery_tag)
        self._delivered.append(message)

    def _next_consumer(self) -> None:
        """Go on with a new consumer on a new channel, unless the walk has as many channels as it may open."""
        if len(self.channels) < self._most_channels:
            channel = self._connection.channel()
            self.channels.append(channel)
            self._consume(channel)

    def _cancel(self) -> None:
        assert self._consumer is not None
        channel, tag = self._consumer
        channel.basic_cancel(tag)
        self._taken_before += self._taken
        self._consumer = None

    def _fill_window(self) -> bool:
        """Wait until the current consumer's window is full; False when nothing more comes and nothing is ready
        (the rest expired, or was taken by another client meanwhile)."""
        while self._consumer is not None and self._taken < self._window:
            if not self._drain(self._consumer[0]):
                return False
        return True

    def _drain(self, channel: Any) -> bool:
        """Wait for deliveries; False when none came and nothing is ready (a lazy queue may pause while it reads from
        disk: only an empty archive ends the walk)."""
        connection = channel.connection
        self._tick(connection)
        try:
            connection.drain_events(timeout=IDLE_SECONDS)
        except TimeoutError:
            return _depth(channel, self.queue) > 0
        return True

    def __iter__(self) -> Iterator[tuple[Archived, amqp.Message]]:
        while self.received < self.ready:
            if self.chained:
                if self._consumer is not None and self._taken >= self._window:
                    self._cancel()  # its window is full: nothing is in flight to it
                if self._consumer is None and self._taken_before < self.ready:
                    self._next_consumer()
            if not self._delivered:
                if self._consumer is None or (not self.chained and self._unacked >= self._window):
                    self.window_full = True
                    return
                if not self._drain(self._consumer[0]):
                    return
                continue
            message = self._delivered.popleft()
            position = self.received
            self.received += 1
            self._unacked += 1
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
        channel = message.channel  # acknowledged on the channel it came on: delivery tags are per channel
        if self.chained and self._consumer is not None and channel is self._consumer[0]:
            # An acknowledgement would open the current consumer's window to a message beyond its share (the last
            # one's: an arrival after the walk began): it takes its whole window and is cancelled first.
            self._fill_window()
            self._cancel()
        channel.basic_ack(message.delivery_tag)
        self._held[channel].discard(message.delivery_tag)
        self._unacked -= 1
        self._acked = True

    def close(self) -> None:
        """Put back what was not acknowledged. On a chain: the current consumer cancelled first (what is returned
        would be delivered to it again), then channel by channel, oldest first: each channel's deliveries returned
        at once (basic.nack, multiple, requeue), then the channel closed."""
        if self._consumer is not None and (self.chained or self._acked):
            # Deliveries in flight come before its cancel-ok: none after. Without it, a quorum queue ignored some
            # acknowledgements sent just before its channel closed (rabbitmq-server#10327: a probe's purge left 9-25
            # of 300 archived; with the consumer cancelled first, none in 10 trials).
            self._cancel()
        returning = sum(len(held) for held in self._held.values())
        expected = None
        if returning or self._acked:
            # A connection that failed leaves it None (the broker puts them back when it drops it): not checked.
            self.returned_exactly = False
            with contextlib.suppress(amqp.exceptions.AMQPError, OSError):
                expected = _depth(self.channels[0], self.queue) + returning
        if self._acked:
            time.sleep(ACK_CHECK_SECONDS)  # fewer acknowledgements in flight when it closes (rabbitmq-server#10327)
        for channel in self.channels:
            held = self._held.get(channel)
            if held and self.chained:
                channel.send_method(amqp.spec.Basic.Nack, "Lbb", (max(held), True, True))  # py-amqp has no basic_nack
            channel.close()
        if expected is not None:
            self._wait_for_returns(expected, returning)

    def _wait_for_returns(self, expected: int, returning: int) -> None:
        """The broker puts returned messages back a moment after the channels closed (measured: 4,608 of 20,000
        back just after 40 classic channels closed; a quorum archive of 20,000 empty just after its one channel
        closed): a walk that follows at once would see part of the archive, or none of it, as all there is. Waits, a
        bounded time, until the archive holds them (arrivals only add to it; another client may take some
        meanwhile). Then checks the acknowledgements were applied: a close puts back what it held in one go, so more
        than that means acknowledgements the broker dropped (a quorum queue ignores some sent just before its
        channel closes: rabbitmq-server#10327) — or arrivals; with nothing held, it looks once the close had
        ACK_CHECK_SECONDS to show."""
        channel = self._connection.channel()
        try:
            if not returning:
                time.sleep(ACK_CHECK_SECONDS)
            deadline = time.monotonic() + RETURN_SECONDS
            while (depth := _depth(channel, self.queue)) < expected and time.monotonic() < deadline:
                time.sleep(RETURN_POLL_SECONDS)
        finally:
            channel.close()
        self.returned_exactly = depth == expected


def walk_capacity(queue_type: str | None) -> int:
    """The most messages one walk takes: one consumer's 16-bit window; on a classic archive, a chain's channels."""
    return WALK_CHANNELS * CHANNEL_SHARE if queue_type == "classic" else PREFETCH_LIMIT


def archive_size(connection: Connection, service: str) -> int:
    channel = connection.channel()
    try:
        return _depth(channel, naming.archive_name(service))
    finally:
        channel.close()


@dataclasses.dataclass
class Listing:
    items: list[Archived]  # the matching ones, oldest first
    whole: bool  # False when the walk ended short (window_full): only the archive's first messages were seen
    seen: int  # messages the walk saw


def list_archive(connection: Connection, service: str, selection: Selection, queue_type: str | None = None) -> Listing:
    walk = Walk(connection, naming.archive_name(service), queue_type)
    try:
        items = [item for item, _ in walk if selection.matches(item)]
    finally:
        walk.close()  # nothing was acknowledged: every message goes back where it was
    return Listing(items, not walk.window_full, walk.received)


def survey(
    connection: Connection,
    service: str,
    selection: Selection,
    keep: int = 0,
    queue_type: str | None = None,
    *,
    bound: int | None = None,
) -> Survey:
    """How many archived messages the selection takes (of the first `bound`), and the first `keep` of them; changes
    nothing."""
    walk = Walk(connection, naming.archive_name(service), queue_type, bound)
    found = Survey(archived=walk.ready, matched=0, sample=[])
    try:
        for item, _ in walk:
            found.originals += selection.before_start(item)
            if selection.matches(item):
                found.matched += 1
                if len(found.sample) < keep:
                    found.sample.append(item)
    finally:
        walk.close()  # nothing was acknowledged: every message goes back where it was
    found.whole, found.seen = not walk.window_full, walk.received
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
        *,
        queue_type: str | None,
        bound: int | None,
    ) -> None:
        self.walk = Walk(connection, queue, queue_type, bound, acknowledges=True)
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
    queue_type: str | None = None,
    bound: int | None = None,
) -> Tally:
    """Replay (or purge) the selected archived messages, oldest first, at most `limit` of them, until `stop`;
    with a `bound`, only among the archive's first `bound` messages.

    A replayed message is acknowledged only once the broker confirmed its copy; one that no queue takes
    (mandatory publish returned) stays archived and is counted as unroutable. `queue_type` is the archive's
    ("classic" walks it on a chain of channels; None, unknown: the one-channel walk that keeps any archive's order).
    """
    tally = tally if tally is not None else Tally()
    stop = stop or threading.Event()
    pace = Pace(rate, stop)
    queue = naming.archive_name(service)
    route = _route(connection, service) if not purge else None
    walked_to_the_end = False
    passes = 0
    while not walked_to_the_end and not stop.is_set() and (limit is None or tally.done < limit):
        # What was moved left the archive's first `bound` messages: the rest of them are the first bound - done.
        left = None if bound is None else bound - tally.done
        one = _Pass(connection, queue, route, tally, progress, queue_type=queue_type, bound=left)
        passes += 1
        done_before = tally.done
        segment_ends = time.monotonic() + SEGMENT_SECONDS
        selected = late = 0
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
                late += item.archived_at is None or not selection.before_start(item)
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
            tally.late = late
        finally:
            one.close()
        # What the walk saw is the archive only if the broker applied every acknowledgement it was sent.
        tally.applied = tally.applied and one.walk.returned_exactly
        tally.whole = tally.whole and tally.applied
        if one.walk.window_full and tally.done == done_before:
            # The next walk would hold the same first messages, and take nothing again, for ever.
            raise UnsupportedOperationError(
                f"none of the archive's first {one.walk.received} messages (as many as one walk holds) could be "
                "taken, so a walk cannot reach the ones after them: narrow the archive first (purge what is not "
                "wanted, oldest first)"
            )
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
    queue_type: str | None = None,
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
        surveyed = _whole(survey(connection, service, selection, queue_type=queue_type))
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
        queue_type=queue_type,
    )
    summary.done, summary.unroutable = tally.done, tally.unroutable
    if total is None:
        if tally.whole:
            left = tally.selected - tally.done
        else:
            surveyed = survey(connection, service, selection, queue_type=queue_type)
            left, summary.whole = surveyed.matched, surveyed.whole
        summary.matched = tally.done + left
    return summary


def _whole(surveyed: Survey) -> Survey:
    if not surveyed.whole:
        raise UnsupportedOperationError(
            f"the archive holds more messages than one walk can count ({surveyed.archived}; a walk ended after "
            "the first ones): replay without --limit or --dry-run, or narrow the archive first"
        )
    return surveyed


def purge(connection: Connection, service: str, selection: Selection, queue_type: str | None = None) -> Summary:
    queue = naming.archive_name(service)
    summary = Summary(archived=archive_size(connection, service))
    if selection.everything:
        channel = connection.channel()
        try:
            summary.matched = summary.done = int(channel.queue_purge(queue) or 0)
        finally:
            channel.close()
        return summary
    tally = move(connection, service, selection, purge=True, queue_type=queue_type)
    summary.matched = summary.done = tally.done
    return summary
