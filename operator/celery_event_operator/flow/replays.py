"""One CeleryEventReplay run by the operator, on the event loop (the domain layer: the handler calls this, this
calls the adapters).

It waits — for its service to exist and be Ready, for its turn (one running replay per service), for a broker
that answers — and says why in its Succeeded condition; then it counts what it selects, writes that down (and
sees it written) before anything moves, drives its ReplayRunner and keeps the counters in status every few
seconds. Stopped (the operator stops, the resource is deleted) it lets its runner finish the event in hand; a
replay that was started is resumed by whichever operator runs next (replay/plan.py says how it counts then).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.adapters.replay.runner import ReplayRunner
from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.models import PREVIEW_SIZE, CeleryEventServiceSpec
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
from celery_event_operator.core.replay import plan
from celery_event_operator.core.replay.slots import Key, ReplaySlots
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import EventNote, PostEvents
from celery_event_operator.flow.context import Context

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
        self._read: dict[Key, tuple[float, asyncio.Task[dict[str, Any]]]] = {}

    async def read(self, context: Context, key: Key) -> dict[str, Any]:
        """The service's body; NotFoundError or KubeError otherwise."""
        now = time.monotonic()
        found = self._read.get(key)
        if found is None or now - found[0] > SERVICE_READ_SECONDS:
            self._read = {k: v for k, v in self._read.items() if now - v[0] <= SERVICE_READ_SECONDS}
            reading = asyncio.ensure_future(context.kube.read(context.kube.api.read_service, *key))
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
        context: Context,
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
        self._conditions: list[dict[str, Any]] | None = None  # as last written
        self._sent: dict[str, Any] = {}  # status fields as last written
        self._began: plan.Started | None = None  # as last written (the watch may not have brought it back yet)

    async def run(self, stopped: Any) -> None:
        """Until it ended (Succeeded True or False) or `stopped`."""
        self._stopped = stopped
        key: Key | None = None
        try:
            while not stopped:
                try:
                    replay = plan.understand(self.body)
                except InvalidSpecError as exc:
                    await self._invalid(exc)
                    return
                if key != (self.namespace, replay.service):  # its service may still change before it starts
                    if key is not None:
                        self.slots.leave(key, self.name)
                    key = (self.namespace, replay.service)
                    self.slots.wait(key, self.name, replay.created_at)
                if await self._attempt(replay, key):
                    return
                await stopped.wait(WAIT_SECONDS * random.uniform(0.8, 1.2))
        finally:
            if key is not None:
                self.slots.leave(key, self.name)

    # --- one attempt: True when it ended (or was stopped) ---------------------------------------

    async def _attempt(self, replay: plan.Replay, key: Key) -> bool:
        began = self._began or plan.started(self.body.get("status") or {})
        if began is not None and plan.spec_changed(replay.generation, began):
            await self._spec_changed()
            return True
        found = await self._service(replay, began)
        if found is None:
            return False
        service_name, service_spec = found
        holder = self.slots.take(key, self.name)
        if holder is not None:
            message = f"replay {holder} of service {replay.service} goes first: one replay of a service runs at a time"
            await self._wait(replay, began, plan.WAITING_FOR_REPLAY, message)
            return False
        try:
            try:
                settings = await self.context.brokers.settings(self.namespace, service_spec)
            except OperatorError as exc:  # the Secret unusable, or the Kubernetes API not answering: its reason
                await self._wait(replay, began, exc.reason, str(exc))
                return False
            runner = ReplayRunner(settings)
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
            self.slots.release(key, self.name)

    async def _service(
        self, replay: plan.Replay, began: plan.Started | None
    ) -> tuple[str, CeleryEventServiceSpec] | None:
        """The serviceName and spec of the replay's service once it is Ready; None (and why, in status) before."""
        try:
            service = await self.services.read(self.context, (self.namespace, replay.service))
        except NotFoundError:
            message = (
                f"there is no CeleryEventService {replay.service} in namespace {self.namespace} (a replay acts on a "
                "service of its own namespace); it starts when there is one"
            )
            await self._wait(replay, began, plan.SERVICE_NOT_FOUND, message)
            return None
        except KubeError as exc:  # the API's fault (not answering, a missing permission): its own reason
            await self._wait(replay, began, exc.reason, str(exc))
            return None
        ready = conditions.find_written(service.get("status"), conditions.READY)
        try:
            validated = specs.validate(service)
        except InvalidSpecError:
            validated = None
        if ready.get("status") != "True" or validated is None:
            why = f" ({ready.get('reason')}: {ready.get('message')})" if ready else ""
            message = f"service {replay.service} is not Ready{why}; the replay starts once it is"
            await self._wait(replay, began, plan.SERVICE_NOT_READY, message)
            return None
        return validated.service_name, validated.spec

    async def _drive(
        self, replay: plan.Replay, began: plan.Started | None, service_name: str, runner: ReplayRunner
    ) -> bool:
        keep = PREVIEW_SIZE if replay.spec.dry_run else 0
        if began is None:
            started_at = plan.start_time(time.time())
            surveyed = await runner.survey(service_name, replay.selection(started_at), keep)
            decision = plan.begun(
                self._previous(),
                replay,
                service_name=service_name,
                started_at=started_at,
                archived=surveyed.archived,
                matched=surveyed.matched,
            )
            if not await self._write(decision.status_patch):
                return False  # not recorded: nothing may move before it is
            began = self._began = plan.Started(
                started_at, surveyed.archived, surveyed.matched, service_name, replay.generation, None
            )
            self._announce(decision.events)
            before = 0
        else:
            self._began = began
            surveyed = await runner.survey(began.service_name, replay.selection(began.started_at), keep)
            before = plan.done_before(began.matched, surveyed.matched)
            self._logger.info(
                "replay %s resumes: %d of %d selected events already %s",
                self.name,
                before,
                began.matched,
                replay.done_field,
            )
        if replay.spec.dry_run:
            decision = plan.dry_run_ended(
                self._previous(),
                replay,
                service_name=began.service_name,
                matched=began.matched,
                preview=surveyed.sample,
                now=time.time(),
            )
            await self._end(decision)
            return True
        return await self._move(replay, began, before, runner)

    async def _move(self, replay: plan.Replay, began: plan.Started, before: int, runner: ReplayRunner) -> bool:
        moving = asyncio.ensure_future(
            runner.move(
                began.service_name,
                replay.selection(began.started_at),
                purge=replay.purge,
                limit=max(0, replay.target(began.matched) - before),
                rate=replay.spec.rate_per_second,
            )
        )
        first = began.first_message
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
            if self._stopped or plan.spec_changed(specs.generation_of(self.body), began):
                runner.stop.set()  # the move returns after the event in hand
            await self._write(counters)
        tally = moving.result()  # a broker failure is raised here: the next attempt resumes
        if self._stopped:
            await self._write(counters)
            return True  # resumed by the next operator (or the resource is gone)
        if plan.spec_changed(specs.generation_of(self.body), began):
            await self._write(counters)
            await self._spec_changed()
            return True
        decision = plan.ended(
            self._previous(),
            replay,
            service_name=began.service_name,
            archived=began.archived,
            matched=began.matched,
            done=before + tally.done,
            last=plan.message_view(tally.last),
            now=time.time(),
        )
        await self._end(plan.Decision({**counters, **decision.status_patch}, decision.events))
        return True

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
        if self._conditions is not None:
            return self._conditions
        return list((self.body.get("status") or {}).get("conditions") or [])

    async def _write(self, status: Mapping[str, Any]) -> bool:
        """Patch the fields that changed since the last write; False when the API refused it."""
        changed = {field: value for field, value in status.items() if self._sent.get(field, ...) != value}
        if not changed:
            return True
        kube = self.context.kube
        try:
            await kube.call(kube.api.patch_replay_status, self.namespace, self.name, changed)
        except KubeError as exc:
            self._logger.warning("status of replay %s/%s not written: %s", self.namespace, self.name, exc)
            return False
        self._sent |= changed
        if "conditions" in changed:
            self._conditions = changed["conditions"]
        return True
