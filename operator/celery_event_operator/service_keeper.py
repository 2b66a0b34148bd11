"""One CeleryEventService kept true, on the event loop: its topology, its workers' settings, its status,
its autoscaling and its events consumer (the domain layer: handlers call this, this calls the adapters).

One keeper per resource. The change handlers call `reconcile` at once; the resource's one daemon calls
`run`, which re-reconciles every `resync_seconds` and refreshes queue lengths every
`statusIntervalSeconds`, each with jitter so that a thousand services do not act in the same second.
Everything the keeper writes goes through it under one lock, and it remembers what it wrote: conditions
are computed from its own last state (not from a body the watch may not have refreshed yet), and status
is patched only with the fields that changed, so a service at rest costs no API writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from celery_event_operator import service_status
from celery_event_operator.api import conditions
from celery_event_operator.broker.address import ManagementURLRejectedError
from celery_event_operator.broker.brokers import Broker, Brokers
from celery_event_operator.broker.secret import BrokerSettings, SecretReader
from celery_event_operator.errors import BrokerSecretError, InvalidSpecError, KubeError
from celery_event_operator.injection import healing
from celery_event_operator.injection import workers as injection
from celery_event_operator.injection.catalog import InjectionCatalog
from celery_event_operator.injection.outcome import Outcome as WorkersOutcome
from celery_event_operator.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.monitoring import report
from celery_event_operator.monitoring.bounds import SeriesSettings
from celery_event_operator.monitoring.collector import MetricsRegistry, serve_metrics
from celery_event_operator.monitoring.events_connection import Subscription
from celery_event_operator.naming import event_exchange_name, handler_queue_name, monitor_queue_name
from celery_event_operator.options import OperatorOptions
from celery_event_operator.scaling import queue_status
from celery_event_operator.service_status import EventNote, Validated
from celery_event_operator.topology import declaring, plan
from celery_event_operator.topology.outcome import FailureReason, Outcome

# The workers' ConfigMap and rollout stamp are checked on every spec change and at least this often
# (not on every resync: two API reads per service and resync would dominate at a thousand services).
WORKERS_CHECK_SECONDS = 300.0
# The workload's desired replicas are read every this many resyncs (and before any change of them).
SCALE_READ_RESYNCS = 4
# A status field sent and not yet seen back in the body is sent again only after this long.
RESEND_SECONDS = 10.0

PostEvents = Callable[[tuple[EventNote, ...]], None]
Annotate = Callable[[dict[str, str]], None]
ServicePods = Callable[[str], list[tuple[str, str | None]]]  # serviceName → (pod name, settings hash) of live pods
# A worker outside Kubernetes (no pod) that was not heard from this long is gone (Celery heartbeats every 2 s;
# task events count as signs of life too); workers are swept at most this often.
SILENCE_SECONDS = 300.0
SWEEP_SECONDS = 30.0


@dataclasses.dataclass
class Context:
    """What every keeper shares (kept in kopf's root memo)."""

    options: OperatorOptions
    kube: AsyncKubeApi
    secrets: SecretReader
    brokers: Brokers
    metrics: MetricsRegistry
    injections: InjectionCatalog

    @classmethod
    def open(cls, options: OperatorOptions) -> Context:
        """The clients every keeper shares, and the /metrics server when it is wanted."""
        kube = AsyncKubeApi(KubeApi.from_environment())
        context = cls(
            options=options,
            kube=kube,
            secrets=SecretReader(kube),
            brokers=Brokers(),
            metrics=MetricsRegistry(
                options.runtime_buckets,
                options.queue_wait_buckets,
                SeriesSettings(options.per_pod_task_series, options.max_task_names),
            ),
            injections=InjectionCatalog(kube),
        )
        if options.metrics_port:
            serve_metrics(context.metrics, options.metrics_port, options.metrics_addr)
        return context

    async def ensure_peering(self) -> None:
        """The kopf peering object this replica meets the others in (each served namespace has its own)."""
        name = self.options.peering
        if name is None:
            return
        for namespace in self.options.namespaces or (None,):
            try:
                await self.kube.call(self.kube.api.ensure_peering, name, namespace)
            except KubeError as exc:  # e.g. the peering CRDs are not installed: kopf pauses and says so
                logging.getLogger(__name__).warning("%s", exc)

    async def close(self) -> None:
        await self.metrics.close()
        await self.brokers.close_all()
        self.kube.close()


def _now() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


class ServiceKeeper:
    def __init__(
        self, context: Context, namespace: str, name: str, post: PostEvents, logger: logging.Logger | Any
    ) -> None:
        self.context = context
        self.namespace = namespace
        self.name = name
        self.post = post
        self._logger = logger
        self.lock = asyncio.Lock()
        self._conditions: list[dict[str, Any]] | None = None  # as last written (None: not yet, use the body's)
        self._sent: dict[str, tuple[Any, float]] = {}  # status fields written: value, when
        self._annotations_sent: dict[str, tuple[Any, float]] = {}
        self._broker: Broker | None = None
        self._subscription: Subscription | None = None
        self._service: str | None = None
        self._workers: tuple[int | None, float, WorkersOutcome] | None = None  # generation, when, outcome
        self._scaler = queue_status.ScalerMemory()
        self._healing = healing.HealingMemory()
        self._monitoring_announced = False
        self._swept_at = time.monotonic()
        self._refreshed_at: float | None = None  # the last status pass
        self.resync_requested = asyncio.Event()
        self._by_generation = service_status.GenerationCache[tuple[Validated, plan.Topology] | InvalidSpecError](1)

    # --- the two passes ---------------------------------------------------------------------

    async def reconcile(self, body: Mapping[str, Any], pods: ServicePods, annotate: Annotate | None = None) -> None:
        """Validate, declare the topology, configure the workers, keep the consumer: conditions and Events."""
        async with self.lock:
            await self._reconcile(body, pods, annotate)

    async def _reconcile(self, body: Mapping[str, Any], pods: ServicePods, annotate: Annotate | None) -> None:
        accepted, changed = service_status.immutable_changes(body)
        try:
            validated, topology = self._understood(body)
            if changed is not None:
                raise changed
        except InvalidSpecError as exc:
            # An immutable field changed: nothing is touched (a renamed service would get a second topology).
            await self._let_go()
            reason = "InvalidSpec" if changed is None else "ImmutableFieldChanged"
            decision = service_status.conclude_invalid(body, exc, _now(), self._conditions, reason)
            self.context.metrics.count_reconcile(False)
            await self._write(body, decision.status_patch, decision.annotations, decision.events, annotate)
            return
        remembered = {service_status.ACCEPTED_IMMUTABLE_ANNOTATION: json.dumps(accepted, sort_keys=True)}
        self._service = validated.service_name
        previous = service_status.declared_entities(body)
        broker, failure = await self._broker_for(validated)
        if broker is None:
            outcome = Outcome(topology, failure=failure[0], failure_message=failure[1])
        else:
            outcome = await declaring.declare(broker, topology, previous)
        workers = dataclasses.replace(
            await self._workers_outcome(body, validated, pods), heal_after_seconds=self._heal_after(validated)
        )
        decision = service_status.conclude(body, outcome, _now(), workers, self._conditions)
        ready = conditions.find(decision.status_patch.get("conditions", []), conditions.READY) or {}
        self.context.metrics.count_reconcile(ready.get("status") == "True")
        await self._follow_events(validated, broker)
        status, events = dict(decision.status_patch), list(decision.events)
        if self._refreshed_at is None and broker is not None:  # the first time, counters come with the conditions
            counted, counted_events = await self._counters(body, validated, topology, broker, pods)
            status |= counted
            events += counted_events
        status["conditions"], monitoring_events = self._monitoring_conditions(
            status["conditions"], body, validated, broker
        )
        await self._write(body, status, {**decision.annotations, **remembered}, (*events, *monitoring_events), annotate)

    async def status_pass(self, body: Mapping[str, Any], pods: ServicePods) -> None:
        """Queue lengths into status, the autoscaling decision, the consumer's condition."""
        async with self.lock:
            try:
                validated, topology = self._understood(body)
            except InvalidSpecError:
                return  # the reconcile reports it
            broker = self._broker
            if broker is None:
                return  # no usable broker settings: the reconcile reports why
            status, events = await self._counters(body, validated, topology, broker, pods)
            events += await self._heal(validated, pods)
            if self._conditions is not None:
                status["conditions"], monitoring_events = self._monitoring_conditions(
                    self._conditions, body, validated, broker
                )
                events += monitoring_events
            await self._write(body, status, {}, events)
            if broker.events.login_refused:
                self.resync_requested.set()  # the Secret may have been rotated: read it again now

    def _heal_after(self, validated: Validated) -> int | None:
        """Seconds after which a pod without the current settings is evicted; None: never. Only an operator
        that serves the webhook heals (without it, no pod carries the settings hash)."""
        workers = validated.spec.workers
        if self.context.options.webhook is None or workers is None or not workers.heal_unconfigured_pods:
            return None
        return workers.heal_after_seconds

    async def _heal(self, validated: Validated, pods: ServicePods) -> tuple[EventNote, ...]:
        """Evict the next pod that runs without the current settings, if one is due."""
        heal_after, workers = self._heal_after(validated), validated.spec.workers
        if heal_after is None or workers is None or self._workers is None:
            return ()
        step = healing.next_step(
            self._healing,
            pods(validated.service_name),
            self._workers[2].config_hash,
            heal_old=workers.rollout_on_change,
            now=time.monotonic(),
            grace_seconds=heal_after,
        )
        if step.evict is None:
            return ()
        try:
            evicted = await self.context.kube.call(self.context.kube.api.evict_pod, self.namespace, step.evict)
        except KubeError as exc:
            healing.refused(self._healing)
            self._logger.warning("%s", exc)
            return ()
        if not evicted:
            healing.refused(self._healing)
            self._logger.info("eviction of pod %s refused for now (a PodDisruptionBudget); trying again", step.evict)
            return ()
        return (EventNote("Normal", "PodEvicted", f"evicted pod {step.evict}: {step.why}"),)

    async def _counters(
        self,
        body: Mapping[str, Any],
        validated: Validated,
        topology: plan.Topology,
        broker: Broker,
        pods: ServicePods,
    ) -> tuple[dict[str, Any], tuple[EventNote, ...]]:
        """The counter and replica fields of status (and the autoscaling decision, carried out)."""
        result = await queue_status.run_pass(
            self.context.kube,
            broker,
            dict(body),
            service=validated.service_name,
            spec=validated.spec,
            topology=topology,
            memory=self._scaler,
            now=time.monotonic(),
            scale_max_age=SCALE_READ_RESYNCS * self.context.options.resync_seconds,
            running=len(pods(validated.service_name)),
        )
        notes = result.events
        metrics = self.context.metrics.find(self.namespace, validated.service_name)
        if metrics is not None:
            if result.depths is not None:  # celery_queue_length & co.
                metrics.queue_length = {(depth.queue, depth.role): depth.waiting for depth in result.depths}
                metrics.queue_consumers = {d.queue: d.consumers for d in result.depths if d.role == "events"}
            metrics.replicas = result.status.get("replicas")
            # the autoscaler's or spec's wish, else what the workload itself asks for
            metrics.desired_replicas = result.status.get("desiredReplicas", self._scaler.scale)
            metrics.live_pods = lambda: (name for name, _ in pods(validated.service_name))  # hostnames kept
            metrics.overflow_reported, overflow = report.overflow_note(metrics.overflow_reported, metrics.overflowing())
            notes += (overflow,) if overflow is not None else ()
            now = time.monotonic()
            if now - self._swept_at >= SWEEP_SECONDS:
                self._swept_at = now
                gone = metrics.sweep([name for name, _ in pods(validated.service_name)], now, SILENCE_SECONDS)
                if gone:
                    self._logger.info("series of workers no longer seen removed: %s", ", ".join(gone))
        self.context.metrics.status_refreshed(self.namespace, self.name, validated.spec.status_interval_seconds)
        self._refreshed_at = time.monotonic()
        return dict(result.status), notes

    # --- the daemon's loop ------------------------------------------------------------------

    async def run(self, body: Mapping[str, Any], pods: ServicePods, stopped: Any) -> None:
        """Until `stopped`: resync every resync_seconds, status every statusIntervalSeconds, jittered."""
        resync_every = self.context.options.resync_seconds
        now = time.monotonic()
        next_resync = now + resync_every * random.uniform(0.5, 1.0)  # the change handler reconciled just now
        next_status = now + random.uniform(0.0, min(self._status_interval(body), 2.0))
        try:
            while not stopped:
                now = time.monotonic()
                if now >= next_resync or self.resync_requested.is_set():
                    self.resync_requested.clear()
                    if self._broker is not None and self._broker.events.login_refused:
                        self._forget_secret(body)
                    await self.reconcile(body, pods)
                    next_resync = time.monotonic() + resync_every * random.uniform(0.9, 1.1)
                if now >= next_status:
                    await self.status_pass(body, pods)
                    next_status = time.monotonic() + self._status_interval(body) * random.uniform(0.95, 1.05)
                wake_in = max(0.0, min(next_resync, next_status) - time.monotonic())
                waiters: set[asyncio.Future[Any]] = {
                    asyncio.ensure_future(self.resync_requested.wait()),
                    asyncio.ensure_future(stopped.wait(wake_in)),
                }
                try:
                    await asyncio.wait(waiters, timeout=wake_in, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
        finally:
            await self.close()

    def _status_interval(self, body: Mapping[str, Any]) -> float:
        value = ((body.get("spec") or {}).get("statusIntervalSeconds")) or 15
        return float(value) if isinstance(value, int | float) and value > 0 else 15.0

    def _forget_secret(self, body: Mapping[str, Any]) -> None:
        ref = ((body.get("spec") or {}).get("broker") or {}).get("secretRef") or {}
        if isinstance(ref.get("name"), str):
            self.context.secrets.forget(self.namespace, ref["name"])

    async def delete_entities(self, body: Mapping[str, Any]) -> Outcome | None:
        """`deletionPolicy: delete`: the service's empty queues and exchanges removed (None: never acted on)."""
        try:
            validated = service_status.validate(body)
        except InvalidSpecError:
            return None
        topology = plan.plan(validated.service_name, validated.spec)
        try:
            settings = await self.context.secrets.settings(self.namespace, validated.spec)
            broker = self.context.brokers.acquire(settings)
        except ManagementURLRejectedError as exc:
            return Outcome(topology, failure="ManagementURLRejected", failure_message=str(exc))
        except BrokerSecretError as exc:
            return Outcome(topology, failure="BrokerSecretInvalid", failure_message=str(exc))
        try:
            return await declaring.declare(broker, topology, service_status.declared_entities(body), remove=True)
        finally:
            await self.context.brokers.release(broker)

    async def close(self) -> None:
        """The resource is gone (or the operator stops): its consumer, broker and series let go."""
        async with self.lock:
            await self._let_go()
            if self._service is not None:
                self.context.metrics.remove(self.namespace, self._service)
            self.context.metrics.forget_status(self.namespace, self.name)

    # --- parts ------------------------------------------------------------------------------

    def _understood(self, body: Mapping[str, Any]) -> tuple[Validated, plan.Topology]:
        """The validated spec and its plan, worked out once per generation (InvalidSpecError as validate)."""
        found = self._by_generation.get(body, lambda: _validated_and_planned(body))
        if isinstance(found, InvalidSpecError):
            raise found
        return found

    async def _broker_for(self, validated: Validated) -> tuple[Broker | None, tuple[FailureReason, str]]:
        """The broker of the service's current settings (switching when the Secret changed)."""
        try:
            settings: BrokerSettings = await self.context.secrets.settings(self.namespace, validated.spec)
            if self._broker is not None and self._broker.key == settings.key:
                return self._broker, ("BrokerUnreachable", "")
            broker = self.context.brokers.acquire(settings)
        except ManagementURLRejectedError as exc:
            await self._let_go()
            return None, ("ManagementURLRejected", str(exc))
        except BrokerSecretError as exc:
            await self._let_go()
            return None, ("BrokerSecretInvalid", str(exc))
        if self._broker is not None:
            self._logger.info("broker settings of %s changed: moving to %s", self.name, broker.display)
        await self._let_go()
        self._broker = broker
        return broker, ("BrokerUnreachable", "")

    async def _let_go(self) -> None:
        if self._subscription is not None and self._broker is not None:
            self._broker.events.unsubscribe(self._subscription)
        self._subscription = None
        if self._broker is not None:
            broker, self._broker = self._broker, None
            await self.context.brokers.release(broker)

    async def _follow_events(self, validated: Validated, broker: Broker | None) -> None:
        """Consume the service's Celery events from its broker while monitoring is on."""
        service = validated.service_name
        if broker is None or not validated.spec.monitoring.enabled:
            if self._subscription is not None and self._broker is not None:
                self._broker.events.unsubscribe(self._subscription)
                self._subscription = None
                self.context.metrics.remove(self.namespace, service)
            return
        monitoring = validated.spec.monitoring
        metrics = self.context.metrics.service(
            self.namespace, service, monitoring.per_pod_task_series, monitoring.max_task_names
        )
        # queue_name of the handlers' task events (none of which says the queue it was consumed from)
        metrics.handler_queues = {h.name: handler_queue_name(service, h.name) for h in validated.spec.events.handlers}
        queue = monitor_queue_name(service)
        if self._subscription is not None and self._subscription.queue == queue:
            return
        if self._subscription is not None:
            broker.events.unsubscribe(self._subscription)
        self._subscription = broker.events.subscribe(
            f"{self.namespace}/{service}", queue, event_exchange_name(service), metrics
        )

    def _monitoring_conditions(
        self, current: list[dict[str, Any]], body: Mapping[str, Any], validated: Validated, broker: Broker | None
    ) -> tuple[list[dict[str, Any]], tuple[EventNote, ...]]:
        subscription = self._subscription
        problem = subscription.problem if subscription is not None else None
        if broker is None:
            problem = "no usable broker settings (see BrokerReachable)"
        # A broker that cannot be reached is announced by BrokerReachable, and a consumer still connecting is no
        # problem: only the consumer's own failures are Events, and a recovery only after an announced failure.
        own_failure = (
            problem is not None
            and broker is not None
            and problem not in (broker.events.problem, Subscription.CONNECTING)
        )
        announce = own_failure if problem is not None else self._monitoring_announced
        self._monitoring_announced = own_failure or (problem is not None and self._monitoring_announced)
        return service_status.conclude_monitoring(
            current,
            (body.get("metadata") or {}).get("generation"),
            _now(),
            enabled=validated.spec.monitoring.enabled,
            problem=problem,
            announce=announce,
        )

    async def _workers_outcome(
        self, body: Mapping[str, Any], validated: Validated, pods: ServicePods
    ) -> WorkersOutcome:
        generation = (body.get("metadata") or {}).get("generation")
        now = time.monotonic()
        if self._workers is not None:
            checked_generation, checked_at, outcome = self._workers
            if checked_generation == generation and now - checked_at < WORKERS_CHECK_SECONDS:
                counted = injection.count_pods(outcome.config_hash, (h for _, h in pods(validated.service_name)))
                return dataclasses.replace(outcome, pods=counted.pods, pods_current=counted.pods_current, stamped=None)
        outcome = await injection.sync(
            self.context.kube,
            owner=dict(body),
            service=validated.service_name,
            spec=validated.spec,
            pod_hashes=(config_hash for _, config_hash in pods(validated.service_name)),
        )
        self._workers = (generation, now, outcome) if outcome.configmap_error is None else None
        return outcome

    async def _write(
        self,
        body: Mapping[str, Any],
        status: dict[str, Any],
        annotations: Mapping[str, str],
        events: Iterable[EventNote],
        annotate: Annotate | None = None,
    ) -> None:
        """Patch the status fields that differ from what the resource shows (and from what was just sent);
        annotations go to `annotate` when given (a change handler's own patch: one write less)."""
        if "conditions" in status:
            self._conditions = status["conditions"]
        now = time.monotonic()
        changed = _unseen(status, body.get("status") or {}, self._sent, now)
        annotations_changed = _unseen(
            annotations, (body.get("metadata") or {}).get("annotations") or {}, self._annotations_sent, now
        )
        try:
            if changed:
                await self.context.kube.call(
                    self.context.kube.api.patch_service_status, self.namespace, self.name, changed
                )
                self._sent |= {field: (value, now) for field, value in changed.items()}
            if annotations_changed and annotate is not None:
                annotate(annotations_changed)
            elif annotations_changed:
                await self.context.kube.call(
                    self.context.kube.api.patch_service_metadata, self.namespace, self.name, annotations_changed
                )
            self._annotations_sent |= {key: (value, now) for key, value in annotations_changed.items()}
        except KubeError as exc:
            self._logger.warning("status of %s/%s not written: %s", self.namespace, self.name, exc)
            self._sent.clear()
        events = tuple(events)
        if events:
            self.post(events)


def _unseen(
    wanted: Mapping[str, Any], observed: Mapping[str, Any], sent: dict[str, tuple[Any, float]], now: float
) -> dict[str, Any]:
    """The fields of `wanted` the resource does not show, except those sent a moment ago (the watch has not
    brought them back yet); what the resource shows is forgotten from `sent`."""
    changed = {}
    for field, value in wanted.items():
        if observed.get(field) == value:
            sent.pop(field, None)
            continue
        previous = sent.get(field)
        if previous is not None and previous[0] == value and now - previous[1] < RESEND_SECONDS:
            continue
        changed[field] = value
    return changed


def _validated_and_planned(body: Mapping[str, Any]) -> tuple[Validated, plan.Topology] | InvalidSpecError:
    try:
        validated = service_status.validate(body)
    except InvalidSpecError as exc:
        return exc
    return validated, plan.plan(validated.service_name, validated.spec)
