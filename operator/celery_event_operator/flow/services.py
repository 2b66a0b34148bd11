"""One CeleryEventService kept true, on the event loop: its passes sequenced, nothing decided here.

Each pass reads top to bottom: observe (the steps, one I/O question each, through the ports) → conclude (one
pure function: the whole status, the Events, the annotations) → write (only what changed). The change handlers
call `reconcile` at once; the resource's one daemon calls `run`, which re-reconciles every `resync_seconds` and
runs a status pass every `statusIntervalSeconds`, each with jitter so that a thousand services do not act in the
same second. Both passes of a resource run under one lock, and the keeper concludes from its own last status
(not from a body the watch may not have refreshed yet).

The keeper is the reconciler of one resource; what it keeps between passes lives in parts it owns, each with its
own tests (tests/unit/flow/test_parts.py): the broker and events consumer it holds (hold.py), what it keeps of
its workers (workers.py), its removal from the broker when the resource goes (deletion.py), and the one writer of
its status (writer.py).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from celery_event_operator.core.api.metadata import ACCEPTED_IMMUTABLE_ANNOTATION
from celery_event_operator.core.api.models import CeleryEventServiceSpec, CeleryEventServiceStatus
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import (
    BrokerUnavailableError,
    InvalidSpecError,
    KubeUnavailableError,
    OperatorError,
)
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import (
    Announced,
    Conclusion,
    PostEvents,
    Settled,
    conclude,
    conclude_deletion,
    settled,
    status_of,
)
from celery_event_operator.core.service.next_steps import Rhythm
from celery_event_operator.core.service.observations import (
    MonitoringSeen,
    Observations,
    OwnershipSeen,
    QueuesSeen,
    ScalingSeen,
)
from celery_event_operator.core.service.ownership import Claim, Claimant, Holder, shown_refused
from celery_event_operator.core.service.pods import PodsOf, WorkerPod
from celery_event_operator.core.topology.outcome import DeclareOutcome
from celery_event_operator.flow import deletion, steps
from celery_event_operator.flow.hold import BrokerHold
from celery_event_operator.flow.ports import KeeperContext, ServiceBroker
from celery_event_operator.flow.workers import Workers
from celery_event_operator.flow.writer import Annotate, StatusWriter

# How often an invalid spec's status pass comes (it does nothing): the spec's own default.
DEFAULT_STATUS = CeleryEventServiceSpec.model_fields["status_interval_seconds"].default
# A reconcile that met the Kubernetes API not answering is made again this soon (at most every resync).
API_RETRY_SECONDS = 5.0
# Conclusions that changed nothing, kept to serve again: a reconcile's and a status pass's (their observations differ,
# and they alternate).
SETTLED_KEPT = 2


def _now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


class ServiceKeeper:
    def __init__(
        self, context: KeeperContext, namespace: str, name: str, post: PostEvents, logger: logging.Logger | Any
    ) -> None:
        self.context = context
        self.namespace = namespace
        self.name = name
        self.post = post
        self._logger = logger
        self.lock = asyncio.Lock()
        self._writer = StatusWriter(context.cluster.patch_status, context.cluster.annotate, namespace, name, logger)
        self._status: CeleryEventServiceStatus | None = None  # as last concluded (None: not yet, use the body's)
        self._announced = Announced()
        self._settled: tuple[Settled, ...] = ()  # the last conclusions that changed nothing (not worked out again)
        self._declare_memory = steps.DeclareMemory()
        self._hold = BrokerHold(context, namespace, name, self._declare_memory, logger)
        self._service: str | None = None
        self.workers = Workers(context, namespace, logger)
        self._refreshed_at: float | None = None  # the last status pass
        self.resync_requested = asyncio.Event()
        self._deleting = False  # the resource is being deleted: its entities are removed, nothing is declared
        self._api_retry = False  # the last reconcile met the Kubernetes API not answering
        self._by_generation = specs.GenerationCache[specs.Understood | InvalidSpecError](1)
        # The last claim on the service's topology was ours; None: none made by this process yet (the status tells).
        self._owner: bool | None = None

    # --- the two passes ---------------------------------------------------------------------

    async def reconcile(
        self, body: Mapping[str, Any], pods: PodsOf, annotate: Annotate | None = None, *, resync: bool = False
    ) -> None:
        """Validate, declare the topology, configure the workers, keep the consumer: conditions and Events. A
        `resync` asks the broker nothing when its listing shows claim and plan as declared (steps.shown_unchanged)."""
        async with self.lock:
            if not self._deleting:
                await self._reconcile(body, pods, annotate, resync)

    async def _reconcile(self, body: Mapping[str, Any], pods: PodsOf, annotate: Annotate | None, resync: bool) -> None:
        # Read together, before any wait: the watch may swap a later generation into the body meanwhile, whose
        # change handler waits for this pass and must not find its generation done with this spec.
        accepted, changed = specs.immutable_changes(body)
        found = self._understood(body)
        generation = specs.generation_of(body)
        if isinstance(found, InvalidSpecError) or changed is not None:
            # An immutable field changed: nothing is touched (a renamed service would get a second topology).
            await self._hold.let_go()
            invalid = found if isinstance(found, InvalidSpecError) else changed
            await self._write_unacted(body, Observations(generation, invalid=invalid), {}, annotate)
            return
        self._service = found.service
        claimant = self._claimant(body)
        broker, unusable, settings_unavailable = await self._hold.broker_for(found, claimant, owner=self._owner)
        declared = specs.declared_entities(body)
        remembered = {ACCEPTED_IMMUTABLE_ANNOTATION: json.dumps(accepted, sort_keys=True)}
        if self._owner is None:  # the operator restarted: a claim the broker cannot answer now must not act on it
            self._owner = not shown_refused(body.get("status"))
        unchanged = (
            resync
            and broker is not None
            and steps.shown_unchanged(
                broker,
                found.topology,
                declared,
                claimant,
                memory=self._declare_memory,
                max_age=self.context.options.resync_seconds,
            )
        )
        # The claim first: nothing of a service another resource owns is declared, configured or consumed.
        claimed: Claim | OperatorError | None = None
        if broker is not None:
            claimed = Claim() if unchanged else await steps.claim(broker, found.service, claimant)
        if not isinstance(claimed, Claim) or not claimed.ours:
            self._declare_memory.clean = None  # declared afresh once it is known ours again
        ownership = None
        if isinstance(claimed, Claim) and broker is not None:
            ownership = OwnershipSeen(found.service, claimant, claimed, broker.display)
            self._owner = claimed.ours
            if not claimed.ours:
                self._stop_events(found.service)
                seen = Observations(generation, found.spec, ownership=ownership)
                await self._write_unacted(body, seen, remembered, annotate)
                return
        if isinstance(claimed, OperatorError) and broker is not None:
            # Not known whose the service is this time: nothing declared; the rest stays as the last claim left it.
            topology = DeclareOutcome(found.topology, broker.display, claimed)
            if not self._owner:
                seen = Observations(generation, found.spec, topology=topology)
                await self._write_unacted(body, seen, remembered, annotate)
                return
        else:
            topology = await steps.declare(
                broker, unusable, found.topology, declared, unchanged=unchanged, memory=self._declare_memory
            )
        workers = await self.workers.outcome(body, generation, found, pods)
        # The Kubernetes API did not answer a read of this pass: asked again soon, not a whole resync later.
        self._api_retry = (
            settings_unavailable is not None
            or workers.unavailable is not None
            or isinstance(unusable, KubeUnavailableError)
        )
        self._hold.follow_events(found, broker)
        queues = scaling = None
        if self._refreshed_at is None and broker is not None:  # the first time, counters come with the conditions
            queues, scaling = await self._count(found, broker, pods, pods(found.service))
        alarms = await self._alarms(found, broker)
        seen = Observations(
            generation,
            found.spec,
            declared=declared,
            ownership=ownership,
            topology=topology,
            workers=workers,
            queues=queues,
            scaling=scaling,
            monitoring=self._monitoring(found, broker),
            settings_unavailable=settings_unavailable,
            alarms=alarms,
        )
        conclusion = self._conclude(body, seen)
        self.context.metrics.count_reconcile(conclusion.ready)
        await self._write(body, conclusion, {**conclusion.annotations, **remembered}, annotate)

    async def _write_unacted(
        self, body: Mapping[str, Any], seen: Observations, annotations: dict[str, str], annotate: Annotate | None
    ) -> None:
        """The conclusion of a reconcile that acted on nothing of the service (an invalid spec, a service another
        resource owns, or one not known to be this resource's when the broker could not be asked)."""
        conclusion = self._conclude(body, seen)
        self.context.metrics.count_reconcile(False)
        await self._write(body, conclusion, annotations, annotate)

    async def status_pass(self, body: Mapping[str, Any], pods: PodsOf) -> None:
        """Queue lengths into status, the autoscaling decision, healing, the consumer's condition."""
        async with self.lock:
            # Read together, before any wait: the watch may swap a later generation into the body meanwhile.
            found, generation = self._understood(body), specs.generation_of(body)
            broker = self._hold.broker
            if isinstance(found, InvalidSpecError) or broker is None or self._deleting or not self._owner:
                return  # the reconcile reports why
            live = pods(found.service)  # one look at the watched pods for the whole pass
            queues, scaling = await self._count(found, broker, pods, live)
            alarms = await self._alarms(found, broker)
            subscription = self._hold.subscription
            consumed = subscription is not None and subscription.problem is None
            lifecycle = await self.workers.lifecycle(found, broker, live, queues, alarms, events_consumed=consumed)
            metrics, now = self.context.metrics.find(self.namespace, found.service), time.monotonic()
            grace = steps.grace(found, metrics, now)
            timeout = self.context.options.broker_consumer_timeout_seconds
            seen = Observations(
                generation,
                found.spec,
                queues=queues,
                scaling=scaling,
                lifecycle=lifecycle,
                evicted=await self.workers.heal(found, live, lifecycle),
                monitoring=self._monitoring(found, broker),
                overflowing=self._overflowing(found),
                alarms=alarms,
                grace=grace,
                run_once=steps.run_once(found, broker, metrics, grace=grace, broker_timeout=timeout, now=now),
            )
            conclusion = self._conclude(body, seen)
            await self._write(body, conclusion, {}, None)
            if broker.events.login_refused or conclusion.resync:
                # The Secret may have been rotated: read it again now; or a broker alarm cleared.
                self.resync_requested.set()

    def _conclude(self, body: Mapping[str, Any], seen: Observations) -> Conclusion:
        previous = self._status if self._status is not None else status_of(body)
        rhythm = Rhythm(self.context.options.resync_seconds, self._status_interval(body))
        for known in self._settled:
            if known.answers(previous, seen, self._announced, rhythm):
                return known.conclusion
        conclusion = conclude(previous, seen, self._announced, _now(), rhythm)
        fresh = settled(previous, seen, self._announced, rhythm, conclusion)
        if fresh is not None:
            self._settled = (fresh, *self._settled)[:SETTLED_KEPT]
        self._status, self._announced = conclusion.status, conclusion.announced
        return conclusion

    async def _write(
        self, body: Mapping[str, Any], conclusion: Conclusion, annotations: dict[str, str], annotate: Annotate | None
    ) -> None:
        await self._writer.write(body, conclusion.patch, annotations, annotate)
        if conclusion.events:
            self.post(conclusion.events)

    # --- the daemon's loop ------------------------------------------------------------------

    async def run(self, body: Mapping[str, Any], pods: PodsOf, stopped: Any) -> None:
        """Until `stopped`: resync every resync_seconds, status every statusIntervalSeconds, jittered."""
        resync_every = self.context.options.resync_seconds
        now = time.monotonic()
        next_resync = now + resync_every * random.uniform(0.5, 1.0)  # the change handler reconciled just now
        next_status = now + random.uniform(0.0, min(self._status_interval(body), 2.0))
        # Both waits made once and kept across wakes (a thousand services wake about a hundred times a second:
        # new tasks for each wake were a tenth of an idle operator's CPU).
        stop = asyncio.ensure_future(stopped.wait())
        requested = asyncio.ensure_future(self.resync_requested.wait())
        try:
            while not stopped:
                now = time.monotonic()
                if now >= next_resync or self.resync_requested.is_set():
                    self.resync_requested.clear()
                    if self._hold.broker is not None and self._hold.broker.events.login_refused:
                        self._forget_secret(body)
                    await self.reconcile(body, pods, resync=True)
                    every = min(resync_every, API_RETRY_SECONDS) if self._api_retry else resync_every
                    next_resync = time.monotonic() + every * random.uniform(0.9, 1.1)
                if now >= next_status:
                    await self.status_pass(body, pods)
                    next_status = time.monotonic() + self._status_interval(body) * random.uniform(0.95, 1.05)
                if requested.done():
                    requested = asyncio.ensure_future(self.resync_requested.wait())
                wake_in = max(0.0, min(next_resync, next_status) - time.monotonic())
                await asyncio.wait({stop, requested}, timeout=wake_in, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            requested.cancel()
            await self.close()

    def _status_interval(self, body: Mapping[str, Any]) -> float:
        found = self._understood(body)
        return float(found.spec.status_interval_seconds if not isinstance(found, InvalidSpecError) else DEFAULT_STATUS)

    def _forget_secret(self, body: Mapping[str, Any]) -> None:
        found = self._understood(body)
        if not isinstance(found, InvalidSpecError):
            self.context.brokers.forget_secret(self.namespace, found.spec.broker.secret_ref.name)

    async def delete_entities(self, body: Mapping[str, Any], *, remove: bool, last_try: bool) -> str | None:
        """The resource goes: with `remove` (`deletionPolicy: delete`) the service's empty queues and exchanges
        removed, and the Events of what was removed and kept; in every case its claim on the service released last,
        and only when it is its own (a resource that does not own the service removes nothing). Why to try again
        later when the broker or the Kubernetes API (the Secret unread) did not answer this time (None: done).
        After the pass in hand (under the lock), no other pass runs: a resync must not declare them again."""
        async with self.lock:
            self._deleting = True
            outcome, holder = await self._delete_entities(body, remove)
        if outcome is None:
            return None  # never acted on: nothing of it is on the broker
        if isinstance(outcome.failure, BrokerUnavailableError | KubeUnavailableError) and not last_try:
            self._logger.warning("%s; deletion tried again later", outcome.failure)
            return str(outcome.failure)
        notes = conclude_deletion(outcome, self._claimant(body), holder, removing=remove)
        if notes:
            self.post(notes)
        return None

    async def _delete_entities(
        self, body: Mapping[str, Any], remove: bool
    ) -> tuple[DeclareOutcome | None, Holder | None]:
        found = specs.understand(specs.as_accepted(body))  # the service it was acting on, whatever changed since
        if isinstance(found, InvalidSpecError):
            return None, None
        return await deletion.remove(
            self.context.brokers,
            self.namespace,
            found,
            specs.declared_entities(body),
            self._claimant(body),
            remove_entities=remove,
            last_settings=self._hold.settings,
            post=self.post,
        )

    def _claimant(self, body: Mapping[str, Any]) -> Claimant:
        uid = (body.get("metadata") or {}).get("uid")
        return Claimant(self.context.options.installation_id, self.namespace, self.name, str(uid or ""))

    def _stop_events(self, service: str) -> None:
        """No events consumer, no series and no status passes counted for a service this resource does not own."""
        self._hold.stop_events(service)
        self.context.metrics.forget_status(self.namespace, self.name)

    async def close(self) -> None:
        """The resource is gone (or the operator stops): its consumer, broker and series let go."""
        async with self.lock:
            await self._hold.let_go()
            if self._service is not None:
                self.context.metrics.remove(self.namespace, self._service)
            self.context.metrics.forget_status(self.namespace, self.name)

    # --- steps that keep state between passes ---------------------------------------------------

    def _understood(self, body: Mapping[str, Any]) -> specs.Understood | InvalidSpecError:
        """The validated spec and its plan, worked out once per generation."""
        return self._by_generation.get(body, lambda: specs.understand(body))

    async def _alarms(self, understood: specs.Understood, broker: ServiceBroker | None) -> tuple[Alarm, ...] | None:
        """The broker's resource alarms (listed once per broker and half interval); into the service's metrics."""
        if broker is None:
            return None
        alarms = await steps.alarms(broker, understood.spec.status_interval_seconds / 2)
        metrics = self.context.metrics.find(self.namespace, understood.service)
        if metrics is not None:
            metrics.broker_alarms = None if alarms is None else len(alarms)
        return alarms

    def _monitoring(self, understood: specs.Understood, broker: ServiceBroker | None) -> MonitoringSeen:
        return steps.monitoring(understood.spec.monitoring.enabled, self._hold.subscription, broker)

    async def _count(
        self, understood: specs.Understood, broker: ServiceBroker, pods: PodsOf, live: list[WorkerPod]
    ) -> tuple[QueuesSeen, ScalingSeen]:
        """The queue depths and the workers' replicas, and this pass counted as the status's refresh."""
        counted = await self.workers.count(understood, broker, pods, live)
        self.context.metrics.status_refreshed(self.namespace, self.name, understood.spec.status_interval_seconds)
        self._refreshed_at = time.monotonic()
        return counted

    def _overflowing(self, understood: specs.Understood) -> dict[str, tuple[int, int]] | None:
        """The service's metric labels past their bound (None: no metrics)."""
        metrics = self.context.metrics.find(self.namespace, understood.service)
        return metrics.overflowing() if metrics is not None else None
