"""Which worker pods run but no longer work (pure): a pod is stuck when it heartbeats but holds no consumer on the
service's handler queues for longer than a threshold while messages wait, or when its heartbeats stopped for longer
than the threshold while it is Running.

Judged only on what is known: heartbeats only while the service's events are consumed (and the threshold counts
from when they were consumed again, plus the time a worker takes to reconnect, so a broker outage or an operator
restart makes no pod look silent), consumers only when the broker listed them. A pod is given the threshold from
when it was first seen Running. Silence is a pod's own only when it is not everyone's: when most pods of a
service go silent at once, the broker or the network is the likelier cause, and none of them is judged. A pod
never heard at all is reported but not replaced: its Celery hostname may not be its pod's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

# After the service's events are consumed again (a broker outage, an operator restart), its workers may still be
# reconnecting: Celery retries its broker connection every 2, 4, … up to 30 s.
RECONNECT_SECONDS = 30.0


@dataclasses.dataclass(frozen=True)
class StuckWorker:
    pod: str
    why: str  # safe to show, and stable while it lasts (no growing counts: status is not rewritten every pass)
    replace: bool = True  # False: reported only


@dataclasses.dataclass(frozen=True)
class Judgement:
    stuck: tuple[StuckWorker, ...] = ()
    unchecked: str | None = None  # why the pods were not judged (then nothing is stuck)


@dataclasses.dataclass
class StuckMemory:
    """What one service's judgement remembers between passes."""

    running_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pod → first seen Running
    unconsumed_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pod → heartbeating, no consumer
    heard_since: float | None = None  # the service's events consumed without a break since


def judge(
    memory: StuckMemory,
    pods: Iterable[str],
    *,
    last_heard: Mapping[str, float],
    consuming: Mapping[str, bool | None] | None,
    waiting: int,
    heartbeats_known: bool,
    now: float,
    threshold: float,
) -> Judgement:
    """`pods`: the service's Running pods on its current settings. `consuming`: per pod, whether it holds a handler
    queue's consumer (None: the broker's consumers are unknown). Updates `memory`."""
    names = list(pods)
    memory.running_since = {pod: memory.running_since.get(pod, now) for pod in names}
    if not heartbeats_known:
        memory.heard_since = None
        memory.unconsumed_since.clear()
        return Judgement()
    heard_since = memory.heard_since = memory.heard_since if memory.heard_since is not None else now
    silent, stuck = [], []
    for pod in names:
        silent_since = max(
            memory.running_since[pod], heard_since + RECONNECT_SECONDS, last_heard.get(pod, -float("inf"))
        )
        if now - silent_since > threshold:
            memory.unconsumed_since.pop(pod, None)
            silent.append(pod)
            continue
        if consuming is None or consuming.get(pod) is not False or waiting <= 0:
            memory.unconsumed_since.pop(pod, None)
            continue
        since = memory.unconsumed_since.setdefault(pod, now)
        if now - since > threshold:
            why = f"heartbeats but consumes from no handler queue for over {threshold:.0f} s while messages wait"
            stuck.append(StuckWorker(pod, why))
    memory.unconsumed_since = {pod: at for pod, at in memory.unconsumed_since.items() if pod in memory.running_since}
    heard = [pod for pod in silent if pod in last_heard]
    if len(heard) >= 2 and 2 * len(heard) >= len(names):
        return Judgement(
            unchecked=f"{len(heard)} of {len(names)} workers stopped heartbeating at once: more likely the broker or "
            "the network than the workers; none is replaced"
        )
    for pod in silent:
        if pod in last_heard:
            stuck.append(StuckWorker(pod, f"no heartbeat for over {threshold:.0f} s while Running"))
        else:
            why = "never heard since it runs (is its Celery hostname …@<pod name>?); reported, not replaced"
            stuck.append(StuckWorker(pod, why, replace=False))
    return Judgement(tuple(sorted(stuck, key=lambda worker: worker.pod)))
