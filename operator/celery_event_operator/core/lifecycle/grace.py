"""How long a worker pod may take to stop (pure): the `terminationGracePeriodSeconds` the webhook gives each new pod of
a service, so that a rollout, a scale-in or an eviction lets the tasks it runs finish, once, on their pod.

On SIGTERM a Celery worker stops taking tasks and exits as soon as the ones it runs ended (its warm shutdown); the
kubelet's SIGKILL comes only at the end of the grace period. A generous grace period therefore costs nothing when
tasks are short, and a short one cuts every longer task (which then runs again from its start elsewhere). The grace
covers: the tasks' own limit where one is set (a task past it has hung), else what the service's tasks were seen to
run — 99 % of the runtimes of the last hour or two, and the longest task running now — rounded up to a step so
that it changes rarely; never more than the user's maximum, never less than Kubernetes' default.
"""

from __future__ import annotations

import dataclasses

# Grace periods in use, rounded up to one of these (then to whole hours).
STEPS = (30, 60, 120, 180, 300, 600, 900, 1200, 1800, 2700, 3600)
# After its last task the worker closes its connections and exits; the kubelet needs a moment to see it.
MARGIN_SECONDS = 10
PERCENTILE = 0.99
DEFAULT_SECONDS = 30  # Kubernetes' own default


@dataclasses.dataclass(frozen=True)
class Grace:
    seconds: int
    basis: str  # what it covers, stable while the grace is (status is not rewritten every pass)


def _power_of_two(seconds: float) -> int:
    """Rounded up to a power of two (as the runtimes are kept): stable while a task runs on."""
    return 1 << max(0, int(seconds) - 1).bit_length() if seconds > 1 else 1


def _stepped(seconds: float) -> int:
    for step in STEPS:
        if seconds <= step:
            return step
    return -(-int(seconds) // 3600) * 3600


def grace(
    *,
    max_task_runtime: int | None,
    time_limit: int | None,
    observed: float | None,
    longest_running: float | None,
    maximum: int,
) -> Grace:
    """`observed`: the runtime 99 % of the recent tasks did not exceed (None: none ran); `longest_running`: how long
    the longest task running now has run; `maximum`: workers.maxGracePeriodSeconds. The basis names what decided
    the grace, not the runtimes themselves (the task runtime histogram shows those): it changes when what decides
    the grace does, not each time a running task's age or the percentile moves within the same step."""
    if max_task_runtime is not None:
        need, basis = float(max_task_runtime), f"workers.maxTaskRuntimeSeconds {max_task_runtime} s"
    elif time_limit is not None:
        need, basis = float(time_limit), f"workers.celery.timeLimitSeconds {time_limit} s"
    elif observed is None and longest_running is None:
        return Grace(DEFAULT_SECONDS, "no task runtime observed yet: Kubernetes' default")
    else:
        seen = observed or 0.0
        running = float(_power_of_two(longest_running)) if longest_running is not None else 0.0
        need = max(seen, running)
        if _stepped(running + MARGIN_SECONDS) > _stepped(seen + MARGIN_SECONDS):
            basis = "a task running now, longer than the tasks of the last hour"
        else:
            basis = "what 99 % of the tasks of the last hour ran"
    seconds = max(DEFAULT_SECONDS, _stepped(need + MARGIN_SECONDS))
    if seconds > maximum:
        return Grace(maximum, f"{basis}: capped by workers.maxGracePeriodSeconds {maximum} s")
    return Grace(seconds, f"{basis}, and {MARGIN_SECONDS} s for the worker to exit")
