"""The I/O steps of a pass, against fakes of the ports: what each reads, when, and what it observes."""

from __future__ import annotations

from typing import Any

import pytest

from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import BrokerRefusedError, KubeError, KubeUnavailableError
from celery_event_operator.core.injection import healing
from celery_event_operator.core.lifecycle import costs
from celery_event_operator.core.lifecycle.consumers import Consumer, Holding
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.scaling.load import Load
from celery_event_operator.core.scaling.wait_policy import WaitObservations
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.observations import QueuesSeen
from celery_event_operator.core.service.pods import WorkerPod
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.flow import steps
from tests.unit.flow.fakes import FakeBroker, FakeCluster, RecordingLogger, resource

ALARM = Alarm("memory", "rabbit@broker-0")
QUEUES = QueuesSeen((QueueDepth("billing.order", "events", 60, 1),), "ready + unacknowledged")


def understood(**spec: Any) -> specs.Understood:
    found = specs.understand(resource(**spec))
    assert isinstance(found, specs.Understood)
    return found


async def scale(cluster: FakeCluster, memory: steps.ScalerMemory, now: float, **spec: Any) -> Any:
    return await steps.scale_workers(
        cluster, "shop", understood(**spec), queues=QUEUES, running=1, memory=memory, now=now, scale_max_age=60.0
    )


async def test_the_workloads_scale_is_read_when_due_and_again_before_a_change() -> None:
    cluster, memory = FakeCluster(resource()), steps.ScalerMemory()
    seen = await scale(cluster, memory, 0.0)
    assert (seen.replicas, seen.workload, seen.desired, seen.scaled) == (1, 1, None, None)
    await scale(cluster, memory, 30.0)
    assert cluster.made("read_scale") == [("read_scale", "billing-worker")], "not read again within its age"
    seen = await scale(cluster, memory, 40.0, workers={**resource()["spec"]["workers"], "replicas": 4})
    assert cluster.made("read_scale") == [("read_scale", "billing-worker")] * 2, "read again before a change"
    assert cluster.made("set_scale") == [("set_scale", "billing-worker", 4)]
    assert seen.scaled is not None
    assert (seen.scaled.before, seen.scaled.after, seen.desired) == (1, 4, 4)


async def test_the_api_not_answering_pauses_scaling_quietly_and_decides_again_next_pass() -> None:
    """A 5xx/429 on /scale is no problem to announce (the next pass asks again) and no failed change."""
    cluster, memory = FakeCluster(resource()), steps.ScalerMemory()
    cluster.scale_failure = KubeUnavailableError("cannot read the scale of Deployment shop/billing-worker: HTTP 500")
    workers = {**resource()["spec"]["workers"], "replicas": 4}
    seen = await scale(cluster, memory, 0.0, workers=workers)
    assert (seen.scale_problem, seen.failed, seen.scaled, seen.scale_checked) == (None, None, None, False)
    cluster.scale_failure = None
    seen = await scale(cluster, memory, 10.0, workers=workers)
    assert seen.scaled is not None
    assert cluster.made("set_scale") == [("set_scale", "billing-worker", 4)]


async def test_nothing_is_scaled_from_missing_data_or_without_a_wish() -> None:
    cluster = FakeCluster(resource())
    unknown = await steps.scale_workers(
        cluster,
        "shop",
        understood(autoscaling={"enabled": True}),
        queues=QueuesSeen(None, problem="down"),
        running=1,
        memory=steps.ScalerMemory(),
        now=0.0,
        scale_max_age=60.0,
    )
    assert (unknown.scale_checked, unknown.replicas) == (False, None)
    assert cluster.calls == []


async def test_a_refused_read_or_change_is_observed_not_raised() -> None:
    cluster = FakeCluster(resource())
    cluster.scale_failure = KubeError("cannot read the scale of Deployment shop/billing-worker: HTTP 403 Forbidden")
    seen = await scale(cluster, steps.ScalerMemory(), 0.0, autoscaling={"enabled": True})
    assert seen.scale_problem is not None
    assert "HTTP 403" in seen.scale_problem


async def test_a_declare_the_broker_refuses_is_an_outcome_with_its_reason() -> None:
    broker = FakeBroker()
    broker.declare_failure = BrokerRefusedError("the broker refused an operation: 403 ACCESS_REFUSED")
    outcome = await steps.declare(broker, None, understood().topology, Declared())
    assert outcome.failure is broker.declare_failure
    assert outcome.broker == broker.display
    no_broker = await steps.declare(None, broker.declare_failure, understood().topology, Declared())
    assert (no_broker.failure, no_broker.report) == (broker.declare_failure, None)


async def test_healing_evicts_one_pod_due_and_keeps_it_due_when_refused() -> None:
    cluster, memory = FakeCluster(resource()), healing.HealingMemory()
    pods = [WorkerPod("old-1", "h0"), WorkerPod("new-1", "h1")]

    async def heal(now: float, stuck: dict[str, str] | None = None, busy: frozenset[str] = frozenset()) -> Any:
        return await steps.heal(
            cluster,
            "shop",
            memory,
            pods,
            "h1",
            stuck=stuck or {},
            busy=busy,
            heal_old=True,
            grace_seconds=5,
            now=now,
            logger=RecordingLogger(),
        )

    assert await heal(0.0) is None, "within its grace period"
    assert await heal(10.0, busy=frozenset({"old-1"})) is None, "its deletion cost says it is busy"
    cluster.evictable = False  # a PodDisruptionBudget refuses for now
    assert await heal(10.0) is None
    cluster.evictable = True
    evicted = await heal(30.0)
    assert evicted is not None
    assert (evicted.pod, evicted.why) == ("old-1", "it runs settings h0, not the current h1")
    assert cluster.made("evict_pod") == [("evict_pod", "old-1")] * 2

    assert await heal(50.0, {"new-1": "no heartbeat"}) is None, "one at a time: the last one gone first"
    pods.remove(WorkerPod("old-1", "h0"))
    assert await heal(60.0, {"new-1": "no heartbeat"}, busy=frozenset({"new-1"})) is None, "busy: never evicted"
    stuck = await heal(60.0, {"new-1": "no heartbeat for 40 s while Running"})
    assert stuck is not None
    assert (stuck.pod, stuck.why) == ("new-1", "the worker is stuck: no heartbeat for 40 s while Running")
    assert await heal(75.0, {"new-1": "no heartbeat"}) is None, "not again while the evicted pod is there"


async def lifecycle(
    cluster: FakeCluster,
    broker: FakeBroker,
    pods: list[WorkerPod],
    metrics: ServiceMetrics,
    memory: steps.LifecycleMemory,
    now: float,
    **given: Any,
) -> Any:
    arguments: dict[str, Any] = {"queues": QUEUES, "events_consumed": True, "alarms": (), "config_hash": "h1"} | given
    return await steps.keep_lifecycle(
        cluster,
        broker,
        "shop",
        understood(workers={**resource()["spec"]["workers"], "stuckAfterSeconds": 30}),
        pods=pods,
        metrics=metrics,
        memory=memory,
        now=now,
        logger=RecordingLogger(),
        **arguments,
    )


async def test_deletion_costs_are_written_when_a_pods_step_changes_and_not_again() -> None:
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("busy", "h1", running=True), WorkerPod("idle", "h1", running=True)]
    metrics.running.started("t1", "busy", 0.0)
    seen = await lifecycle(cluster, broker, pods, metrics, memory, 5.0)
    assert (seen.costs_written, cluster.made("annotate_pod")) == (0, []), "a task of 5 s: no cost yet"
    seen = await lifecycle(cluster, broker, pods, metrics, memory, 15.0)
    assert cluster.made("annotate_pod") == [("annotate_pod", "busy", {DELETION_COST_ANNOTATION: "1"})]
    await lifecycle(cluster, broker, pods, metrics, memory, 16.0)
    assert len(cluster.made("annotate_pod")) == 1, "sent a moment ago: not again before the watch brings it back"
    pods[0] = WorkerPod("busy", "h1", running=True, deletion_cost="1")
    metrics.running.ended("t1")
    idle_at = 20.0
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at)
    metrics.running.started("t2", "busy", idle_at + 5)  # the next task of a steady stream, then its end
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at + 6)  # running, short so far: costs 0 too
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at + 20)
    metrics.running.ended("t2")
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at + 21)
    assert len(cluster.made("annotate_pod")) == 1, "kept between tasks and early in the next"
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at + 21 + costs.LOWER_AFTER_SECONDS - 1)
    assert len(cluster.made("annotate_pod")) == 1, "idle less than the while: still kept"
    await lifecycle(cluster, broker, pods, metrics, memory, idle_at + 21 + costs.LOWER_AFTER_SECONDS)
    assert cluster.made("annotate_pod")[-1] == ("annotate_pod", "busy", {DELETION_COST_ANNOTATION: "0"})
    pods[0] = WorkerPod("busy", "h1", running=True, deletion_cost="0")
    await lifecycle(cluster, broker, pods, metrics, memory, 200.0, events_consumed=False)
    await lifecycle(cluster, broker, pods, metrics, memory, 201.0)
    assert len(cluster.made("annotate_pod")) == 2, "at rest nothing is written"


@pytest.mark.parametrize(
    ("given", "unchecked"),
    [
        pytest.param({"events_consumed": False}, "the service's Celery events are not consumed", id="no-events"),
        pytest.param({"queues": QueuesSeen(None, problem="down")}, "queue lengths unknown: down", id="no-queues"),
        pytest.param({"config_hash": None}, "the workers' settings are not known yet", id="no-settings"),
        pytest.param({"alarms": (ALARM,)}, "the broker blocks publishers", id="broker-alarm"),
    ],
)
async def test_nothing_is_judged_on_what_is_unknown(given: dict[str, Any], unchecked: str) -> None:
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("silent", "h1", running=True)]
    for now in (0.0, 100.0, 200.0):
        seen = await lifecycle(cluster, broker, pods, metrics, memory, now, **given)
        assert seen.stuck == ()
        assert seen.unchecked is not None
        assert seen.unchecked.startswith(unchecked)


async def test_a_silent_running_pod_and_one_without_consumer_are_found_stuck() -> None:
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("silent", "h1", running=True), WorkerPod("idle", "h1", running=True), WorkerPod("new", "h1")]
    broker.consumer_answer = (Consumer("billing.order", "127.0.0.1", "celeryevents.io/pod=shop/other"),)
    metrics.last_heard["silent"] = metrics.last_heartbeat["silent"] = 0.0  # heard once, then nothing
    for now in (0.0, 20.0, 40.0, 70.0):  # silence counts once workers had the time to reconnect (30 s)
        metrics.last_heard["idle"] = metrics.last_heartbeat["idle"] = now
        seen = await lifecycle(cluster, broker, pods, metrics, memory, now)
    assert seen.judgement.judged == 2, "a pod not Running is not judged"
    assert [(worker.pod, worker.why, worker.replace) for worker in seen.stuck] == [
        ("idle", "consumes from no handler queue for over 30 s while messages wait", True),
        (
            "silent",
            "no heartbeat or event for over 30 s, and it runs no task (it sends heartbeats otherwise, and it holds no "
            "delivery on the broker)",
            True,
        ),
    ]
    assert "holdings" in broker.calls, "a quiet pod: the deliveries it holds tell whether a task blocks it"
    broker.calls.clear()
    await lifecycle(cluster, broker, pods[1:], metrics, memory, 71.0)
    assert broker.calls == [], "pods heard from: the deliveries held are not listed"


async def test_a_busy_pod_is_judged_by_its_tasks_and_its_hung_task_is_confirmed_on_the_broker() -> None:
    """A task blocks a solo pool's heartbeats: the pod is busy, not silent. Past its limit the task has hung: the pod
    costs nothing to delete any more, and is replaced only while the broker shows it holds the task's message."""
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("solo", "h1", running=True)]
    broker.consumer_answer = (Consumer("billing.order", "10.0.0.1", "celeryevents.io/pod=shop/solo"),)
    metrics.last_heard["solo"] = metrics.last_heartbeat["solo"] = 0.0
    metrics.running.started("t-1", "solo", 0.0)
    workers = {**resource()["spec"]["workers"], "stuckAfterSeconds": 30, "maxTaskRuntimeSeconds": 90}
    limited = understood(workers=workers)

    async def judge(now: float) -> Any:
        return await steps.keep_lifecycle(
            cluster, broker, "shop", limited, pods=pods, metrics=metrics, memory=memory, queues=QUEUES,
            events_consumed=True, alarms=(), config_hash="h1", now=now, logger=RecordingLogger(),
        )  # fmt: skip

    for now in (0.0, 40.0, 80.0):
        seen = await judge(now)
        assert seen.stuck == (), "busy, not silent"
    assert seen.busy == frozenset({"solo"})
    pods[0] = WorkerPod("solo", "h1", running=True, deletion_cost="2")
    broker.holding_answer = (Holding(1, "10.0.0.1", "celeryevents.io/pod=shop/solo"),)
    seen = await judge(100.0)
    [hung] = seen.stuck
    assert hung.why == (
        "task (name unknown) (t-1) has run 100.0 s, past its limit of 90 s (workers.maxTaskRuntimeSeconds)"
    )
    assert hung.replace
    assert cluster.made("annotate_pod")[-1] == ("annotate_pod", "solo", {DELETION_COST_ANNOTATION: "0"})
    assert seen.busy == frozenset(), "a hung task is no work to keep"
    broker.holding_answer = (Holding(0, "10.0.0.1", "celeryevents.io/pod=shop/solo"),)
    [ended] = (await judge(110.0)).stuck
    assert not ended.replace, "the broker shows no delivery held: its end was not seen"
    assert ended.why.startswith("task (name unknown) (t-1) has run 100.0 s"), "the age when found: a stable message"


async def test_a_deletion_cost_written_before_a_restart_is_believed_until_evidence() -> None:
    """The operator restarted while a pod runs a long task it did not see start: the pod stays busy and costly."""
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("busy", "h1", running=True, deletion_cost="3")]
    broker.holding_answer = (Holding(1, None, "celeryevents.io/pod=shop/busy"),)
    for now in (0.0, 100.0):
        seen = await lifecycle(cluster, broker, pods, metrics, memory, now)
        assert seen.busy == frozenset({"busy"})
        assert seen.stuck == ()
    assert cluster.made("annotate_pod") == [], "its cost is not lowered without evidence"
    metrics.ingest({"type": "worker-heartbeat", "hostname": "celery@busy", "active": 0}, 101.0)
    seen = await lifecycle(cluster, broker, pods, metrics, memory, 102.0)
    assert seen.busy == frozenset(), "it said it runs nothing"
    assert cluster.made("annotate_pod") == [], "idle: its cost kept a while"
    later = 102.0 + costs.LOWER_AFTER_SECONDS
    broker.holding_answer = ()
    metrics.ingest({"type": "worker-heartbeat", "hostname": "celery@busy", "active": 0}, later - 1)
    await lifecycle(cluster, broker, pods, metrics, memory, later)
    assert cluster.made("annotate_pod") == [("annotate_pod", "busy", {DELETION_COST_ANNOTATION: "0"})]


async def test_a_pod_whose_task_shows_only_on_the_broker_is_busy_and_costly() -> None:
    """Celery's solo pool sends a task's events when the task ended: while it runs, the pod is quiet and holds the
    task's message unacknowledged."""
    cluster, broker, memory = FakeCluster(resource()), FakeBroker(), steps.LifecycleMemory()
    metrics = ServiceMetrics("shop", "billing")
    pods = [WorkerPod("solo", "h1", running=True)]
    metrics.last_heard["solo"] = metrics.last_heartbeat["solo"] = 0.0
    broker.holding_answer = (Holding(1, None, "celeryevents.io/pod=shop/solo"),)
    for now in (5.0, 40.0, 80.0):
        seen = await lifecycle(cluster, broker, pods, metrics, memory, now)
        assert seen.stuck == (), "busy, not silent"
    assert [call[2] for call in cluster.made("annotate_pod")] == [
        {DELETION_COST_ANNOTATION: "1"},  # from 10 s of running
        {DELETION_COST_ANNOTATION: "2"},  # from a minute
    ]
    assert seen.busy == frozenset({"solo"})
    broker.holding_answer = ()  # its task ended (its events come now, or were lost)
    pods[0] = WorkerPod("solo", "h1", running=True, deletion_cost="2")
    seen = await lifecycle(cluster, broker, pods, metrics, memory, 81.0)
    assert seen.busy == frozenset()
    await lifecycle(cluster, broker, pods, metrics, memory, 81.0 + costs.LOWER_AFTER_SECONDS)
    assert cluster.made("annotate_pod")[-1] == ("annotate_pod", "solo", {DELETION_COST_ANNOTATION: "0"})


WAIT_TARGET = {"enabled": True, "minReplicas": 1, "maxReplicas": 20, "targetWaitSeconds": 10}


async def wait_scale(memory: steps.ScalerMemory, now: float, arrivals: float) -> Any:
    observed = WaitObservations(Load(arrivals, 0.5, 0), 0.5, 2, 60, running=1)
    return await steps.scale_workers(
        FakeCluster(resource()),
        "shop",
        understood(autoscaling=WAIT_TARGET),
        queues=QUEUES,
        running=1,
        memory=memory,
        now=now,
        scale_max_age=60.0,
        observed=observed,
    )


async def test_status_autoscaling_is_shown_anew_at_a_new_decision_else_once_a_minute_if_a_figure_changed() -> None:
    memory = steps.ScalerMemory()
    first = (await wait_scale(memory, 0.0, 4.0)).autoscaling
    assert first is not None
    assert first.arrivals == "4/s"
    assert (await wait_scale(memory, 30.0, 4.4)).autoscaling == first, "the same decision: shown as it was"
    assert (await wait_scale(memory, 61.0, 4.0)).autoscaling == first, "after a minute, only decidedAt would change"
    assert (await wait_scale(memory, 62.0, 4.4)).autoscaling.arrivals == "4.4/s", "a minute on, a figure changed"
    stepped = (await wait_scale(memory, 63.0, 40.0)).autoscaling
    assert stepped.arrivals == "40/s", "a new decision is shown at once"
