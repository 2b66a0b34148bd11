"""One CeleryEventReplay run by the operator, on the event loop (the domain layer: the handler calls this, this
calls the adapters through its ports).

The keeper only gathers facts and does what they call for: its spec and its status, its service, the broker of its
Secret, its turn (one running replay per archive: broker, vhost, serviceName), then the archive (what other clients
hold of it, and its size before the replay begins, counted whole after) — and after each fact
`core/replay/conclusion.py` says what follows: look further, wait (and why, in its Succeeded condition), begin
(written and seen written before anything moves), move (one walk of the archive, the counters in status every few
seconds), stop or end. After each walk it observes again: it ends only on what the broker shows. Stopped (the
operator stops, the resource is deleted) it lets its broker work finish the events in hand; a replay that was
started is resumed by whichever operator runs next; one whose service is deleted stops. Every status write goes
through the one writer (flow/writer.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from celery_event_operator.core.api.models import PREVIEW_SIZE
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import (
    ArchiveNotFoundError,
    BrokerRefusedError,
    BrokerUnavailableError,
    KubeError,
    NotFoundError,
    OperatorError,
    UnsupportedOperationError,
)
from celery_event_operator.core.replay import conclusion, replay_spec, replay_status
from celery_event_operator.core.replay.slots import Key, ReplaySlots, archive_key
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import EventNote, PostEvents
from celery_event_operator.flow.replay_ports import MoveProgress, ReplayApi, ReplayBroker, ReplayContext
from celery_event_operator.flow.writer import StatusWriter

# How often a waiting replay looks again (jittered), and how often a running one writes its counters.
WAIT_SECONDS = 5.0
STATUS_SECONDS = 2.0
# A service read serves every replay of it for this long: a thousand replays waiting cost one read per service.
SERVICE_READ_SECONDS = 4.0
logger = logging.getLogger(__name__)


class ServiceReads:
    """The services replays name, read through the API and shared for a few seconds: the replays that ask while a
    read is under way wait for that read (only those of live replays are kept: a read older than
    SERVICE_READ_SECONDS is dropped at the next read)."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, str], tuple[float, asyncio.Task[dict[str, Any]]]] = {}

    async def read(self, api: ReplayApi, key: tuple[str, str]) -> dict[str, Any]:
        """The service's body; NotFoundError or KubeError otherwise."""
        now = time.monotonic()
        found = self._read.get(key)
        if found is None or now - found[0] > SERVICE_READ_SECONDS:
            self._read = {k: v for k, v in self._read.items() if now - v[0] <= SERVICE_READ_SECONDS}
            reading = asyncio.ensure_future(api.read_service(*key))
            found = self._read[key] = (now, reading)
        return await asyncio.shield(found[1])


@dataclasses.dataclass
class Shared:
    """What the replays of one operator share (kept in kopf's root memo)."""

    slots: ReplaySlots = dataclasses.field(default_factory=ReplaySlots)
    services: ServiceReads = dataclasses.field(default_factory=ServiceReads)


class ReplayKeeper:
    def __init__(
        self,
        context: ReplayContext,
        shared: Shared,
        body: Mapping[str, Any],
        post: PostEvents,
        logger: logging.Logger | Any,
    ) -> None:
        self.context = context
        self.slots = shared.slots
        self.services = shared.services
        self.body = body  # kopf's, kept current by its watch
        self.namespace = str((body.get("metadata") or {}).get("namespace") or "")
        self.name = str((body.get("metadata") or {}).get("name") or "")
        self.post = post
        self._logger = logger
        self._stopped: Any = None
        self._writer = StatusWriter(context.cluster.patch_replay_status, None, self.namespace, self.name, logger)
        self._written: dict[str, Any] = {}  # status fields as last written (or shown)
        self._began: replay_status.Started | None = None  # as last written (the watch may not have brought it back yet)
        # Its last walk, while it is not counted yet: what it moved is known exactly across a wait that follows it
        self._walked: conclusion.PassDone | None = None
        self.holder = f"{self.namespace}/{self.name}"
        self._slot: Key | None = None

    async def run(self, stopped: Any) -> None:
        """Until it ended (Succeeded True or False) or `stopped`."""
        self._stopped = stopped
        try:
            while not stopped:
                if await self._attempt():
                    return
                await stopped.wait(WAIT_SECONDS * random.uniform(0.8, 1.2))
        finally:
            if self._slot is not None:
                self.slots.leave(self._slot, self.holder)

    # --- one attempt: True when it ended (or was stopped) ---------------------------------------

    async def _attempt(self) -> bool:
        replay = replay_spec.understand(self.body)
        began = self._began or replay_status.started(self.body.get("status") or {})
        walked = self._walked if began is not None and began.matched is None else None
        observed = conclusion.ReplayObserved(replay, specs.generation_of(self.body), began, {}, last_pass=walked)
        step = self._conclude(observed)
        if step.action != "look" or not isinstance(replay, replay_spec.Replay):
            return await self._perform(step)
        observed = dataclasses.replace(observed, service=await self._look_at_service(replay))
        step = self._conclude(observed)
        if step.action != "look" or not isinstance(observed.service, conclusion.ServiceReady):
            return await self._perform(step)
        service_name, queue_type = observed.service.service_name, observed.service.spec.queue_type
        try:
            settings = await self.context.brokers.settings(self.namespace, observed.service.spec)
        except OperatorError as exc:  # the Secret unusable, or the Kubernetes API not answering: its reason
            problem = conclusion.Problem(exc.reason, str(exc))
            return await self._perform(self._conclude(dataclasses.replace(observed, settings=problem)))
        key = self._queue_for(replay, settings, began.service_name if began is not None else service_name)
        holder = self.slots.take(key, self.holder)
        slot = conclusion.SlotSeen(holder, key[2], settings.address.display)
        observed = dataclasses.replace(observed, settings=settings, slot=slot)
        if holder is not None:
            return await self._perform(self._conclude(observed))
        try:
            runner = self.context.replay_broker(settings, queue_type)
            try:
                return await self._drive(observed, replay, service_name, runner)
            finally:
                runner.close()
        finally:
            self.slots.release(key, self.holder)

    def _queue_for(self, replay: replay_spec.Replay, settings: BrokerSettings, service_name: str) -> Key:
        """The slot of the archive it replays (its place among the replays waiting for it, by creation time)."""
        key = archive_key(settings.address, service_name)
        if key != self._slot:
            if self._slot is not None:
                self.slots.leave(self._slot, self.holder)
            self._slot = key
            self.slots.wait(key, self.holder, replay.created_at)
        return key

    async def _look_at_service(self, replay: replay_spec.Replay) -> conclusion.ServiceSeen:
        try:
            service = await self.services.read(self.context.cluster, (self.namespace, replay.service))
        except NotFoundError:
            return conclusion.ServiceMissing()
        except KubeError as exc:  # the API's fault (not answering, a missing permission): its own reason
            return conclusion.Problem(exc.reason, str(exc))
        return conclusion.service_seen(service)

    async def _drive(
        self, observed: conclusion.ReplayObserved, replay: replay_spec.Replay, service_name: str, runner: ReplayBroker
    ) -> bool:
        """The archive looked at, moved and looked at again until the conclusion waits, stops or ends."""
        resumed = observed.began is not None
        while True:
            step = self._conclude(observed)
            if step.action == "look":
                await self._write(step.decision.status_patch)
                observed = await self._on_broker(
                    observed, self._look_at_archive(observed, replay, service_name, runner)
                )
            elif step.action == "begin":
                if not await self._write(step.decision.status_patch):
                    return False  # not recorded: nothing may move before it is
                observed = dataclasses.replace(observed, began=step.began)
                self._began = step.began
                self._announce(step.decision.events)
            elif step.action == "move":
                began = observed.began
                assert began is not None  # a move follows a begin
                if step.began is not None:  # its first count: written with the counters
                    began = self._began = step.began
                    observed = dataclasses.replace(observed, began=began)
                if resumed:
                    resumed = False
                    self._logger.info(
                        "replay %s resumes: %d of %s selected events already %s",
                        self.name,
                        step.done,
                        "?" if began.matched is None else began.matched,
                        replay.done_field,
                    )
                await self._write(step.decision.status_patch)
                observed = await self._on_broker(observed, self._move(observed, replay, began, step, runner))
            else:
                return await self._perform(step)

    async def _look_at_archive(
        self, observed: conclusion.ReplayObserved, replay: replay_spec.Replay, service_name: str, runner: ReplayBroker
    ) -> conclusion.ReplayObserved:
        """The archive as the last walk left it when that walk saw all of it, else counted whole; before a replay
        begins, only its size (its first walk counts), unless it is a dry run."""
        began = observed.began
        if began is not None and observed.last_pass is not None:
            seen = await runner.seen_after_move(began.service_name)
            if seen is not None:
                return dataclasses.replace(observed, archive=seen)
        started_at = began.started_at if began is not None else replay_status.start_time(time.time())
        name = began.service_name if began is not None else service_name
        keep = PREVIEW_SIZE if replay.spec.dry_run else 0
        count = began is not None or replay.spec.dry_run
        seen = await runner.observe(name, replay.selection(started_at), keep, count=count)
        if began is None and seen.at is not None:  # it starts when the archive's size was read
            started_at = replay_status.start_time(seen.at)
        return dataclasses.replace(observed, archive=seen, started_at=started_at)

    async def _move(
        self,
        observed: conclusion.ReplayObserved,
        replay: replay_spec.Replay,
        began: replay_status.Started,
        step: conclusion.Step,
        runner: ReplayBroker,
    ) -> conclusion.ReplayObserved:
        """One walk of the archive, its counters written every few seconds; halted (the move returns after the
        events in hand) when the replay is stopped, its spec changed or its service was deleted."""
        moving = asyncio.ensure_future(
            runner.move(
                began.service_name,
                replay.selection(began.started_at),
                purge=replay.purge,
                limit=step.limit,
                rate=replay.spec.rate_per_second,
            )
        )
        deleted = False
        while True:
            await asyncio.wait({moving}, timeout=STATUS_SECONDS)
            if moving.done():
                break
            halt = self._halt(began, deleted)
            if halt is None and await self._service_gone(replay):
                deleted = True
                halt = "service deleted"
            if halt is not None:
                runner.halt()
            await self._write(conclusion.progress(replay, began, self._pass_done(began, step.done, runner.tally)))
        walked = self._walked = self._pass_done(began, step.done, moving.result())  # a broker failure is raised here
        if walked.first is not None:
            began = self._began = dataclasses.replace(began, first_message=walked.first)
        return dataclasses.replace(
            observed,
            began=began,
            archive=None,
            last_pass=walked,
            halted=self._halt(began, deleted),
        )

    def _halt(self, began: replay_status.Started, deleted: bool) -> conclusion.Halt | None:
        changed = replay_status.spec_changed(specs.generation_of(self.body), began)
        return conclusion.halted_by(stopped=bool(self._stopped), spec_changed=changed, service_deleted=deleted)

    @staticmethod
    def _pass_done(began: replay_status.Started, before: int, tally: MoveProgress) -> conclusion.PassDone:
        first = began.first_message or replay_status.message_view(tally.first)
        return conclusion.PassDone(tally.done, tally.unroutable, before, first, replay_status.message_view(tally.last))

    async def _service_gone(self, replay: replay_spec.Replay) -> bool:
        """The service was deleted (or is being deleted): a fact of the API, read at most every few seconds."""
        try:
            service = await self.services.read(self.context.cluster, (self.namespace, replay.service))
        except NotFoundError:
            return True
        except KubeError:
            return False
        return bool((service.get("metadata") or {}).get("deletionTimestamp"))

    async def _on_broker(
        self, observed: conclusion.ReplayObserved, work: Awaitable[conclusion.ReplayObserved]
    ) -> conclusion.ReplayObserved:
        """What `work` observed, or how the broker failed it."""
        try:
            return await work
        except ArchiveNotFoundError as exc:
            return dataclasses.replace(observed, broker=conclusion.BrokerFailure(str(exc), archive_not_found=True))
        except BrokerUnavailableError as exc:
            return dataclasses.replace(observed, broker=conclusion.BrokerFailure(str(exc)))
        except (BrokerRefusedError, UnsupportedOperationError) as exc:  # answered, and said no: its own reason
            return dataclasses.replace(observed, broker=conclusion.BrokerFailure(str(exc), reason=exc.reason))

    # --- the conclusion, and doing what it says ---------------------------------------------------

    def _conclude(self, observed: conclusion.ReplayObserved) -> conclusion.Step:
        """The conclusion from what was observed, with the generation and the status as they are now."""
        written = {**(self.body.get("status") or {}), **self._written}
        now = dataclasses.replace(observed, generation=specs.generation_of(self.body), written=written)
        step = conclusion.conclude(now, time.time())
        if step.action != "look" or observed.archive is not None:
            seen = observed.archive
            logger.debug(
                "replay %s/%s: %s (done %d) after %s",
                self.namespace,
                self.name,
                step.action,
                step.done,
                "no look at the archive"
                if seen is None
                else f"archive {seen.archived}, selected {seen.selected}, held elsewhere {seen.held_elsewhere}",
            )
        return step

    async def _perform(self, step: conclusion.Step) -> bool:
        """A wait, a stop or an end; True when the replay ended (or was stopped)."""
        if step.log:
            (self._logger.warning if step.warn else self._logger.info)("replay %s %s", self.name, step.log)
        if step.action == "wait":
            if await self._write(step.decision.status_patch):
                self._announce(step.decision.events)
            return False
        if step.action == "stop":
            await self._write(step.decision.status_patch)
            return True
        await self._end(step.decision)
        return True

    async def _end(self, decision: replay_status.Decision) -> None:
        """The final status, written however long the API takes (unless stopped: the next operator ends it), then
        the end's Event."""
        while not await self._write(decision.status_patch):
            if self._stopped:
                return
            await self._stopped.wait(WAIT_SECONDS)
        self._announce(decision.events)

    def _announce(self, events: Iterable[EventNote]) -> None:
        notes = tuple(events)
        if notes:
            self.post(notes)

    async def _write(self, status: Mapping[str, Any]) -> bool:
        """The fields the replay does not show yet, through the one writer; False when the API refused them."""
        if not await self._writer.write(self.body, status):
            return False
        self._written |= status
        return True
