"""What a service is told about the bounds on its metrics (pure): one Warning Event per label that overflows."""

from __future__ import annotations

from collections.abc import Mapping

from celery_event_operator.core.monitoring.bounds import (
    LABELS,
    MAX_EXCEPTIONS_PER_TASK,
    MAX_WORKERS_OUTSIDE_PODS,
    OVERFLOW,
)

OVERFLOW_REASON = "MetricLabelsOverflowed"


def overflow_note(
    reported: frozenset[str], overflowing: Mapping[str, tuple[int, int]]
) -> tuple[frozenset[str], str | None]:
    """The message of one Warning Event (reason OVERFLOW_REASON) for the labels that overflow and were not reported
    yet (label → (refused, kept)); the labels reported from now on."""
    new = [label for label in LABELS if label in overflowing and label not in reported]
    if not new:
        return reported, None
    parts = [_described(label, *overflowing[label]) for label in new]
    message = (
        "Metrics of this service: " + "; ".join(parts) + f'. The rest are counted under the label value "{OVERFLOW}" '
        "(celery_event_operator_label_values_overflowed_total counts them)."
    )
    return reported | frozenset(new), message


def _described(label: str, refused: int, kept: int) -> str:
    seen = refused + kept
    if label == "name":
        return f"about {seen:,} task names seen, {kept:,} kept (spec.monitoring.maxTaskNames, else --max-task-names)"
    if label == "exception":
        return f"about {seen:,} exception classes seen, {kept:,} kept (at most {MAX_EXCEPTIONS_PER_TASK} per task)"
    if label == "queue_name":
        return f"about {seen:,} queue names of tasks without a handler seen, {kept:,} kept"
    return (
        f"about {seen:,} worker hostnames seen, {kept:,} kept (live pods, and at most "
        f"{MAX_WORKERS_OUTSIDE_PODS} workers outside Kubernetes)"
    )
