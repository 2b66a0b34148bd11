"""Which pod to evict for running without the current settings, and when (pure)."""

from __future__ import annotations

from celery_event_operator.core.injection import healing
from celery_event_operator.core.injection.healing import HealingMemory, next_step

CURRENT = "h-new"


def step(memory: HealingMemory, pods: list[tuple[str, str | None]], now: float, heal_old: bool = True) -> str | None:
    return next_step(memory, pods, CURRENT, heal_old=heal_old, now=now, grace_seconds=60).evict


def test_a_pod_without_settings_is_evicted_after_the_grace_period_with_the_reason() -> None:
    memory = HealingMemory()
    pods = [("a", CURRENT), ("b", None)]
    assert step(memory, pods, now=0) is None
    assert step(memory, pods, now=59) is None
    found = next_step(memory, pods, CURRENT, heal_old=True, now=60, grace_seconds=60)
    assert found.evict == "b"
    assert "without the service's settings" in found.why


def test_old_settings_are_healed_only_when_the_workers_follow_the_settings() -> None:
    pods = [("a", "h-old")]
    assert step(HealingMemory(), pods, now=0, heal_old=False) is None
    memory = HealingMemory()
    step(memory, pods, now=0, heal_old=False)
    assert step(memory, pods, now=1000, heal_old=False) is None, "rolloutOnChange false: old settings are wanted"
    memory = HealingMemory()
    step(memory, pods, now=0)
    assert step(memory, pods, now=60) == "a"


def test_one_at_a_time_the_next_only_once_the_last_is_gone_and_replaced() -> None:
    memory = HealingMemory()
    pods = [("a", None), ("b", None), ("c", CURRENT)]
    step(memory, pods, now=0)
    assert step(memory, pods, now=60) == "a"
    assert step(memory, pods, now=100) is None, "a is still there (terminating slowly)"
    without_a = [("b", None), ("c", CURRENT)]
    assert step(memory, without_a, now=101) is None, "its replacement is not up yet"
    replaced = [("b", None), ("c", CURRENT), ("a2", CURRENT)]
    assert step(memory, replaced, now=102) == "b"


def test_a_replacement_that_never_comes_holds_the_next_eviction_for_one_grace_period_only() -> None:
    memory = HealingMemory()
    pods = [("a", None), ("b", None)]
    step(memory, pods, now=0)
    assert step(memory, pods, now=60) == "a"
    assert step(memory, [("b", None)], now=100) is None
    assert step(memory, [("b", None)], now=121) == "b", "scaled down meanwhile: go on after a grace period"


def test_a_refused_eviction_is_tried_again_after_the_pace() -> None:
    memory = HealingMemory()
    pods = [("a", None)]
    step(memory, pods, now=0)
    assert step(memory, pods, now=60) == "a"
    healing.refused(memory)
    assert step(memory, pods, now=61) is None
    assert step(memory, pods, now=60 + healing.PACE_SECONDS) == "a"


def test_a_pod_that_got_its_settings_or_went_is_forgotten() -> None:
    memory = HealingMemory()
    step(memory, [("a", None)], now=0)
    step(memory, [("a", CURRENT)], now=30)
    assert step(memory, [("a", None)], now=70) is None, "the clock starts again when it is stale again"
    assert memory.stale_since == {"a": 70}
