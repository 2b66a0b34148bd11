"""What one resource keeps of its workers between passes, and the passes' steps that use it: the settings
ConfigMap and rollout stamp (checked per generation and every WORKERS_CHECK_SECONDS), the queue lengths and the
replicas (scaled when wished), the deletion costs and stuck workers (the lifecycle), and the evictions (healing)."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.injection import healing
from celery_event_operator.core.injection.outcome import WorkersOutcome, count_pods
from celery_event_operator.core.injection.settings import configmap_name
from celery_event_operator.core.lifecycle import stuck as stuck_memory
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.scaling import load
from celery_event_operator.core.scaling.depths import counters, counts_unacknowledged
from celery_event_operator.core.scaling.wait_policy import WaitObservations
from celery_event_operator.core.service.observations import Evicted, LifecycleSeen, QueuesSeen, ScalingSeen
from celery_event_operator.core.service.pods import PodsOf, WorkerPod
from celery_event_operator.core.service.spec import Understood
from celery_event_operator.flow import steps
from celery_event_operator.flow.ports import KeeperContext, ServiceBroker

# The workers' ConfigMap and rollout stamp are checked on every spec change and at least this often
# (not on every resync: two API reads per service and resync would dominate at a thousand services).
WORKERS_CHECK_SECONDS = 300.0
# The workload's desired replicas are read every this many resyncs (and before any change of them).
SCALE_READ_RESYNCS = 4
# A worker outside Kubernetes (no pod) that was not heard from this long is gone (Celery heartbeats every 2 s;
# task events count as signs of life too); workers are swept at most this often.
SILENCE_SECONDS = 300.0
SWEEP_SECONDS = 30.0


class Workers:
    def __init__(self, context: KeeperContext, namespace: str, logger: logging.Logger | Any) -> None:
        self.context = context
        self.namespace = namespace
        self._logger = logger
        self.checked: tuple[int | None, float, WorkersOutcome] | None = None  # generation, when, outcome
        self.scaler = steps.ScalerMemory()
        self.healing = healing.HealingMemory()
        self.lifecycle_memory = steps.LifecycleMemory()
        self._swept_at = time.monotonic()

    @property
    def config_hash(self) -> str | None:
        """The hash of the settings last checked (None: not checked yet)."""
        return self.checked[2].config_hash if self.checked is not None else None

    async def outcome(
        self, body: Mapping[str, Any], generation: int | None, understood: Understood, pods: PodsOf
    ) -> WorkersOutcome:
        """The ConfigMap and rollout stamp (checked per generation and every WORKERS_CHECK_SECONDS), the pods;
        `understood` is of `generation` (the body may hold a later one by now: kopf's watch keeps it current)."""
        now = time.monotonic()
        hashes = [pod.config_hash for pod in pods(understood.service)]
        if self.checked is not None:
            checked_generation, checked_at, outcome = self.checked
            if checked_generation == generation and now - checked_at < WORKERS_CHECK_SECONDS:
                counted = count_pods(outcome.config_hash, hashes)
                outcome = dataclasses.replace(
                    outcome, pods=counted.pods, pods_current=counted.pods_current, stamped=None
                )
                return self._delivered(outcome, understood)
        outcome = await self.context.cluster.sync_workers(
            owner=dict(body), service=understood.service, spec=understood.spec, pod_hashes=hashes
        )
        if outcome.unavailable is None:
            # A failure is checked again at the next pass: a workload created after its service (kubectl apply of
            # a folder, a Helm chart's order) is stamped then, not WORKERS_CHECK_SECONDS later.
            failed = outcome.configmap_error is not None or outcome.target_error is not None
            self.checked = None if failed else (generation, now, outcome)
        elif self.checked is not None and self.checked[0] != generation:
            self.checked = None  # the previous generation's hash must not judge the pods of this one
        return self._delivered(outcome, understood)

    def _delivered(self, outcome: WorkersOutcome, understood: Understood) -> WorkersOutcome:
        """How the pods get the settings: the webhook stamps them (and heals the others), or, with none, they mount
        the ConfigMap themselves and nothing tells which settings they run."""
        mounted_from = None if self.context.options.webhook is not None else configmap_name(understood.service)
        return dataclasses.replace(outcome, heal_after_seconds=self.heal_after(understood), mounted_from=mounted_from)

    def heal_after(self, understood: Understood) -> int | None:
        """Seconds after which a pod without the current settings is evicted; None: never. Only an operator
        that serves the webhook heals (without it, no pod carries the settings hash)."""
        workers = understood.spec.workers
        if self.context.options.webhook is None or workers is None or not workers.heal_unconfigured_pods:
            return None
        return workers.heal_after_seconds

    async def lifecycle(
        self,
        understood: Understood,
        broker: ServiceBroker,
        live: list[WorkerPod],
        queues: QueuesSeen,
        alarms: tuple[Alarm, ...] | None,
        *,
        events_consumed: bool,
    ) -> LifecycleSeen | None:
        """Deletion costs kept, stuck workers found."""
        metrics = self.context.metrics.find(self.namespace, understood.service)
        seen = await steps.keep_lifecycle(
            self.context.cluster,
            broker,
            self.namespace,
            understood,
            pods=live,
            metrics=metrics,
            memory=self.lifecycle_memory,
            queues=queues,
            events_consumed=events_consumed,
            alarms=alarms,
            config_hash=self.checked[2].config_hash if self.checked is not None else None,
            now=time.monotonic(),
            logger=self._logger,
        )
        if metrics is not None:
            judged = seen is not None and seen.unchecked is None
            metrics.stuck_workers = len(seen.stuck) if seen is not None and judged else None
            metrics.replacement_paused = (seen.judgement.paused is not None) if seen is not None and judged else None
        return seen

    async def heal(
        self, understood: Understood, live: list[WorkerPod], lifecycle: LifecycleSeen | None
    ) -> Evicted | None:
        """Evict the next stuck worker, or pod without the current settings, when one is due."""
        heal_after, workers = self.heal_after(understood), understood.spec.workers
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
            self.healing,
            live,
            self.checked[2].config_hash if heal_after is not None and self.checked is not None else None,
            stuck={pod: worker.why for pod, worker in stuck.items()},
            busy=lifecycle.busy if lifecycle is not None else frozenset(),
            heal_old=workers.rollout_on_change,
            grace_seconds=heal_after or workers.heal_after_seconds,
            now=now,
            logger=self._logger,
        )
        if evicted is not None and evicted.pod in stuck:
            stuck_memory.evicted(self.lifecycle_memory.stuck, stuck[evicted.pod], now)
        return evicted

    async def count(
        self, understood: Understood, broker: ServiceBroker, pods: PodsOf, live: list[WorkerPod]
    ) -> tuple[QueuesSeen, ScalingSeen]:
        """The queue depths and the workers' replicas (scaled when wished); recorded into the service's metrics."""
        spec = understood.spec
        queues = await steps.queues(broker, understood.topology, spec.status_interval_seconds / 2)
        now = time.monotonic()
        metrics = self.context.metrics.find(self.namespace, understood.service)
        observed = self._waiting(understood, queues, metrics, now)
        scaling = await steps.scale_workers(
            self.context.cluster,
            self.namespace,
            understood,
            queues=queues,
            running=len(live),
            memory=self.scaler,
            now=now,
            scale_max_age=SCALE_READ_RESYNCS * self.context.options.resync_seconds,
            observed=observed,
            measured_wait=(
                load.measured_wait(self.scaler.samples, metrics.queue_wait.bounds)
                if observed is not None and metrics is not None
                else None
            ),
        )
        self._record_metrics(understood.service, queues, scaling, [pod.name for pod in live])
        if metrics is not None:  # the hostnames its series keep: its live pods (the watched pods, read when needed)
            metrics.live_pods = lambda: (pod.name for pod in pods(understood.service))
        return queues, scaling

    def _waiting(
        self, understood: Understood, queues: QueuesSeen, metrics: ServiceMetrics | None, now: float
    ) -> WaitObservations | None:
        """What a wait target is judged by this pass (a load sample kept); None: no wait target, or the queues
        unread. While the events are not consumed the samples start afresh (a gap in them is no lull), and the tasks
        counted are those stamped since they did (the events read again after a reconnect were sent before)."""
        spec = understood.spec
        memory = self.scaler
        if not spec.autoscaling.enabled or spec.autoscaling.target_wait_seconds is None or metrics is None:
            memory.samples, memory.runtime, memory.shown, memory.slots_seen = (), None, None, 0
            if metrics is not None:
                metrics.load.since = math.inf
            return None
        if queues.depths is None:
            return None
        queue_length = counters(queues.depths)["queueLength"]
        running = metrics.running.count()
        slots = self._slots(understood, metrics)
        if not metrics.consumer_connected:
            memory.samples = ()
            return WaitObservations(None, memory.runtime, slots, queue_length, running, events_consumed=False)
        if not memory.samples:
            metrics.load.since = time.time()
        totals = metrics.load
        # The unacknowledged are running or prefetched by a worker: the running ones wait no more.
        backlog = max(0, queue_length - running) if counts_unacknowledged(queues.source) else queue_length
        sample = load.LoadSample(
            now, totals.sent, totals.started, totals.runtime_seconds, totals.runtimes, backlog, tuple(totals.waits)
        )
        memory.samples = load.kept(memory.samples, sample)
        measured = load.load(memory.samples, max(load.SHORT_SECONDS, 2.0 * spec.status_interval_seconds))
        if measured is not None and measured.runtime is not None:
            memory.runtime = measured.runtime
        return WaitObservations(measured, memory.runtime, slots, queue_length, running)

    def _slots(self, understood: Understood, metrics: ServiceMetrics) -> int:
        """Tasks one pod runs at once: as its pods report it, else as the spec sets it, else the most one worker was
        seen running at once (at least 1)."""
        reported = metrics.slots_per_pod()
        if reported is not None:
            return reported
        workers = understood.spec.workers
        celery = workers.celery if workers is not None else None
        if celery is not None and celery.concurrency is not None:
            return celery.concurrency
        running = metrics.running
        seen = max([1, *(len(running.tasks(worker)) for worker in running.workers())])
        self.scaler.slots_seen = max(self.scaler.slots_seen, seen)
        return self.scaler.slots_seen

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
        metrics.estimated_wait = scaling.estimated_wait
        now = time.monotonic()
        if now - self._swept_at >= SWEEP_SECONDS:
            self._swept_at = now
            gone = metrics.sweep(live, now, SILENCE_SECONDS)
            if gone:
                self._logger.info("series of workers no longer seen removed: %s", ", ".join(gone))
