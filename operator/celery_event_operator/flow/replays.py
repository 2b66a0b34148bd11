"""One CeleryEventReplay run by the operator, on the event loop (the domain layer: the handler calls this, this
calls the adapters).

It waits — for its service to exist and be Ready, for its turn (one running replay per archive: broker, vhost,
serviceName), for a broker that answers — and says why in its Succeeded condition. Then it observes the archive
(counted whole, and what other clients hold of it), and replay/conclusion.py says what follows: wait, begin (written
and seen written before anything moves), move (one walk of the archive, the counters in status every few seconds)
or end. After each walk it observes again: it ends only on what the broker shows. Stopped (the operator stops, the
resource is deleted) it lets its broker work finish the events in hand; a replay that was started is resumed by
whichever operator runs next; one whose service is deleted stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.models import PREVIEW_SIZE, CeleryEventServiceSpec
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import (
    ArchiveNotFoundError,
    BrokerRefusedError,
    BrokerUnavailableError,
    InvalidSpecError,
    KubeError,
    NotFoundError,
    OperatorError,
    UnsupportedOperationError,
)
from celery_event_operator.core.replay import conclusion, plan
from celery_event_operator.core.replay.slots import Key, ReplaySlots, archive_key
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import EventNote, PostEvents
from celery_event_operator.flow.replay_ports import ReplayApi, ReplayBroker, ReplayContext
from celery_event_operator.flow.writer import StatusWriter

# How often a waiting replay looks again (jittered), and how often a running one writes its counters.
WAIT_SECONDS = 5.0
STATUS_SECONDS = 2.0
# A service read serves every replay of it for this long: a thousand replays waiting cost one read per service.
SERVICE_READ_SECONDS = 4.0


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
        self._began: plan.Started | None = None  # as last written (the watch may not have brought it back yet)
        self.holder = f"{self.namespace}/{self.name}"
        self._slot: Key | None = None

    async def run(self, stopped: Any) -> None:
        """Until it ended (Succeeded True or False) or `stopped`."""
        self._stopped = stopped
        try:
            while not stopped:
                try:
                    replay = plan.understand(self.body)
                except InvalidSpecError as exc:
                    await self._invalid(exc)
                    return
                if await self._attempt(replay):
                    return
                await stopped.wait(WAIT_SECONDS * random.uniform(0.8, 1.2))
        finally:
            if self._slot is not None:
                self.slots.leave(self._slot, self.holder)

    # --- one attempt: True when it ended (or was stopped) ---------------------------------------

    async def _attempt(self, replay: plan.Replay) -> bool:
        began = self._began or plan.started(self.body.get("status") or {})
        if began is not None and plan.spec_changed(replay.generation, began):
            await self._spec_changed()
            return True
        found = await self._service(replay, began)
        if isinstance(found, bool):
            return found
        service_name, service_spec = found
        try:
            settings = await self.context.brokers.settings(self.namespace, service_spec)
        except OperatorError as exc:  # the Secret unusable, or the Kubernetes API not answering: its reason
            await self._wait(replay, began, exc.reason, str(exc))
            return False
        key = self._queue_for(replay, settings, began.service_name if began is not None else service_name)
        holder = self.slots.take(key, self.holder)
        if holder is not None:
            message = (
                f"replay {holder} of the same archive ({key[2]}:archived at {settings.address.display}) goes first: "
                "one replay of an archive runs at a time"
            )
            await self._wait(replay, began, plan.WAITING_FOR_REPLAY, message)
            return False
        try:
            runner = self.context.replay_broker(settings, service_spec.queue_type)
            try:
                return await self._drive(replay, began, service_name, runner)
            except ArchiveNotFoundError as exc:
                failure = plan.failed(self._previous(), replay.generation, "ArchiveNotFound", str(exc), now=time.time())
                await self._end(failure)
                return True
            except (BrokerUnavailableError, BrokerRefusedError, UnsupportedOperationError) as exc:
                message = f"{exc}; trying again (what was done stays done)"
                await self._wait(replay, self._began, plan.BROKER_UNAVAILABLE, message)
                return False
            finally:
                runner.close()
        finally:
            self.slots.release(key, self.holder)

    def _queue_for(self, replay: plan.Replay, settings: BrokerSettings, service_name: str) -> Key:
        """The slot of the archive it replays (its place among the replays waiting for it, by creation time)."""
        key = archive_key(settings.address, service_name)
        if key != self._slot:
            if self._slot is not None:
                self.slots.leave(self._slot, self.holder)
            self._slot = key
            self.slots.wait(key, self.holder, replay.created_at)
        return key

    async def _service(
        self, replay: plan.Replay, began: plan.Started | None
    ) -> tuple[str, CeleryEventServiceSpec] | bool:
        """The serviceName and spec of the replay's service once it is Ready; False (and why, in status) before;
        True when the replay ended for want of it (it had started: its service was deleted)."""
        try:
            service = await self.services.read(self.context.cluster, (self.namespace, replay.service))
        except NotFoundError:
            if began is not None:
                await self._end(self._service_deleted(replay, began, done=self._done_as_written(replay), unroutable=0))
                return True
            message = (
                f"there is no CeleryEventService {replay.service} in namespace {self.namespace} (a replay acts on a "
                "service of its own namespace); it starts when there is one"
            )
            await self._wait(replay, began, plan.SERVICE_NOT_FOUND, message)
            return False
        except KubeError as exc:  # the API's fault (not answering, a missing permission): its own reason
            await self._wait(replay, began, exc.reason, str(exc))
            return False
        ready = conditions.find_written(service.get("status"), conditions.READY)
        try:
            validated = specs.validate(service)
        except InvalidSpecError:
            validated = None
        if ready.get("status") != "True" or validated is None:
            why = f" ({ready.get('reason')}: {ready.get('message')})" if ready else ""
            message = f"service {replay.service} is not Ready{why}; the replay starts once it is"
            await self._wait(replay, began, plan.SERVICE_NOT_READY, message)
            return False
        return validated.service_name, validated.spec

    async def _drive(
        self, replay: plan.Replay, began: plan.Started | None, service_name: str, runner: ReplayBroker
    ) -> bool:
        keep = PREVIEW_SIZE if replay.spec.dry_run else 0
        resumed = began is not None
        last_pass: conclusion.PassDone | None = None
        seen: conclusion.ArchiveSeen | None = None
        while True:
            started_at = began.started_at if began is not None else plan.start_time(time.time())
            name = began.service_name if began is not None else service_name
            if seen is None:
                seen = await runner.observe(name, replay.selection(started_at), keep)
            step = conclusion.conclude(
                self._previous(),
                replay,
                service_name=name,
                began=began,
                started_at=started_at,
                seen=seen,
                last_pass=last_pass,
                now=time.time(),
            )
            if step.action == "wait":
                self._log_wait(step.decision)
                if await self._write(step.decision.status_patch):
                    self._announce(step.decision.events)
                return False
            if step.action == "end":
                await self._end(step.decision)
                return True
            if step.action == "begin":
                if not await self._write(step.decision.status_patch):
                    return False  # not recorded: nothing may move before it is
                began = self._began = plan.Started(
                    started_at, seen.archived, seen.selected, name, replay.generation, None
                )
                self._announce(step.decision.events)
                continue
            if resumed:
                resumed = False
                self._logger.info(
                    "replay %s resumes: %d of %d selected events already %s",
                    self.name,
                    step.done,
                    began.matched if began is not None else 0,
                    replay.done_field,
                )
            assert began is not None  # a move follows a begin
            await self._write(step.decision.status_patch)
            ended = await self._move(replay, began, step.done, runner)
            if ended is not None:
                return ended
            tally = runner.tally
            last_pass = conclusion.PassDone(tally.done, tally.unroutable)
            seen = await runner.seen_after_move(began.service_name)

    async def _move(self, replay: plan.Replay, began: plan.Started, before: int, runner: ReplayBroker) -> bool | None:
        """One walk of the archive; True when the replay ended or was stopped meanwhile, None when it is to be
        observed again."""
        moving = asyncio.ensure_future(
            runner.move(
                began.service_name,
                replay.selection(began.started_at),
                purge=replay.purge,
                # Without a limit of its own it walks to the end: what it takes is what its selection takes, and a
                # walk over all of the archive is what lets it end without looking again (runner.seen_after_move).
                limit=None if replay.spec.limit is None else max(0, replay.target(began.matched) - before),
                rate=replay.spec.rate_per_second,
            )
        )
        first = began.first_message
        deleted = False
        while True:
            await asyncio.wait({moving}, timeout=STATUS_SECONDS)
            tally = runner.tally
            first = first or plan.message_view(tally.first)
            counters = plan.progressed(
                replay,
                matched=began.matched,
                done=before + tally.done,
                unroutable=tally.unroutable,
                first=first,
                last=plan.message_view(tally.last),
            )
            if moving.done():
                break
            if self._stopped or plan.spec_changed(specs.generation_of(self.body), began) or deleted:
                runner.halt()  # the move returns after the events in hand
            elif await self._service_gone(replay):
                deleted = True
                runner.halt()
            await self._write(counters)
        tally = moving.result()  # a broker failure is raised here: the next attempt resumes
        if first is not None:
            self._began = dataclasses.replace(began, first_message=first)
        if self._stopped:
            await self._write(counters)
            return True  # resumed by the next operator (or the resource is gone)
        if plan.spec_changed(specs.generation_of(self.body), began):
            await self._write(counters)
            await self._spec_changed()
            return True
        if deleted:
            decision = self._service_deleted(replay, began, done=before + tally.done, unroutable=tally.unroutable)
            await self._end(plan.Decision({**counters, **decision.status_patch}, decision.events))
            return True
        await self._write(counters)
        return None

    async def _service_gone(self, replay: plan.Replay) -> bool:
        """The service was deleted (or is being deleted): a fact of the API, read at most every few seconds."""
        try:
            service = await self.services.read(self.context.cluster, (self.namespace, replay.service))
        except NotFoundError:
            return True
        except KubeError:
            return False
        return bool((service.get("metadata") or {}).get("deletionTimestamp"))

    def _service_deleted(
        self, replay: plan.Replay, began: plan.Started, *, done: int, unroutable: int
    ) -> plan.Decision:
        self._logger.warning("replay %s stops: service %s was deleted", self.name, replay.service)
        return conclusion.service_deleted(
            self._previous(), replay, began, done=done, unroutable=unroutable, now=time.time()
        )

    def _done_as_written(self, replay: plan.Replay) -> int:
        done = (self.body.get("status") or {}).get(replay.done_field)
        written = self._written.get(replay.done_field, done)
        return written if isinstance(written, int) else 0

    def _log_wait(self, decision: plan.Decision) -> None:
        condition = plan.succeeded({"conditions": decision.status_patch.get("conditions") or []})
        current = plan.succeeded({"conditions": self._previous()})
        if (current.get("reason"), current.get("message")) != (condition.get("reason"), condition.get("message")):
            self._logger.info("replay %s waits: %s", self.name, condition.get("message"))

    # --- status and Events ----------------------------------------------------------------------

    async def _invalid(self, error: InvalidSpecError) -> None:
        began = self._began or plan.started(self.body.get("status") or {})
        if began is not None and plan.spec_changed(specs.generation_of(self.body), began):
            await self._spec_changed()
            return
        self._logger.warning("replay %s refused: %s", self.name, error)
        await self._end(plan.refused(self._previous(), self.body, error, now=time.time()))

    async def _spec_changed(self) -> None:
        message = "the spec changed after the replay started (it is immutable): nothing more is done; create another"
        await self._end(
            plan.failed(self._previous(), specs.generation_of(self.body), "SpecChanged", message, now=time.time())
        )

    async def _wait(self, replay: plan.Replay, began: plan.Started | None, reason: str, message: str) -> None:
        current = plan.succeeded({"conditions": self._previous()})
        if (current.get("reason"), current.get("message")) != (reason, message):
            self._logger.info("replay %s waits: %s", self.name, message)
        decision = plan.waiting(self._previous(), replay, reason, message, began=began, now=time.time())
        await self._write(decision.status_patch)

    async def _end(self, decision: plan.Decision) -> None:
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

    def _previous(self) -> list[dict[str, Any]]:
        if "conditions" in self._written:
            return list(self._written["conditions"])
        return list((self.body.get("status") or {}).get("conditions") or [])

    async def _write(self, status: Mapping[str, Any]) -> bool:
        """The fields the replay does not show yet, through the one writer; False when the API refused them."""
        if not await self._writer.write(self.body, status):
            return False
        self._written |= status
        return True
