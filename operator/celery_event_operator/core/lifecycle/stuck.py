"""Which worker pods run but no longer work (pure).

A pod running a task is **busy**: it is judged by its tasks, never by its silence (a task blocks the heartbeats of
Celery's solo pool, and can block gevent's; a pod's deletion cost written before an operator restart says it is
busy too). It is stuck only when a task runs past its limit (`workers.maxTaskRuntimeSeconds`, else Celery's
`timeLimitSeconds` and the time the pool takes to end it; with neither, never), and then replaced only when the
broker confirms that the pod still holds a delivery unacknowledged (the injected settings acknowledge late: a task
that runs holds its message), so an end event lost on the way never gets a pod evicted.

A pod running nothing is stuck when it holds no consumer on the service's handler queues for longer than the
threshold while messages wait, or when it stopped sending events for longer than the threshold although it sends
heartbeats. A worker that never heartbeats (`--without-heartbeat`) is recognised — heard only through its task
events, or seen consuming on the broker under its pod's Celery hostname — and never judged on silence: its silence
tells nothing. A pod never heard and not seen on the broker is reported, not replaced.

Judged only on what is known: heartbeats only while the service's events are consumed (and the threshold counts
from when they were consumed again, plus the time a worker takes to reconnect, so a broker outage or an operator
restart makes no pod look silent), consumers only when the broker listed them. A pod is given the threshold from
when it was first seen Running. Silence is a pod's own only when it is not everyone's: when most heartbeating pods
of a service go silent at once, a cause they share is likelier, and none of them is judged.

Replacing cannot loop: when a pod that started after a stuck pod was evicted is stuck for the same reason within
LOOP_SECONDS, replacing pauses for the service (reported) until its pods change (a new pod template), or no pod
was stuck for LOOP_SECONDS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from celery_event_operator.core.lifecycle.consumers import OnBroker
from celery_event_operator.core.monitoring.running import RunningTask

# After the service's events are consumed again (a broker outage, an operator restart), its workers may still be
# reconnecting: Celery retries its broker connection every 2, 4, … up to 30 s.
RECONNECT_SECONDS = 30.0
# Celery's time limit is its pool's to enforce (prefork and gevent end the task, which ends in a task-failed event);
# a task is past it, for the operator, only this much later. The solo and threads pools do not enforce it.
TIME_LIMIT_MARGIN_SECONDS = 30.0
# A replacement stuck for the same reason within this long after the eviction is a loop; a pause lifts after this
# long without a stuck pod.
LOOP_SECONDS = 600.0
# Celery's workers heartbeat every 2 s while their event loop runs: a task that blocks it (the solo pool's, and a
# gevent pool's CPU-bound task) started at most this long after the last event heard. The solo pool sends a task's
# events only once it ended (they are buffered for its event loop), so its running task shows on the broker alone:
# the delivery it holds unacknowledged (late acknowledgement, as injected).
HEARTBEAT_SECONDS = 2.0
# The management API lists what the broker's statistics said up to this long ago (collect_statistics_interval), and
# the deliveries held are listed at most HOLDINGS_MAX_AGE_SECONDS ago for a judgement: only a pod quiet for longer
# than their sum and the heartbeat interval is proved idle by holding no delivery.
STATISTICS_LAG_SECONDS = 5.0
HOLDINGS_MAX_AGE_SECONDS = 2.0
PROOF_SECONDS = HEARTBEAT_SECONDS + STATISTICS_LAG_SECONDS + HOLDINGS_MAX_AGE_SECONDS + 1.0
NAMED = 10  # pods named in a message (the rest counted)


@dataclasses.dataclass(frozen=True)
class TaskLimit:
    seconds: float
    source: str  # where the limit comes from, for messages


def task_limit(max_task_runtime_seconds: int | None, time_limit_seconds: int | None) -> TaskLimit | None:
    """How long a task may run before its pod is stuck: the user's own limit for this, else Celery's hard time limit
    and the time its pool takes to end the task; None: tasks are not judged on how long they run."""
    if max_task_runtime_seconds is not None:
        return TaskLimit(float(max_task_runtime_seconds), "workers.maxTaskRuntimeSeconds")
    if time_limit_seconds is not None:
        margin = TIME_LIMIT_MARGIN_SECONDS
        source = f"celery.timeLimitSeconds {time_limit_seconds} s + {margin:.0f} s"
        return TaskLimit(time_limit_seconds + margin, source)
    return None


def overdue(tasks: Iterable[RunningTask], limit: TaskLimit | None, now: float) -> list[RunningTask]:
    """The tasks that have run past the limit, oldest first."""
    if limit is None:
        return []
    return sorted((task for task in tasks if now - task.started_at > limit.seconds), key=lambda t: t.started_at)


@dataclasses.dataclass(frozen=True)
class PodFacts:
    """What is known of one Running pod (on the service's current settings) in this pass."""

    name: str
    template: str | None = None  # its workload's pod template revision
    tasks: tuple[RunningTask, ...] = ()  # the tasks it runs that were seen starting
    # It runs tasks its events did not show starting (its deletion cost said so, its heartbeat counted more, or it
    # holds deliveries on the broker), since then at the latest (None: none).
    unseen_since: float | None = None
    last_heard: float | None = None  # its last event of any kind (None: never heard)
    first_heard: float | None = None
    last_heartbeat: float | None = None  # its last worker-online or worker-heartbeat (None: never)
    broker: OnBroker | None = None  # its consumers (None: the broker's consumers were not listed)
    unacknowledged: int | None = None  # deliveries its connections hold (None: not listed)

    @property
    def busy(self) -> bool:
        return bool(self.tasks) or self.unseen_since is not None or bool(self.unacknowledged)


@dataclasses.dataclass(frozen=True)
class StuckWorker:
    pod: str
    why: str  # safe to show, and stable while it lasts (no growing counts: status is not rewritten every pass)
    cause: str = ""  # what makes it stuck, to tell a replacement stuck "for the same reason"
    replace: bool = True  # False: reported only


@dataclasses.dataclass(frozen=True)
class Judgement:
    stuck: tuple[StuckWorker, ...] = ()
    unchecked: str | None = None  # why the pods were not judged (then nothing is stuck)
    judged: int = 0
    heartbeating: int = 0  # pods that send heartbeats
    consuming: int | None = None  # pods holding a consumer of the handler queues (None: consumers not listed)
    unlisted: str | None = None  # why the consumers were not listed, when they were not
    heartbeatless: tuple[str, ...] = ()  # pods that send no heartbeats: silence is not judged for them
    long_unlimited: tuple[str, ...] = ()  # pods running a task past the threshold, with no limit to judge it by
    paused: str | None = None  # why replacing is paused (a loop); None: it is not


@dataclasses.dataclass(frozen=True)
class _Eviction:
    pod: str
    cause: str
    why: str
    at: float
    running_before: int  # Running pods when it was evicted (its replacement brings them back)


@dataclasses.dataclass(frozen=True)
class _Pause:
    why: str
    templates: frozenset[str]  # the pod templates running when it paused: another one lifts it


@dataclasses.dataclass
class StuckMemory:
    """What one service's judgement remembers between passes."""

    running_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pod → first seen Running
    unconsumed_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pod → no consumer, messages wait
    heard_since: float | None = None  # the service's events consumed without a break since
    hung: dict[str, tuple[str, float]] = dataclasses.field(default_factory=dict)  # pod → (task uuid, age judged at)
    evictions: list[_Eviction] = dataclasses.field(default_factory=list)  # stuck pods evicted, LOOP_SECONDS back
    pause: _Pause | None = None
    stuck_at: float = -float("inf")  # when a pod was last found stuck


def evicted(memory: StuckMemory, worker: StuckWorker, now: float) -> None:
    """A stuck pod was evicted: its replacement is awaited, and watched for the same fault."""
    memory.evictions.append(_Eviction(worker.pod, worker.cause, worker.why, now, len(memory.running_since)))


def unchecked_because(
    *,
    monitored: bool,
    queues_problem: str | None,
    settings_known: bool,
    events_consumed: bool,
    alarmed: bool,
) -> str | None:
    """Why the workers cannot be judged this pass (None: they can): nothing is judged on what is unknown — the
    heartbeats, the queues, the current settings."""
    if not monitored:
        return "monitoring is off: the workers' heartbeats are not consumed (judged once monitoring.enabled is true)"
    if queues_problem is not None:
        return f"queue lengths unknown: {queues_problem} (judged once they are counted again)"
    if not settings_known:
        return "the workers' settings are not known yet (judged once they are written)"
    if not events_consumed:
        return "the service's Celery events are not consumed (see MonitoringReady; judged once they are)"
    if alarmed:
        return (
            "the broker blocks publishers (a resource alarm, see BrokerReachable): no worker can heartbeat (judged "
            "again once the alarm clears)"
        )
    return None


def judge(
    memory: StuckMemory,
    pods: Sequence[PodFacts],
    *,
    waiting: int,
    heartbeats_known: bool,
    now: float,
    threshold: float,
    limit: TaskLimit | None = None,
    unlisted: str | None = None,
) -> Judgement:
    """`pods`: the service's Running pods on its current settings, with what is known of them (`unlisted`: why the
    broker's consumers are not among it, when they are not). Updates `memory`."""
    memory.running_since = {pod.name: memory.running_since.get(pod.name, now) for pod in pods}
    memory.evictions = [e for e in memory.evictions if now - e.at < LOOP_SECONDS]
    if not heartbeats_known:
        memory.heard_since = None
        memory.unconsumed_since.clear()
        return Judgement(judged=len(pods))
    heard_since = memory.heard_since = memory.heard_since if memory.heard_since is not None else now
    listed = all(pod.broker is not None for pod in pods)
    found = _Found()
    for pod in pods:
        # Time to settle: since it was first seen Running, and since its events could be heard again.
        settled = max(memory.running_since[pod.name], heard_since + RECONNECT_SECONDS)
        if pod.busy:
            memory.unconsumed_since.pop(pod.name, None)
            _judge_tasks(memory, pod, found, limit=limit, now=now, threshold=threshold)
            continue
        memory.hung.pop(pod.name, None)
        if pod.last_heartbeat is None and _heartbeatless(pod, settled, now=now, threshold=threshold):
            found.heartbeatless.append(pod.name)
        elif pod.last_heard is None:
            if now - settled > threshold:
                found.stuck.append(_unheard(pod))
            continue
        elif now - max(settled, pod.last_heard) > threshold:
            # Silent, and (when the broker can say) holding no delivery for long enough to be sure it runs nothing.
            if pod.unacknowledged is not None and now - max(settled, pod.last_heard) <= PROOF_SECONDS:
                continue
            memory.unconsumed_since.pop(pod.name, None)
            found.silent.append(pod)
            continue
        _judge_consumers(memory, pod, found, waiting=waiting, now=now, threshold=threshold)
    memory.unconsumed_since = {pod: at for pod, at in memory.unconsumed_since.items() if pod in memory.running_since}
    memory.hung = {pod: hung for pod, hung in memory.hung.items() if pod in memory.running_since}
    heartbeating = [pod for pod in pods if pod.last_heartbeat is not None]
    expected = [pod for pod in heartbeating if not pod.busy]
    if len(found.silent) >= 2 and 2 * len(found.silent) >= len(expected):
        return Judgement(
            unchecked=f"{len(found.silent)} of {len(expected)} idle workers that send heartbeats stopped at once: a "
            "cause they share (their network to the broker, their node) is likelier than each one hanging; none is "
            "replaced (judged again once they heartbeat)",
            judged=len(pods),
        )
    for silent in found.silent:
        why = f"no heartbeat or event for over {threshold:.0f} s, and it runs no task (it sends heartbeats otherwise"
        if silent.unacknowledged is None:
            why += "); not replaced: the broker's channels cannot be listed to confirm it holds no task"
            found.stuck.append(StuckWorker(silent.name, why, "silent", replace=False))
        else:
            found.stuck.append(StuckWorker(silent.name, why + ", and it holds no delivery on the broker)", "silent"))
    stuck = sorted(found.stuck, key=lambda worker: worker.pod)
    if stuck:
        memory.stuck_at = now
    paused = _keep_pause(memory, pods, stuck, now)
    if paused is not None:
        stuck = [dataclasses.replace(worker, replace=False) for worker in stuck]
    stuck += _replacing(memory, len(pods), {worker.pod for worker in stuck})
    return Judgement(
        tuple(stuck),
        judged=len(pods),
        heartbeating=len(heartbeating),
        consuming=sum(1 for pod in pods if pod.broker is not None and pod.broker.consuming) if listed else None,
        unlisted=None if listed else unlisted,
        heartbeatless=tuple(sorted(found.heartbeatless)),
        long_unlimited=tuple(sorted(found.long_unlimited)),
        paused=paused,
    )


@dataclasses.dataclass
class _Found:
    stuck: list[StuckWorker] = dataclasses.field(default_factory=list)
    silent: list[PodFacts] = dataclasses.field(default_factory=list)
    heartbeatless: list[str] = dataclasses.field(default_factory=list)
    long_unlimited: list[str] = dataclasses.field(default_factory=list)


def _judge_tasks(
    memory: StuckMemory, pod: PodFacts, found: _Found, *, limit: TaskLimit | None, now: float, threshold: float
) -> None:
    """A busy pod: stuck only when a task runs past its limit and the broker says the pod still holds a delivery."""
    oldest = min([task.started_at for task in pod.tasks] + [pod.unseen_since or now])
    if limit is None:
        if now - oldest > threshold:
            found.long_unlimited.append(pod.name)
        return
    late = overdue(pod.tasks, limit, now)
    unseen_late = pod.unseen_since is not None and now - pod.unseen_since > limit.seconds
    if not late and not unseen_late:
        memory.hung.pop(pod.name, None)
        return
    task = late[0] if late else None
    key = task.uuid if task is not None else ""
    started = task.started_at if task is not None else pod.unseen_since or now
    uuid, age = memory.hung.get(pod.name, (None, 0.0))
    if uuid != key:
        uuid, age = memory.hung[pod.name] = (key, now - started)
    past = f"past its limit of {limit.seconds:.0f} s ({limit.source})"
    if task is not None:
        name = task.name or "(name unknown)"
        why = f"task {name} ({task.uuid[:8]}) has run {age:.1f} s, {past}"
    else:
        name = "?"
        why = (
            f"runs a task its events do not show (the solo pool sends them when a task ends; the pod holds a "
            f"delivery on the broker) for at least {age:.1f} s, {past}"
        )
    cause = f"hung:{name}"
    if pod.unacknowledged is None:
        why += "; not replaced: the broker's channels cannot be listed to confirm it still holds the task's message"
        found.stuck.append(StuckWorker(pod.name, why, cause, replace=False))
    elif pod.unacknowledged == 0:
        why += "; not replaced: the broker shows no delivery held by the pod (the task may have ended unseen)"
        found.stuck.append(StuckWorker(pod.name, why, cause, replace=False))
    else:
        found.stuck.append(StuckWorker(pod.name, why, cause))


def _heartbeatless(pod: PodFacts, settled: float, *, now: float, threshold: float) -> bool:
    """A pod that sends no heartbeats (it was given the threshold to send one): heard through its task events, or
    never heard but its worker seen consuming on the broker under the pod's own Celery hostname."""
    if now - max(settled, pod.first_heard or settled) <= threshold:
        return False
    if pod.last_heard is not None:
        return True
    return pod.broker is not None and any(_hostname_of(pod.name, name) for name in pod.broker.hostnames)


def _hostname_of(pod: str, hostname: str) -> bool:
    """Whether a Celery hostname (`celery@billing-worker-5d8f-x2`) is the pod's: its events name it."""
    return (hostname.rpartition("@")[2] or hostname) == pod


def _unheard(pod: PodFacts) -> StuckWorker:
    """A pod never heard since the threshold: what the broker says of it; reported, never replaced."""
    broker = pod.broker
    if broker is None:
        why = (
            "never heard since it runs: heartbeats off (--without-heartbeat) and no task run yet, or a Celery hostname "
            "other than …@<pod name> (its consumers cannot be listed to tell which)"
        )
    elif broker.hostnames:
        named = ", ".join(sorted(broker.hostnames)[:3])
        why = (
            f"its worker answers as {named}, not …@{pod.name}: its events cannot be told from another pod's (keep "
            "Celery's default hostname, or -n celery@$(POD_NAME))"
        )
    elif broker.consuming:
        why = "never heard, though it consumes: its worker sends no events the operator receives"
    else:
        why = (
            "never heard, and it holds no consumer on the broker: its worker is not running, or not connected to this "
            "broker"
        )
    return StuckWorker(pod.name, why + "; reported, not replaced", "unheard", replace=False)


def _judge_consumers(
    memory: StuckMemory, pod: PodFacts, found: _Found, *, waiting: int, now: float, threshold: float
) -> None:
    if pod.broker is None or pod.broker.consuming is not False or waiting <= 0:
        memory.unconsumed_since.pop(pod.name, None)
        return
    since = memory.unconsumed_since.setdefault(pod.name, now)
    if now - since > threshold:
        why = f"consumes from no handler queue for over {threshold:.0f} s while messages wait"
        found.stuck.append(StuckWorker(pod.name, why, "no-consumer"))


def _keep_pause(memory: StuckMemory, pods: Sequence[PodFacts], stuck: list[StuckWorker], now: float) -> str | None:
    """Replacing paused (why), kept or lifted: a replacement stuck for the reason its predecessor was evicted for."""
    templates = frozenset(pod.template for pod in pods if pod.template is not None)
    pause = memory.pause
    if pause is not None and (templates - pause.templates or now - memory.stuck_at > LOOP_SECONDS):
        # The pods changed, or nothing was stuck for long: a loop is found afresh, from evictions made from now on.
        pause = memory.pause = None
        memory.evictions.clear()
    if pause is None:
        for worker in stuck:
            if not worker.replace:
                continue
            since = memory.running_since.get(worker.pod, now)
            looped = [e for e in memory.evictions if e.cause == worker.cause and since >= e.at and e.pod != worker.pod]
            if looped:
                why = (
                    f"replacing paused: {worker.pod} started after {looped[-1].pod} was evicted for the same reason "
                    f"less than {LOOP_SECONDS / 60:.0f} minutes ago, and is stuck too ({worker.why}); replacing again "
                    "would loop. It resumes when the pods change (a rollout of another pod template)"
                )
                pause = memory.pause = _Pause(why, templates)
                break
    return pause.why if pause is not None else None


def _replacing(memory: StuckMemory, running: int, stuck: set[str]) -> list[StuckWorker]:
    """The stuck pods evicted whose replacement is not Running yet: still said (the state lasts until then)."""
    pending = []
    for eviction in memory.evictions:
        if eviction.pod in stuck or eviction.pod in memory.running_since or running >= eviction.running_before:
            continue
        why = f"evicted ({eviction.why}); its replacement is not running yet"
        pending.append(StuckWorker(eviction.pod, why, eviction.cause, replace=False))
    return pending


def healthy_message(judgement: Judgement, threshold: float) -> str:
    """WorkersHealthy's message when no pod is stuck: only what was checked."""
    parts = [f"{judgement.heartbeating} send heartbeats"]
    if judgement.consuming is None:
        parts.append(f"consumers not listed ({judgement.unlisted or 'no management API'}): not judged on them")
    else:
        parts.append(f"{judgement.consuming} consume from the handler queues")
    message = f"{judgement.judged} running workers: " + ", ".join(parts)
    if judgement.heartbeatless:
        pods = _named(judgement.heartbeatless)
        message += (
            f"; silence is not judged for {pods}: it sends no heartbeats (--without-heartbeat, or "
            "CELERY_WORKER_WITHOUT_HEARTBEAT), so a hung worker cannot be told from an idle one — drop that option to "
            "have it judged; it is judged on its consumers and task runtimes"
        )
    if judgement.long_unlimited:
        message += (
            f"; {_named(judgement.long_unlimited)} runs a task for over {threshold:.0f} s: not judged on how long "
            "tasks run, no limit is set (workers.maxTaskRuntimeSeconds or workers.celery.timeLimitSeconds)"
        )
    return message


def _named(pods: Sequence[str]) -> str:
    named = ", ".join(pods[:NAMED])
    return named + (f" and {len(pods) - NAMED} more" if len(pods) > NAMED else "")
