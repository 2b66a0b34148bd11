"""The deletion cost of a worker pod, from the tasks it runs now (pure).

The ReplicaSet controller deletes the pods of lowest `controller.kubernetes.io/pod-deletion-cost` first, whoever
asks for fewer replicas (the operator's autoscaler, `kubectl scale`, an HPA, KEDA). A pod's cost is how much work a
deletion would throw away, in coarse steps of its longest-running task: a task shorter than the first step finishes
within the soft shutdown anyway, and coarse steps change rarely, so the pods are patched rarely (only when a pod's
step changes; never at rest).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

# Seconds the longest running task has run: below the first bound a pod costs 0, as an idle one.
STEPS = (10.0, 60.0, 300.0, 1800.0, 7200.0)


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


def parsed(annotation: str | None) -> int:
    """A pod's deletion-cost annotation as a number (Kubernetes' own rule: an int32; anything else counts as 0)."""
    try:
        return int(annotation) if annotation is not None else 0
    except ValueError:
        return 0


def least_running_seconds(cost: int) -> float:
    """How long, at least, the longest task of a pod of this cost has run (beyond the steps: the last step)."""
    return STEPS[min(cost, len(STEPS)) - 1] if cost > 0 else 0.0
