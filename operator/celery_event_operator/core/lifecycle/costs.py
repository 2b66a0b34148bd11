"""The deletion cost of a worker pod, from the tasks it runs now (pure).

The ReplicaSet controller deletes the pods of lowest `controller.kubernetes.io/pod-deletion-cost` first, whoever
asks for fewer replicas (the operator's autoscaler, `kubectl scale`, an HPA, KEDA). A pod's cost is how much work a
deletion would throw away, in coarse steps of its longest-running task: a task shorter than the first step finishes
within the soft shutdown anyway, and coarse steps change rarely, so the pods are patched rarely (only when a pod's
step changes; never at rest). A cost falls only once it has been lower a while: a worker fed a steady stream of
long tasks is otherwise patched twice per task (up past the first step, down at its end or with the next task's
start), though a scale-down in between would find it as busy as not.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence

# Seconds the longest running task has run: below the first bound a pod costs 0, as an idle one.
STEPS = (10.0, 60.0, 300.0, 1800.0, 7200.0)

# A written cost is lowered once the lower one has held this long (at once when the pod's task hung). Meanwhile a
# scale-down prefers the pods that ran no long task lately, and one that takes this pod anyway stops it in its grace:
# what it runs now is short so far.
LOWER_AFTER_SECONDS = 60.0


def deletion_cost(running_seconds: Sequence[float]) -> int:
    """0 for an idle pod (or one whose tasks are all short so far), up to len(STEPS) for hours of work."""
    if not running_seconds:
        return 0
    return bisect.bisect_right(STEPS, max(running_seconds))


def costs_to_write(wanted: dict[str, int], current: dict[str, str | None], *, limit: int) -> dict[str, int]:
    """The pods whose annotation differs from their cost (no annotation counts as 0), at most `limit` of them,
    the costliest first (those matter most to the next scale-down)."""
    differing = {pod: cost for pod, cost in wanted.items() if (current.get(pod) or "0") != str(cost)}
    return dict(sorted(differing.items(), key=lambda item: (-item[1], item[0]))[:limit])


def held(
    wanted: dict[str, int],
    written: dict[str, str | None],
    hung: Collection[str],
    lower_since: dict[str, float],
    now: float,
) -> tuple[dict[str, int], dict[str, float]]:
    """The costs to keep: a pod keeps its written cost until a lower one has been wanted for LOWER_AFTER_SECONDS
    (a higher one is written at once, and a hung task's pod is lowered at once); and since when each pod has wanted
    less than is written (the memory of the next call)."""
    kept, since = dict(wanted), {}
    for pod, cost in wanted.items():
        was = parsed(written.get(pod))
        if pod in hung or cost >= was:
            continue
        since[pod] = lower_since.get(pod, now)
        if now - since[pod] < LOWER_AFTER_SECONDS:
            kept[pod] = was
    return kept, since


def parsed(annotation: str | None) -> int:
    """A pod's deletion-cost annotation as a number (Kubernetes' own rule: an int32; anything else counts as 0)."""
    try:
        return int(annotation) if annotation is not None else 0
    except ValueError:
        return 0


def least_running_seconds(cost: int) -> float:
    """How long, at least, the longest task of a pod of this cost has run (beyond the steps: the last step)."""
    return STEPS[min(cost, len(STEPS)) - 1] if cost > 0 else 0.0
