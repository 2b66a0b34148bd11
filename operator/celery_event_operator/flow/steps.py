"""The I/O steps of a service's passes: each asks the broker or the Kubernetes API one thing (through the
ports) and returns what it observed, never raising for a failure the status should show."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from celery_event_operator.core import naming
from celery_event_operator.core.api import conditions
from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.api.models import AutoscalingStatus
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import (
    BrokerUnavailableError,
    KubeError,
    KubeUnavailableError,
    ManagementUnavailableError,
    OperatorError,
)
from celery_event_operator.core.injection import healing
from celery_event_operator.core.lifecycle import consumers, costs, long_tasks, stuck
from celery_event_operator.core.lifecycle import grace as graces
from celery_event_operator.core.lifecycle.grace import Grace
from celery_event_operator.core.lifecycle.stuck import StuckMemory
from celery_event_operator.core.monitoring.consumer import CONNECTING, EventsSubscription
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.scaling import policy, wait_policy, wishes
from celery_event_operator.core.scaling.depths import counters
from celery_event_operator.core.scaling.load import LoadSample
from celery_event_operator.core.scaling.wait_policy import WaitObservations
from celery_event_operator.core.service.observations import (
    Evicted,
    LifecycleSeen,
    MonitoringSeen,
    QueuesSeen,
    Scaled,
    ScalingSeen,
)
from celery_event_operator.core.service.ownership import Claim, Claimant, shown_ours
from celery_event_operator.core.service.pods import WorkerPod
from celery_event_operator.core.service.spec import Understood
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import exchange_arguments, not_as_planned
from celery_event_operator.core.topology.outcome import DeclareOutcome, Report
from celery_event_operator.core.topology.plan import Topology
from celery_event_operator.flow.ports import ClusterAccess, ServiceBroker

# At most this many pods' deletion costs are patched per service and pass (the rest in the next passes); one sent
# is not sent again before the watch brought it back or this long passed.
COST_WRITES_PER_PASS = 20
COST_RESEND_SECONDS = 30.0


@dataclasses.dataclass
class ScalerMemory:
    """What one service's scaling remembers between passes (in the operator's memory only)."""

    history: tuple[policy.Recommendation, ...] | None = None  # the autoscaler's recommendations
    scale: int | None = None  # the workload's desired replicas (its /scale), as last read
    scale_read_at: float = -float("inf")
    # The wait target's: its load samples, the last runtime measured, and what status.autoscaling shows (with the
    # recommendation and basis it was decided on, and when).
    samples: tuple[LoadSample, ...] = ()
    runtime: float | None = None
    shown: tuple[AutoscalingStatus, tuple[int, str], float] | None = None
    slots_seen: int = 0  # the most tasks one worker was seen running at once (when no slots are reported or set)


@dataclasses.dataclass
class DeclareMemory:
    """The plan last declared on the service's broker with nothing refused and nothing left to drain (None: none
    yet, or the last declare was not so): only then may a resync find it intact in the broker's listing."""

    clean: Topology | None = None


def shown_unchanged(
    broker: ServiceBroker,
    topology: Topology,
    declared: Declared,
    claimant: Claimant,
    *,
    memory: DeclareMemory,
    max_age: float,
) -> bool:
    """Whether a resync may leave the claim and the plan as they are, asking the broker nothing: both shown exactly
    as declared by a listing no older than `max_age` (never waited for), the plan's last declare by this keeper
    clean, nothing obsolete left, and an AMQP connection to the broker open (BrokerReachable stays the truth). Both
    or neither: a claim confirmed only by a listing never precedes a declare."""
    if memory.clean != topology or declared.obsolete(topology) or not broker.events.connected:
        return False
    listed = broker.listed(max_age)
    if listed is None:
        return False
    claim_exchange = exchange_arguments(listed, naming.owner_exchange_name(topology.service), "fanout")
    return shown_ours(claim_exchange, claimant) and not not_as_planned(topology, listed)


async def declare(
    broker: ServiceBroker | None,
    unusable: OperatorError | None,
    topology: Topology,
    declared: Declared,
    *,
    remove: bool = False,
    unchanged: bool = False,
    memory: DeclareMemory | None = None,
) -> DeclareOutcome:
    """The topology applied (or removed) on the broker; the failure when there is no usable broker; nothing asked
    when `unchanged` (shown_unchanged). `memory` keeps whether it was declared clean."""
    if broker is None:
        return DeclareOutcome(topology, failure=unusable)
    if unchanged:
        return DeclareOutcome(topology, broker.display, report=Report())
    try:
        report = await broker.declare(topology, declared, remove=remove)
    except OperatorError as exc:
        if memory is not None:
            memory.clean = None
        return DeclareOutcome(topology, broker.display, exc)
    if memory is not None:
        memory.clean = topology if not report.problems and not report.kept else None
    return DeclareOutcome(topology, broker.display, report=report)


async def claim(broker: ServiceBroker, service: str, claimant: Claimant) -> Claim | OperatorError:
    """The claim on the service's topology, made (or confirmed) before anything of it is touched; the failure when
    the broker could not be asked."""
    try:
        return await broker.claim(service, claimant)
    except OperatorError as exc:
        return exc


async def claim_at_deletion(broker: ServiceBroker, service: str, claimant: Claimant) -> Claim | OperatorError:
    """The claim confirmed before a deletion removes anything (fresh: nobody held it); the failure when the broker
    could not be asked."""
    try:
        return await broker.claim_at_deletion(service, claimant)
    except OperatorError as exc:
        return exc


async def release(broker: ServiceBroker, service: str, claimant: Claimant) -> Claim | OperatorError:
    """The service's claim released when it is ours (its entities removed or kept before); the failure when the
    broker could not be asked."""
    try:
        return await broker.release(service, claimant)
    except OperatorError as exc:
        return exc


async def queues(broker: ServiceBroker, topology: Topology, max_age: float) -> QueuesSeen:
    try:
        depths, source = await broker.depths(topology, max_age)
    except BrokerUnavailableError as exc:
        return QueuesSeen(None, problem=str(exc))
    return QueuesSeen(depths, source)


async def scale_workers(
    cluster: ClusterAccess,
    namespace: str,
    understood: Understood,
    *,
    queues: QueuesSeen,
    running: int,
    memory: ScalerMemory,
    now: float,
    scale_max_age: float,
    observed: WaitObservations | None = None,
    measured_wait: tuple[float, int] | None = None,
) -> ScalingSeen:
    """The workers' replicas: the workload's scale read (at most every `scale_max_age` seconds, and again before
    any change), the wish of the autoscaler or of spec.workers.replicas, and the change made. Nothing is decided
    from missing data: when the queues cannot be read, replicas stay where they are."""
    seen = ScalingSeen(selector=f"{SERVICE_LABEL}={understood.service}", workload=memory.scale)
    workers = understood.spec.workers
    if queues.depths is None or workers is None:
        return seen
    target = workers.scale_target_ref
    try:
        if memory.scale is None or now - memory.scale_read_at > scale_max_age:
            await _read_scale(cluster, namespace, understood, memory, now)
    except KubeUnavailableError:
        if memory.scale is None:
            return seen  # the API did not answer: nothing decided, asked again next pass
    except KubeError as exc:
        return dataclasses.replace(seen, scale_problem=str(exc))
    seen = dataclasses.replace(seen, scale_checked=True, workload=memory.scale)
    if memory.scale is None:
        return seen  # the reconcile reports the missing target
    current = memory.scale
    queue_length = counters(queues.depths)["queueLength"]
    wish = wishes.wish(
        understood.spec, queue_length, current, memory.history, now, counted=queues.source, observed=observed
    )
    seen = dataclasses.replace(seen, replicas=running)
    if wish is None:
        return seen
    memory.history = wish.history
    seen = dataclasses.replace(seen, desired=wish.recommended)
    if wish.estimate is not None:
        _show(memory, understood, wish, measured_wait, now)
        shown = memory.shown[0] if memory.shown is not None else None
        seen = dataclasses.replace(seen, autoscaling=shown, estimated_wait=wish.estimate.wait)
    if wish.replicas == current:
        return seen
    try:
        if memory.scale_read_at != now:  # read before this pass: decide on the workload's count as it is now
            await _read_scale(cluster, namespace, understood, memory, now)
        if memory.scale is None or memory.scale == wish.replicas:
            return dataclasses.replace(seen, workload=memory.scale)
        current = memory.scale
        await cluster.set_scale(namespace, target, wish.replicas)
    except KubeUnavailableError:
        return seen  # the API did not answer: no change made, decided again next pass
    except KubeError as exc:
        return dataclasses.replace(seen, failed=str(exc))
    memory.scale = wish.replicas
    at = conditions.timestamp(datetime.datetime.now(tz=datetime.UTC))
    scaled = Scaled(f"{target.kind}/{target.name}", current, wish.replicas, wish.why, at)
    return dataclasses.replace(seen, workload=wish.replicas, scaled=scaled)


# status.autoscaling changes with every pass's figures: it is written when the decision changes, else this often.
SHOWN_SECONDS = 60.0


def _show(
    memory: ScalerMemory,
    understood: Understood,
    wish: wishes.Wish,
    measured_wait: tuple[float, int] | None,
    now: float,
) -> None:
    """What status.autoscaling shows: anew at a change of the decision (the recommendation, what it is based on, the
    target, the slots), else at most every SHOWN_SECONDS and only when a figure changed (decidedAt alone writes no
    status)."""
    target = understood.spec.autoscaling.target_wait_seconds
    assert wish.estimate is not None
    assert target is not None
    shown = memory.shown
    at = conditions.timestamp(datetime.datetime.now(tz=datetime.UTC))
    figures = wait_policy.shown(wish.estimate, measured_wait, target, wish.why, at)
    if shown is not None:
        previous, decided, shown_at = shown
        decided_alike = (
            decided == (wish.recommended, wish.estimate.basis)
            and previous.target_wait_seconds == target
            and previous.slots_per_pod == figures.slots_per_pod
        )
        if decided_alike and (
            now - shown_at < SHOWN_SECONDS or figures.model_copy(update={"decided_at": previous.decided_at}) == previous
        ):
            return
    memory.shown = (figures, (wish.recommended, wish.estimate.basis), now)


async def _read_scale(
    cluster: ClusterAccess, namespace: str, understood: Understood, memory: ScalerMemory, now: float
) -> None:
    assert understood.spec.workers is not None
    memory.scale = await cluster.read_scale(namespace, understood.spec.workers.scale_target_ref)
    memory.scale_read_at = now


async def alarms(broker: ServiceBroker, max_age: float) -> tuple[Alarm, ...] | None:
    """The broker's resource alarms in effect; None when they cannot be seen (no management API)."""
    try:
        return await broker.alarms(max_age)
    except ManagementUnavailableError:
        return None


def monitoring(enabled: bool, subscription: EventsSubscription | None, broker: ServiceBroker | None) -> MonitoringSeen:
    """Whether the service's events are consumed, and whether a failure is the consumer's own."""
    if broker is None:
        return MonitoringSeen(enabled, "no usable broker settings (see BrokerReachable)")
    problem = subscription.problem if subscription is not None else None
    own = problem is not None and problem not in (broker.events.problem, CONNECTING)
    return MonitoringSeen(enabled, problem, own)


@dataclasses.dataclass
class LifecycleMemory:
    """What one service's worker lifecycle remembers between passes."""

    stuck: StuckMemory = dataclasses.field(default_factory=StuckMemory)
    costs_sent: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)  # pod → cost, when
    looked_at: set[str] = dataclasses.field(default_factory=set)  # pods whose written deletion cost was believed
    lower_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pods wanting less than is written


async def keep_lifecycle(
    cluster: ClusterAccess,
    broker: ServiceBroker,
    namespace: str,
    understood: Understood,
    *,
    pods: list[WorkerPod],
    metrics: ServiceMetrics | None,
    memory: LifecycleMemory,
    queues: QueuesSeen,
    events_consumed: bool,
    alarms: tuple[Alarm, ...] | None,
    config_hash: str | None,
    now: float,
    logger: logging.Logger | Any,
) -> LifecycleSeen | None:
    """The workers' deletion costs kept from the tasks they run, and the stuck ones found (None: the service has
    no workers to keep). Nothing is judged on what is unknown: the queues, the heartbeats, the current settings."""
    spec, workers = understood.spec, understood.spec.workers
    if workers is None:
        return None
    limit = stuck.task_limit(
        workers.max_task_runtime_seconds, workers.celery.time_limit_seconds if workers.celery is not None else None
    )
    running = [pod for pod in pods if pod.running]
    facts: dict[str, stuck.PodFacts] = {}
    unlisted: str | None = None
    if metrics is not None:
        _believe_written_costs(metrics, running, memory, now)
        if events_consumed:
            facts, unlisted = await _observe_pods(broker, namespace, understood, running, metrics, limit=limit, now=now)
    wanted, hung = (
        _deletion_costs(running, metrics, limit, now) if metrics is not None and events_consumed else ({}, set())
    )
    written = 0
    if workers.set_deletion_cost and wanted:
        written = await _keep_deletion_costs(
            cluster, namespace, pods, wanted, hung=hung, memory=memory, now=now, logger=logger
        )
    else:
        memory.lower_since.clear()  # no cost kept this pass: a hold timed before is no hold now
    current = (config_hash, None)  # a pod admitted without settings (no hash) is judged too
    candidates = [pod for pod in running if config_hash is not None and pod.config_hash in current]
    unchecked = stuck.unchecked_because(
        monitored=spec.monitoring.enabled and metrics is not None,
        queues_problem=(queues.problem or "not counted") if queues.depths is None else None,
        settings_known=config_hash is not None,
        events_consumed=events_consumed,
        alarmed=bool(alarms),
    )
    # Judged unchecked too: what is unknown now resets what was being counted (silence counts afresh after it).
    judgement = stuck.judge(
        memory.stuck,
        [facts[pod.name] for pod in candidates if pod.name in facts],
        waiting=counters(queues.depths)["queueLength"] if queues.depths is not None else 0,
        heartbeats_known=unchecked is None,
        now=now,
        threshold=workers.stuck_after_seconds,
        limit=limit,
        unlisted=unlisted,
    )
    return LifecycleSeen(
        judgement,
        workers.stuck_after_seconds,
        unchecked=unchecked or judgement.unchecked,
        costs_written=written,
        busy=_busy(pods, wanted, memory),
    )


def grace(understood: Understood, metrics: ServiceMetrics | None, now: float) -> Grace | None:
    """The grace period the service's new worker pods get for their tasks (None: the service has no workers)."""
    workers = understood.spec.workers
    if workers is None:
        return None
    elapsed = [age for ages in metrics.running.elapsed(now).values() for age in ages] if metrics is not None else []
    return graces.grace(
        max_task_runtime=workers.max_task_runtime_seconds,
        time_limit=workers.celery.time_limit_seconds if workers.celery is not None else None,
        observed=metrics.runtimes.percentile(graces.PERCENTILE, now) if metrics is not None else None,
        longest_running=max(elapsed, default=None),
        maximum=workers.max_grace_period_seconds,
    )


def run_once(
    understood: Understood,
    broker: ServiceBroker,
    metrics: ServiceMetrics | None,
    *,
    grace: Grace | None,
    broker_timeout: int,
    now: float,
) -> long_tasks.RunOnce | None:
    """Do the service's tasks run once: the re-runs seen lately, and the runtimes against the broker's
    acknowledgement timeout in effect (which the events path is told, to name a re-run's cause). None: no events."""
    if metrics is None:
        return None
    asked = long_tasks.consumer_timeout_seconds(understood.spec.workers)
    timeout = long_tasks.ack_timeout(broker.version, broker_timeout, asked, understood.spec.queue_type)
    metrics.ack_timeout_seconds = timeout.seconds
    return long_tasks.run_once(
        metrics.reruns.since(now - long_tasks.RECENT_SECONDS),
        timeout=timeout,
        observed=metrics.runtimes.percentile(graces.PERCENTILE, now),
        grace=grace.seconds if grace is not None else None,
    )


async def _observe_pods(
    broker: ServiceBroker,
    namespace: str,
    understood: Understood,
    pods: list[WorkerPod],
    metrics: ServiceMetrics,
    *,
    limit: stuck.TaskLimit | None,
    now: float,
) -> tuple[dict[str, stuck.PodFacts], str | None]:
    """What the events say of each Running pod, and what the broker says: its consumers (listed once per vhost and
    half interval) and, when a judgement rests on it (a pod quiet, never heard, believed busy, or running a task past
    its limit), the deliveries it holds — which show a task its events do not, and fed back into what it runs. And
    why the broker said nothing, when it did not."""
    max_age = understood.spec.status_interval_seconds / 2
    facts = [_facts(pod, metrics) for pod in pods]
    try:
        listed = await broker.consumers(max_age)
        handler_queues = frozenset(q.name for q in understood.topology.queues if q.role == "events")
        control = naming.control_exchange_name(understood.service)
        seen = consumers.on_broker(listed, handler_queues, pods, namespace, control)
        facts = [dataclasses.replace(found, broker=seen[found.name]) for found in facts]
        if any(_needs_holdings(found, limit, now) for found in facts):
            holdings = await broker.holdings(min(max_age, stuck.HOLDINGS_MAX_AGE_SECONDS))
            held = consumers.unacknowledged(holdings, pods, namespace)
            for pod in pods:
                deliveries = held[pod.name]
                if deliveries is not None:
                    metrics.running.holds(pod.name, deliveries, since=metrics.last_heard.get(pod.name, now), now=now)
            facts = [dataclasses.replace(_facts(pod, metrics), broker=seen[pod.name], unacknowledged=held[pod.name])
                     for pod in pods]  # fmt: skip
    except ManagementUnavailableError as exc:
        return {found.name: found for found in facts}, str(exc)  # judged on the events alone
    return {found.name: found for found in facts}, None


def _needs_holdings(pod: stuck.PodFacts, limit: stuck.TaskLimit | None, now: float) -> bool:
    quiet = pod.last_heard is None or now - pod.last_heard > 2 * stuck.HEARTBEAT_SECONDS
    return quiet or pod.unseen_since is not None or bool(stuck.overdue(pod.tasks, limit, now))


def _facts(pod: WorkerPod, metrics: ServiceMetrics) -> stuck.PodFacts:
    """What the service's events say of a pod."""
    unseen = metrics.running.unseen(pod.name)
    return stuck.PodFacts(
        pod.name,
        template=pod.template,
        tasks=tuple(metrics.running_tasks(pod.name)),
        unseen_since=unseen[2] if unseen is not None else None,
        last_heard=metrics.last_heard.get(pod.name),
        first_heard=metrics.first_heard.get(pod.name),
        last_heartbeat=metrics.last_heartbeat.get(pod.name),
    )


def _believe_written_costs(metrics: ServiceMetrics, pods: list[WorkerPod], memory: LifecycleMemory, now: float) -> None:
    """A pod first looked at whose deletion cost says it is busy (written before an operator restart, by this
    operator or another writer) runs a task the events did not show starting: believed until they, or the broker,
    say otherwise."""
    now_seen = {pod.name for pod in pods}
    for pod in pods:
        if pod.name in memory.looked_at:
            continue
        cost = costs.parsed(pod.deletion_cost)
        if cost > 0:
            metrics.running.assume_busy(pod.name, now - costs.least_running_seconds(cost))
    memory.looked_at = now_seen


def _deletion_costs(
    pods: list[WorkerPod], metrics: ServiceMetrics, limit: stuck.TaskLimit | None, now: float
) -> tuple[dict[str, int], set[str]]:
    """Each Running pod's deletion cost from the tasks it runs, and the pods running a task past its limit (hung:
    no work to keep)."""
    wanted, hung = {}, set()
    for pod in pods:
        tasks = metrics.running.tasks(pod.name)
        late = {task.uuid for task in stuck.overdue(tasks, limit, now)}
        ages = [now - task.started_at for task in tasks if task.uuid not in late]
        unseen = metrics.running.unseen(pod.name)
        unseen_late = unseen is not None and limit is not None and now - unseen[2] > limit.seconds
        if unseen is not None and not unseen_late:
            ages.append(now - unseen[1])
        wanted[pod.name] = costs.deletion_cost(ages)
        if late or unseen_late:
            hung.add(pod.name)
    return wanted, hung


def _busy(pods: list[WorkerPod], wanted: dict[str, int], memory: LifecycleMemory) -> frozenset[str]:
    """The pods whose deletion cost says they are busy: as the events say it now, or as it is written (the cost just
    sent, else the pod's annotation, whoever wrote it) unless it is kept only until a lower one has held a
    while."""
    written = {pod.name: costs.parsed(pod.deletion_cost) for pod in pods}
    written |= {pod: cost for pod, (cost, _) in memory.costs_sent.items()}
    written = {pod: cost for pod, cost in written.items() if pod not in memory.lower_since}
    return frozenset(pod.name for pod in pods if max(wanted.get(pod.name, 0), written.get(pod.name, 0)) > 0)


async def _keep_deletion_costs(
    cluster: ClusterAccess,
    namespace: str,
    pods: list[WorkerPod],
    wanted: dict[str, int],
    *,
    hung: set[str],
    memory: LifecycleMemory,
    now: float,
    logger: logging.Logger | Any,
) -> int:
    """Patch the pods whose deletion cost changed (a bounded number per pass; lowered once the lower cost has held a
    while); the number patched."""
    current = {pod.name: pod.deletion_cost for pod in pods}
    for pod, (cost, at) in list(memory.costs_sent.items()):
        if pod not in wanted or current.get(pod) == str(cost) or now - at > COST_RESEND_SECONDS:
            del memory.costs_sent[pod]  # seen back (or gone, or long ago): the pod's own annotation counts
        else:
            current[pod] = str(cost)  # sent a moment ago; the watch has not brought it back yet
    wanted, memory.lower_since = costs.held(wanted, current, hung, memory.lower_since, now)
    written = 0
    for pod, cost in costs.costs_to_write(wanted, current, limit=COST_WRITES_PER_PASS).items():
        try:
            await cluster.annotate_pod(namespace, pod, {DELETION_COST_ANNOTATION: str(cost)})
        except KubeError as exc:
            logger.warning("%s", exc)
            continue
        memory.costs_sent[pod] = (cost, now)
        written += 1
    return written


async def heal(
    cluster: ClusterAccess,
    namespace: str,
    memory: healing.HealingMemory,
    pods: list[WorkerPod],
    config_hash: str | None,
    *,
    stuck: dict[str, str],
    busy: frozenset[str],
    heal_old: bool,
    grace_seconds: int,
    now: float,
    logger: logging.Logger | Any,
) -> Evicted | None:
    """Evict the next pod that is stuck, or runs without the current settings (`config_hash` None: those are left
    alone), if one is due; never a busy one."""
    step = healing.next_step(
        memory,
        [(pod.name, pod.config_hash) for pod in pods],
        config_hash,
        heal_old=heal_old,
        now=now,
        grace_seconds=grace_seconds,
        stuck=stuck,
        busy=busy,
    )
    if step.evict is None:
        return None
    try:
        evicted = await cluster.evict_pod(namespace, step.evict)
    except KubeError as exc:
        healing.refused(memory)
        logger.warning("%s", exc)
        return None
    if not evicted:
        healing.refused(memory)
        logger.info("eviction of pod %s refused for now (a PodDisruptionBudget); trying again", step.evict)
        return None
    return Evicted(step.evict, step.why)
