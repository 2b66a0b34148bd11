"""One replay's broker work, on a connection and a thread of its own (I/O).

A replay may run for minutes (thousands of events, rate-limited). On the broker's shared control connection it
would hold up the topology of every service on that broker, and on asyncio's default executor one thread of a
small pool that everything shares: so each replay has its own ControlConnection, whose single thread is its own,
and stops between two events when asked.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import amqp
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.adapters.broker.control import ControlConnection
from celery_event_operator.adapters.broker.management import QueueCounts, QueueListing
from celery_event_operator.adapters.broker.tls import TlsFiles
from celery_event_operator.core import naming
from celery_event_operator.core.archive.messages import Selection
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import (
    BrokerRefusedError,
    BrokerUnavailableError,
    ManagementUnavailableError,
    UnsupportedOperationError,
)
from celery_event_operator.core.replay.conclusion import ArchiveSeen
from celery_event_operator.core.replay.slots import Key, archive_key

T = TypeVar("T")
logger = logging.getLogger(__name__)
# The messages a replay holds unacknowledged go back to the archive once the broker drops its connection: at once
# when the operator's process dies, within two heartbeats when its node does.
HEARTBEAT_SECONDS = 30.0
# The management API's counts are the broker's statistics, refreshed every few seconds (collect_statistics_interval,
# 5 s by default; seen 7.8 s late on a loaded broker): for a while after this process let go of an archive they may
# still show what it held. A count of held messages is taken once its ready count agrees with the broker's own
# (passive declare), and a count above zero only once the statistics were surely refreshed since this process let go
# of the archive; asked up to STATISTICS_ATTEMPTS times a second apart.
STATISTICS_SECONDS = 12.0
STATISTICS_ATTEMPTS = 20
COUNT_ATTEMPTS = 2  # a count given short is taken once more, after the statistics were asked again


class LetGo:
    """When a walk of this process last let go of each archive (monotonic; whichever replay walked it): the
    statistics may show that walk's messages as held until they were refreshed. The process's start counts as a
    let-go of every archive: it may follow an operator killed while it held one, whose messages the statistics
    show as held (and the broker may not have put back yet) a moment after. Entries older than STATISTICS_SECONDS
    tell nothing and are dropped."""

    def __init__(self) -> None:
        self._at: dict[Key, float] = {}
        self._started = time.monotonic()

    def now(self, key: Key) -> None:
        now = time.monotonic()
        self._at = {k: at for k, at in self._at.items() if now - at <= STATISTICS_SECONDS}
        self._at[key] = now

    def refreshed_since(self, key: Key) -> bool:
        return time.monotonic() - max(self._at.get(key, -float("inf")), self._started) > STATISTICS_SECONDS


LET_GO = LetGo()


class _StatisticsBehindError(Exception):
    """The management API's statistics of an archive never agreed with the broker's own count while asked."""


def _larger_than_a_walk(archived: int) -> UnsupportedOperationError:
    return UnsupportedOperationError(
        f"the archive holds more messages than one walk can count ({archived}), so what a replay would take is not "
        "known"
    )


class ReplayRunner:
    def __init__(self, settings: BrokerSettings, queue_type: str | None = None) -> None:
        material = settings.tls
        self._tls = TlsFiles.of(material)
        self._control = ControlConnection(settings.address, self._tls, heartbeat=HEARTBEAT_SECONDS)
        self._settings = settings
        self._queue_type = queue_type  # the archive's: how it is walked (operations.Walk)
        self._counted: int | None = None  # what its last count of the archive selected
        # The archive's first messages that are the replay's: what its last count saw, less what it moved since.
        # Later counts and moves look at those only: an event archived meanwhile is after them, even when its
        # archived-at header (a worker's clock) says it was archived before the replay started.
        self._originals: int | None = None
        self._walked: int | None = None  # the originals when the last move began
        self._pending: asyncio.Future[Any] | None = None
        self.display = settings.address.display
        self.stop = threading.Event()
        self.tally = operations.Tally()  # the move's progress, read by the event loop while the thread writes it

    async def survey(
        self, service: str, selection: Selection, keep: int = 0, bound: int | None = None
    ) -> operations.Survey:
        try:
            return await self._run(
                lambda connection: operations.survey(
                    connection, service, selection, keep, self._queue_type, bound=bound
                )
            )
        finally:
            LET_GO.now(self._key(service))

    async def observe(self, service: str, selection: Selection, keep: int = 0, *, count: bool = True) -> ArchiveSeen:
        """What other clients hold of the archive, asked while this runner holds nothing; then, when they hold
        nothing, the archive counted (without `count`: its size, all of it the replay's). A count not given every
        message the archive held when it began (another client took some meanwhile, as a `basic.get` does, unseen
        by the statistics asked a moment before) is taken again once the statistics were asked again, refreshed
        since; given short twice, the difference is held elsewhere."""
        self._counted = None
        if not count:
            return await self._size(service)
        for attempt in range(COUNT_ATTEMPTS):
            try:
                held, _ = await self._held_elsewhere(service, refreshed_only=attempt > 0)
            except _StatisticsBehindError:
                return ArchiveSeen(0, None, None, statistics_behind=True)
            if held:
                return ArchiveSeen(0, 0, held)
            surveyed = await self.survey(service, selection, keep, self._originals)
            logger.debug(
                "archive of %s counted (of its first %s): given %d of %d, %d selected",
                service,
                "all" if self._originals is None else self._originals,
                surveyed.seen,
                surveyed.archived,
                surveyed.matched,
            )
            if not surveyed.whole:
                raise _larger_than_a_walk(surveyed.archived)
            if surveyed.seen == surveyed.archived:
                self._counted, self._originals = surveyed.matched, surveyed.archived
                sample = tuple(surveyed.sample)
                return ArchiveSeen(surveyed.archived, surveyed.matched, held, sample, surveyed.originals)
        return ArchiveSeen(surveyed.archived, surveyed.matched, surveyed.archived - surveyed.seen)

    async def _size(self, service: str) -> ArchiveSeen:
        """The archive's size, all of it the replay's, and when it was read (the replay's start): taken once nobody
        holds any of it, and only when nothing left it since the statistics said so (a client that took messages in
        between, as `archive list` does, would have them taken for none: they count as held)."""
        try:
            held, ready = await self._held_elsewhere(service)
        except _StatisticsBehindError:
            return ArchiveSeen(0, None, None, statistics_behind=True)
        if held:
            return ArchiveSeen(0, None, held)
        at = time.time()
        size = await self._run(lambda connection: operations.archive_size(connection, service))
        if ready is not None and size < ready:  # arrivals only add: fewer means some were taken meanwhile
            return ArchiveSeen(0, None, ready - size)
        if size > operations.walk_capacity(self._queue_type):
            raise _larger_than_a_walk(size)
        self._originals = size
        return ArchiveSeen(size, None, held, originals=size, at=at)

    async def seen_after_move(self, service: str) -> ArchiveSeen | None:
        """The archive as the last move left it, without walking it again, when that move's one walk saw all of it
        and selected as many events as the count before it: then no selected event was held elsewhere since that
        count (which was taken when nothing was). Without a count before it (a replay's first walk is its count),
        when that walk was given every message the replay's were when it began and none archived since in their
        place (as where another client took one while an event arrived). None when it must be observed again."""
        tally = self.tally
        if not tally.whole:
            return None
        if self._counted is None and (tally.archived != self._walked or tally.late):
            return None
        if self._counted is not None and tally.selected != self._counted:
            return None
        left = tally.archived - tally.done
        return ArchiveSeen(left, tally.selected - tally.done, 0, originals=left)

    async def _held_elsewhere(self, service: str, *, refreshed_only: bool = False) -> tuple[int | None, int | None]:
        """The archive's messages delivered to other clients and not acknowledged, and its ready ones then; (None,
        None) without a management API. Its figures lag: they are taken once the API's ready count is the broker's
        own (passive declare), and, with `refreshed_only`, once they were surely refreshed since this process let go
        of the archive. An archive that changes all the time (events arriving, expiring) never shows the same ready
        count twice: after STATISTICS_ATTEMPTS the last figures are taken if they changed while asked (refreshed
        since the first were read: whatever was held before shows in them); figures that never changed may be from
        before a client took messages, showing none held: _StatisticsBehindError."""
        queue = naming.archive_name(service)
        listing = QueueListing(self._settings.address, self._settings.management_url, self._tls)
        first: QueueCounts | None = None
        try:
            for _ in range(STATISTICS_ATTEMPTS):
                ready = await self._run(lambda connection: operations.archive_size(connection, service))
                counts = await listing.queue(queue)
                first = first or counts
                refreshed = LET_GO.refreshed_since(self._key(service))
                if counts.ready == ready and (refreshed or (counts.unacknowledged == 0 and not refreshed_only)):
                    return counts.unacknowledged, ready
                logger.debug(
                    "archive of %s: the statistics show %d ready and %d held elsewhere, the broker %d ready "
                    "(refreshed since let go: %s)",
                    service,
                    counts.ready,
                    counts.unacknowledged,
                    ready,
                    refreshed,
                )
                await asyncio.sleep(1.0)
        except ManagementUnavailableError:
            return None, None
        finally:
            await listing.close()
        assert first is not None  # read in the first attempt
        if (counts.ready, counts.unacknowledged) == (first.ready, first.unacknowledged):
            raise _StatisticsBehindError
        return counts.unacknowledged, ready

    def _key(self, service: str) -> Key:
        return archive_key(self._settings.address, service)

    async def move(
        self,
        service: str,
        selection: Selection,
        *,
        purge: bool,
        limit: int | None,
        rate: float | None,
    ) -> operations.Tally:
        calls = 0
        self.tally = operations.Tally()
        self._walked = self._originals

        def work(connection: Connection) -> operations.Tally:
            nonlocal calls
            calls += 1
            if calls > 1:
                # The connection failed mid-move and ControlConnection would run the move again on a new one:
                # whether the last acknowledgement arrived is unknown, so the replay resumes through a recount.
                raise BrokerUnavailableError(f"the connection to the broker at {self.display} was lost mid-way")
            return operations.move(
                connection,
                service,
                selection,
                purge=purge,
                limit=limit,
                rate=rate,
                tally=self.tally,
                stop=self.stop,
                queue_type=self._queue_type,
                bound=self._originals,
            )

        logger.debug("archive of %s: a move begins (of its first %s)", service, self._originals)
        try:
            return await self._run(work)
        finally:
            LET_GO.now(self._key(service))
            if self._originals is not None:
                self._originals -= self.tally.done
            tally = self.tally
            logger.debug(
                "archive of %s: the move returned, %d done, %d unroutable; walked %d (%d selected), whole: %s",
                service,
                tally.done,
                tally.unroutable,
                tally.archived,
                tally.selected,
                tally.whole,
            )

    def halt(self) -> None:
        self.stop.set()

    async def _run(self, work: Callable[[Connection], T]) -> T:
        self._pending = asyncio.ensure_future(self._control.run_async(work))
        try:
            return await asyncio.shield(self._pending)
        except amqp.exceptions.AMQPError as exc:  # a channel-level refusal, e.g. no permission on the archive
            raise BrokerRefusedError(f"the broker at {self.display} refused: {exc.reply_text}") from None

    def close(self) -> None:
        """Stop the work (between two events) and let the connection and its thread go once it returned."""
        self.stop.set()
        pending = self._pending
        if pending is not None and not pending.done():
            pending.add_done_callback(self._close_now)
        else:
            self._close_now()

    def _close_now(self, finished: asyncio.Future[Any] | None = None) -> None:
        if finished is not None and not finished.cancelled():
            finished.exception()  # its outcome was reported by whoever awaited it (or nobody waits any more)
        self._control.close()
        if self._tls is not None:
            self._tls.remove()
