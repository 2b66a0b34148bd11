"""Which pod of a service to evict because it runs without the current settings, or is stuck (pure).

A pod admitted while the webhook could not answer (operator down, certificate changing) runs on Celery's
defaults for good; a pod with an old settings hash stays old when its rollout stalled. Such a pod is evicted
after a grace period, one at a time: the next only once the last evicted pod is gone, and not faster than
PACE_SECONDS, and the number of pods back where it was (its replacement, admitted through the webhook, is up)
or a grace period passed. A stuck worker (lifecycle/stuck.py) goes the same way, one at a time, first. A busy pod
(its deletion cost, or the tasks it runs, say so) is never evicted: its work would be thrown away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

PACE_SECONDS = 10.0


@dataclasses.dataclass
class HealingMemory:
    """What one service's keeper remembers between passes (kept in memory: a restart only delays)."""

    stale_since: dict[str, float] = dataclasses.field(default_factory=dict)  # pod → first seen without settings
    evicted: str | None = None
    evicted_at: float = float("-inf")
    pods_at_eviction: int = 0


@dataclasses.dataclass(frozen=True)
class HealingStep:
    evict: str | None  # the pod to evict now
    why: str  # why that pod, for its Event


def next_step(
    memory: HealingMemory,
    pods: Iterable[tuple[str, str | None]],
    config_hash: str | None,
    *,
    heal_old: bool,
    now: float,
    grace_seconds: float,
    stuck: Mapping[str, str] | None = None,
    busy: Collection[str] = frozenset(),
) -> HealingStep:
    """`pods`: (name, settings hash) of the service's live pods; `config_hash` None: pods without the current
    settings are left alone; `stuck`: pods found stuck (pod → why), due at once; `busy`: pods never evicted.
    Updates `memory`."""
    live = dict(pods)
    stale = {
        name: found
        for name, found in live.items()
        if config_hash is not None and (found is None or (heal_old and found != config_hash))
    }
    memory.stale_since = {name: memory.stale_since.get(name, now) for name in stale}
    replacement_pending = len(live) < memory.pods_at_eviction and now - memory.evicted_at < grace_seconds
    if memory.evicted in live or replacement_pending or now - memory.evicted_at < PACE_SECONDS:
        return HealingStep(None, "")  # one at a time: the last one gone and replaced first
    stuck_due = sorted(name for name in stuck or {} if name in live and name not in busy)
    if stuck_due:
        pod = stuck_due[0]
        why = f"the worker is stuck: {(stuck or {})[pod]}"
    else:
        due = [name for name, since in memory.stale_since.items() if now - since >= grace_seconds and name not in busy]
        if not due:
            return HealingStep(None, "")
        pod = min(due, key=lambda name: (memory.stale_since[name], name))
        found = stale[pod]
        why = (
            "it runs without the service's settings (admitted while the webhook did not answer)"
            if found is None
            else f"it runs settings {found}, not the current {config_hash}"
        )
    memory.evicted, memory.evicted_at, memory.pods_at_eviction = pod, now, len(live)
    return HealingStep(pod, why)


def refused(memory: HealingMemory) -> None:
    """The eviction was refused (a PodDisruptionBudget) or failed: the pod stays due, tried again after the pace."""
    memory.evicted, memory.pods_at_eviction = None, 0
