"""One CeleryEventService kept true, on the event loop: its passes sequenced, nothing decided here.

Each pass reads top to bottom: observe (the steps, one I/O question each, through the ports) → conclude (one
pure function: the whole status, the Events, the annotations) → write (only what changed). The change handlers
call `reconcile` at once; the resource's one daemon calls `run`, which re-reconciles every `resync_seconds` and
runs a status pass every `statusIntervalSeconds`, each with jitter so that a thousand services do not act in the
same second. Both passes of a resource run under one lock, and the keeper concludes from its own last status
(not from a body the watch may not have refreshed yet).
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import (
    BrokerUnavailableError,
    InvalidSpecError,
    KubeUnavailableError,
    OperatorError,
)
from celery_event_operator.core.injection import healing
from celery_event_operator.core.injection.outcome import WorkersOutcome, count_pods
from celery_event_operator.core.lifecycle import stuck as stuck_memory
from celery_event_operator.core.monitoring.consumer import EventsSubscription
from celery_event_operator.core.naming import event_exchange_name, handler_queue_name, monitor_queue_name
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import (
    Announced,
    Conclusion,
    PostEvents,
    conclude,
    conclude_deletion,
    conclude_unclaimed_deletion,
    status_of,
)
from celery_event_operator.core.service.next_steps import Rhythm
from celery_event_operator.core.service.observations import (
    Evicted,
    LifecycleSeen,
    MonitoringSeen,
    Observations,
    OwnershipSeen,
    QueuesSeen,
    ScalingSeen,
)
from celery_event_operator.core.service.ownership import Claim, Claimant, Holder, shown_refused
from celery_event_operator.core.service.pods import PodsOf, WorkerPod
from celery_event_operator.core.topology.outcome import DeclareOutcome, Report
from celery_event_operator.flow import steps
from celery_event_operator.flow.ports import KeeperContext, ServiceBroker
from celery_event_operator.flow.writer import Annotate, StatusWriter

# The workers' ConfigMap and rollout stamp are checked on every spec change and at least this often
# (not on every resync: two API reads per service and resync would dominate at a thousand services).
WORKERS_CHECK_SECONDS = 300.0
# The workload's desired replicas are read every this many resyncs (and before any change of them).
SCALE_READ_RESYNCS = 4
# A worker outside Kubernetes (no pod) that was not heard from this long is gone (Celery heartbeats every 2 s;
# task events count as signs of life too); workers are swept at most this often.
SILENCE_SECONDS = 300.0
SWEEP_SECONDS = 30.0
# How often an invalid spec's status pass comes (it does nothing): the spec's own default.
DEFAULT_STATUS = CeleryEventServiceSpec.model_fields["status_interval_seconds"].default
# A reconcile that met the Kubernetes API not answering is made again this soon (at most every resync).
API_RETRY_SECONDS = 5.0


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
        self._broker: ServiceBroker | None = None
        self._subscription: EventsSubscription | None = None
        self._service: str | None = None
        self._workers: tuple[int | None, float, WorkersOutcome] | None = None  # generation, when, outcome
        self._scaler = steps.ScalerMemory()
        self._healing = healing.HealingMemory()
        self._lifecycle_memory = steps.LifecycleMemory()
        self._declare_memory = steps.DeclareMemory()
        self._swept_at = time.monotonic()
        self._refreshed_at: float | None = None  # the last status pass
        self.resync_requested = asyncio.Event()
        self._deleting = False  # the resource is being deleted: its entities are removed, nothing is declared
        self._api_retry = False  # the last reconcile met the Kubernetes API not answering
        self._by_generation = specs.GenerationCache[specs.Understood | InvalidSpecError](1)
        # The last claim on the service's topology was ours; None: none made by this process yet (the status tells).
        self._owner: bool | None = None
        self._settings: BrokerSettings | None = None  # the broker settings last read from the Secret

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
            await self._let_go()
            invalid = found if isinstance(found, InvalidSpecError) else changed
            await self._write_unacted(body, Observations(generation, invalid=invalid), {}, annotate)
            return
        self._service = found.service
        claimant = self._claimant(body)
        broker, unusable, settings_unavailable = await self._broker_for(found, claimant)
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
                await self._stop_events(found.service)
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
        workers = await self._workers_outcome(body, generation, found, pods)
        # The Kubernetes API did not answer a read of this pass: asked again soon, not a whole resync later.
        self._api_retry = (
            settings_unavailable is not None
            or workers.unavailable is not None
            or isinstance(unusable, KubeUnavailableError)
        )
        await self._follow_events(found, broker)
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
            broker = self._broker
            if isinstance(found, InvalidSpecError) or broker is None or self._deleting or not self._owner:
                return  # the reconcile reports why
            live = pods(found.service)  # one look at the watched pods for the whole pass
            queues, scaling = await self._count(found, broker, pods, live)
            alarms = await self._alarms(found, broker)
            lifecycle = await self._lifecycle(found, broker, live, queues, alarms)
            metrics, now = self.context.metrics.find(self.namespace, found.service), time.monotonic()
            grace = steps.grace(found, metrics, now)
            timeout = self.context.options.broker_consumer_timeout_seconds
            seen = Observations(
                generation,
                found.spec,
                queues=queues,
                scaling=scaling,
                lifecycle=lifecycle,
                evicted=await self._heal(found, live, lifecycle),
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
        rhythm = Rhythm(self.context.options.resync_seconds, API_RETRY_SECONDS, self._status_interval(body))
        conclusion = conclude(previous, seen, self._announced, _now(), rhythm)
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
                    if self._broker is not None and self._broker.events.login_refused:
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
        brokers = self.context.brokers
        try:
            try:
                settings = await brokers.settings(self.namespace, found.spec)
            except OperatorError:
                if self._settings is None:
                    raise
                # The Secret went first (its namespace is being deleted): the broker last used is the one it owns.
                settings = self._settings
            broker = brokers.acquire(settings)
        except OperatorError as exc:
            return DeclareOutcome(found.topology, failure=exc), None
        claimant = self._claimant(body)
        try:
            # Confirmed ours before anything is removed: another's entities are never touched, nor those of a name
            # nobody claimed (a resource of the version before claims, its sibling not reconciled yet).
            claimed = await steps.claim_at_deletion(broker, found.service, claimant)
            if isinstance(claimed, OperatorError):
                return DeclareOutcome(found.topology, broker.display, claimed), None
            if not claimed.ours:
                return DeclareOutcome(found.topology, broker.display), claimed.holder
            outcome = DeclareOutcome(found.topology, broker.display)
            if remove and claimed.fresh:
                self.post(conclude_unclaimed_deletion(found.service))
                outcome = DeclareOutcome(found.topology, broker.display, report=Report())  # nothing removed
            elif remove:
                outcome = await steps.declare(broker, None, found.topology, specs.declared_entities(body), remove=True)
            if outcome.failure is None:  # released last: until then no other resource declares anything of it
                released = await steps.release(broker, found.service, claimant)
                if isinstance(released, OperatorError):
                    return dataclasses.replace(outcome, failure=released), None
            return outcome, None
        finally:
            await brokers.release(broker.key)

    async def _release_claim(self, broker: ServiceBroker, service: str, claimant: Claimant) -> None:
        released = await steps.release(broker, service, claimant)
        if isinstance(released, OperatorError):
            self._logger.warning("the claim of %r on %s stays: %s", service, broker.display, released)

    def _claimant(self, body: Mapping[str, Any]) -> Claimant:
        uid = (body.get("metadata") or {}).get("uid")
        return Claimant(self.context.options.installation_id, self.namespace, self.name, str(uid or ""))

    async def _stop_events(self, service: str) -> None:
        """No events consumer, no series and no status passes counted for a service this resource does not own."""
        if self._subscription is not None and self._broker is not None:
            self._broker.events.unsubscribe(self._subscription)
        self._subscription = None
        self.context.metrics.remove(self.namespace, service)
        self.context.metrics.forget_status(self.namespace, self.name)

    async def close(self) -> None:
        """The resource is gone (or the operator stops): its consumer, broker and series let go."""
        async with self.lock:
            await self._let_go()
            if self._service is not None:
                self.context.metrics.remove(self.namespace, self._service)
            self.context.metrics.forget_status(self.namespace, self.name)

    # --- steps that keep state between passes ---------------------------------------------------

    def _understood(self, body: Mapping[str, Any]) -> specs.Understood | InvalidSpecError:
        """The validated spec and its plan, worked out once per generation."""
        return self._by_generation.get(body, lambda: specs.understand(body))

    async def _broker_for(
        self, understood: specs.Understood, claimant: Claimant
    ) -> tuple[ServiceBroker | None, OperatorError | None, str | None]:
        """The broker of the service's current settings (switching when the Secret changed), or why none; and,
        when the Secret has not been readable for long, why the broker of the settings last read is kept. Moving
        to another broker or vhost releases the claim on the one left (new credentials for the same one keep it)."""
        brokers = self.context.brokers
        try:
            settings = await brokers.settings(self.namespace, understood.spec)
            self._settings = settings
            if self._broker is not None and self._broker.key == settings.key:
                return self._broker, None, None
            broker = brokers.acquire(settings)  # its TLS material is checked here
        except KubeUnavailableError as exc:
            # The API's fault, not the Secret's: the broker and the events consumer stay as they are.
            if self._broker is not None:
                return self._broker, None, str(exc)
            return None, exc, None
        except OperatorError as exc:
            await self._let_go()
            return None, exc, None
        self._declare_memory.clean = None  # declared afresh as these settings: their rights may differ
        if self._broker is not None:
            self._logger.info("broker settings of %s changed: moving to %s", self.name, broker.display)
            if self._owner and broker.display != self._broker.display:
                await self._release_claim(self._broker, understood.service, claimant)
        await self._let_go()
        self._broker = broker
        return broker, None, None

    async def _let_go(self) -> None:
        if self._subscription is not None and self._broker is not None:
            self._broker.events.unsubscribe(self._subscription)
        self._subscription = None
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await self.context.brokers.release(broker.key)

    async def _follow_events(self, understood: specs.Understood, broker: ServiceBroker | None) -> None:
        """Consume the service's Celery events from its broker while monitoring is on."""
        service = understood.service
        if broker is None or not understood.spec.monitoring.enabled:
            if self._subscription is not None and self._broker is not None:
                self._broker.events.unsubscribe(self._subscription)
                self._subscription = None
                self.context.metrics.remove(self.namespace, service)
            return
        monitoring = understood.spec.monitoring
        metrics = self.context.metrics.service(
            self.namespace, service, monitoring.per_pod_task_series, monitoring.max_task_names
        )
        # queue_name of the handlers' task events (none of which says the queue it was consumed from)
        metrics.handler_queues = {h.name: handler_queue_name(service, h.name) for h in understood.spec.events.handlers}
        queue = monitor_queue_name(service)
        if self._subscription is not None and self._subscription.queue == queue:
            return
        if self._subscription is not None:
            broker.events.unsubscribe(self._subscription)
        self._subscription = broker.events.subscribe(
            f"{self.namespace}/{service}", queue, event_exchange_name(service), metrics
        )

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
        return steps.monitoring(understood.spec.monitoring.enabled, self._subscription, broker)

    async def _workers_outcome(
        self, body: Mapping[str, Any], generation: int | None, understood: specs.Understood, pods: PodsOf
    ) -> WorkersOutcome:
        """The ConfigMap and rollout stamp (checked per generation and every WORKERS_CHECK_SECONDS), the pods;
        `understood` is of `generation` (the body may hold a later one by now: kopf's watch keeps it current)."""
        now = time.monotonic()
        hashes = [pod.config_hash for pod in pods(understood.service)]
        if self._workers is not None:
            checked_generation, checked_at, outcome = self._workers
            if checked_generation == generation and now - checked_at < WORKERS_CHECK_SECONDS:
                counted = count_pods(outcome.config_hash, hashes)
                outcome = dataclasses.replace(
                    outcome, pods=counted.pods, pods_current=counted.pods_current, stamped=None
                )
                return dataclasses.replace(outcome, heal_after_seconds=self._heal_after(understood))
        outcome = await self.context.cluster.sync_workers(
            owner=dict(body), service=understood.service, spec=understood.spec, pod_hashes=hashes
        )
        if outcome.unavailable is None:
            # A failure is checked again at the next pass: a workload created after its service (kubectl apply of
            # a folder, a Helm chart's order) is stamped then, not WORKERS_CHECK_SECONDS later.
            failed = outcome.configmap_error is not None or outcome.target_error is not None
            self._workers = None if failed else (generation, now, outcome)
        elif self._workers is not None and self._workers[0] != generation:
            self._workers = None  # the previous generation's hash must not judge the pods of this one
        return dataclasses.replace(outcome, heal_after_seconds=self._heal_after(understood))

    def _heal_after(self, understood: specs.Understood) -> int | None:
        """Seconds after which a pod without the current settings is evicted; None: never. Only an operator
        that serves the webhook heals (without it, no pod carries the settings hash)."""
        workers = understood.spec.workers
        if self.context.options.webhook is None or workers is None or not workers.heal_unconfigured_pods:
            return None
        return workers.heal_after_seconds

    async def _lifecycle(
        self,
        understood: specs.Understood,
        broker: ServiceBroker,
        live: list[WorkerPod],
        queues: QueuesSeen,
        alarms: tuple[Alarm, ...] | None,
    ) -> LifecycleSeen | None:
        """Deletion costs kept, stuck workers found."""
        metrics = self.context.metrics.find(self.namespace, understood.service)
        subscription = self._subscription
        seen = await steps.keep_lifecycle(
            self.context.cluster,
            broker,
            self.namespace,
            understood,
            pods=live,
            metrics=metrics,
            memory=self._lifecycle_memory,
            queues=queues,
            events_consumed=subscription is not None and subscription.problem is None,
            alarms=alarms,
            config_hash=self._workers[2].config_hash if self._workers is not None else None,
            now=time.monotonic(),
            logger=self._logger,
        )
        if metrics is not None:
            judged = seen is not None and seen.unchecked is None
            metrics.stuck_workers = len(seen.stuck) if seen is not None and judged else None
            metrics.replacement_paused = (seen.judgement.paused is not None) if seen is not None and judged else None
        return seen

    async def _heal(
        self, understood: specs.Understood, live: list[WorkerPod], lifecycle: LifecycleSeen | None
    ) -> Evicted | None:
        """Evict the next stuck worker, or pod without the current settings, when one is due."""
        heal_after, workers = self._heal_after(understood), understood.spec.workers
        if workers is None:
            return None
        replace = lifecycle is not None and workers.replace_stuck_workers
        stuck = {w.pod: w for w in lifecycle.stuck if w.replace} if lifecycle is not None and replace else {}
        if heal_after is None and not stuck:
            return None
        now = time.monotonic()
        evicted = await steps.heal(
            self.context.cluster,
            self.namespace,
            self._healing,
            live,
            self._workers[2].config_hash if heal_after is not None and self._workers is not None else None,
            stuck={pod: worker.why for pod, worker in stuck.items()},
            busy=lifecycle.busy if lifecycle is not None else frozenset(),
            heal_old=workers.rollout_on_change,
            grace_seconds=heal_after or workers.heal_after_seconds,
            now=now,
            logger=self._logger,
        )
        if evicted is not None and evicted.pod in stuck:
            stuck_memory.evicted(self._lifecycle_memory.stuck, stuck[evicted.pod], now)
        return evicted

    async def _count(
        self, understood: specs.Understood, broker: ServiceBroker, pods: PodsOf, live: list[WorkerPod]
    ) -> tuple[QueuesSeen, ScalingSeen]:
        """The queue depths and the workers' replicas (scaled when wished); recorded into the service's metrics."""
        spec = understood.spec
        queues = await steps.queues(broker, understood.topology, spec.status_interval_seconds / 2)
        scaling = await steps.scale_workers(
            self.context.cluster,
            self.namespace,
            understood,
            queues=queues,
            running=len(live),
            memory=self._scaler,
            now=time.monotonic(),
            scale_max_age=SCALE_READ_RESYNCS * self.context.options.resync_seconds,
        )
        self._record_metrics(understood.service, queues, scaling, [pod.name for pod in live])
        metrics = self.context.metrics.find(self.namespace, understood.service)
        if metrics is not None:  # the hostnames its series keep: its live pods (the watched pods, read when needed)
            metrics.live_pods = lambda: (pod.name for pod in pods(understood.service))
        self.context.metrics.status_refreshed(self.namespace, self.name, spec.status_interval_seconds)
        self._refreshed_at = time.monotonic()
        return queues, scaling

    def _overflowing(self, understood: specs.Understood) -> dict[str, tuple[int, int]] | None:
        """The service's metric labels past their bound (None: no metrics)."""
        metrics = self.context.metrics.find(self.namespace, understood.service)
        return metrics.overflowing() if metrics is not None else None

    def _record_metrics(self, service: str, queues: QueuesSeen, scaling: ScalingSeen, live: list[str]) -> None:
        metrics = self.context.metrics.find(self.namespace, service)
        if metrics is None:
            return
        if queues.depths is not None:  # celery_queue_length & co.
            metrics.queue_length = {(depth.queue, depth.role): depth.waiting for depth in queues.depths}
            metrics.queue_consumers = {d.queue: d.consumers for d in queues.depths if d.role == "events"}
        metrics.replicas = scaling.replicas
        # the autoscaler's or spec's wish, else what the workload itself asks for
        metrics.desired_replicas = scaling.desired if scaling.desired is not None else scaling.workload
        now = time.monotonic()
        if now - self._swept_at >= SWEEP_SECONDS:
            self._swept_at = now
            gone = metrics.sweep(live, now, SILENCE_SECONDS)
            if gone:
                self._logger.info("series of workers no longer seen removed: %s", ", ".join(gone))
