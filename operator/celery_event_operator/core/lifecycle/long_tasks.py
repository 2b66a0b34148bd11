"""Long tasks and the broker's delivery-acknowledgement timeout (pure): what the workers ask of the broker, and
whether the service's tasks run once.

The injected settings acknowledge late: a task holds its message until it ended. A broker that enforces an
acknowledgement timeout gives a delivery held longer to another worker, while the first still runs it: the task runs
twice, and one longer than the timeout never stops being run again. Which broker enforces which timeout depends on its
version and the queue type (core/broker/versions.py): up to 4.2 it is the broker's `consumer_timeout` (30 minutes by
default, or a `consumer-timeout` policy from 3.12), which the operator is told (it cannot be read remotely); from 4.3
a quorum queue honours the timeout its consumers ask for, which the workers set long enough for the service's tasks
(their limit, else the longest grace period), and classic queues enforce none. The condition says which tasks will
run twice before it happens, and what to change.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence

from celery_event_operator.core.api.models import Workers
from celery_event_operator.core.broker import versions
from celery_event_operator.core.lifecycle.stuck import TIME_LIMIT_MARGIN_SECONDS
from celery_event_operator.core.monitoring.reruns import Cause, Rerun

# Beyond the longest a task may run, before the broker gives its message to another worker.
CONSUMER_TIMEOUT_MARGIN_SECONDS = 60
DEFAULT_BROKER_CONSUMER_TIMEOUT_SECONDS = 1800  # RabbitMQ's default (rabbitmq.conf `consumer_timeout`)
# A task that ran this share of the timeout is about to be run twice.
WARN_SHARE = 0.8
RECENT_SECONDS = 3600.0  # re-runs said in status for this long
NAMED_TASKS = 5


def consumer_timeout_seconds(workers: Workers | None) -> int | None:
    """How long a worker's consumer of the handler queues may hold a delivery (asked of the broker per consumer):
    the tasks' limit, else the longest grace period, and a margin. None: the service has no workers spec."""
    if workers is None:
        return None
    if workers.max_task_runtime_seconds is not None:
        longest = workers.max_task_runtime_seconds
    elif workers.celery is not None and workers.celery.time_limit_seconds is not None:
        longest = workers.celery.time_limit_seconds + int(TIME_LIMIT_MARGIN_SECONDS)
    else:
        longest = workers.max_grace_period_seconds
    return longest + CONSUMER_TIMEOUT_MARGIN_SECONDS


@dataclasses.dataclass(frozen=True)
class AckTimeout:
    """The acknowledgement timeout the service's deliveries live under."""

    seconds: float | None  # None: the broker enforces none
    source: str  # where it comes from, for messages
    per_consumer: bool  # the workers' own (the broker honours x-consumer-timeout)
    askable: bool = False  # the broker would honour the workers' own, but they ask none (no spec.workers)


def ack_timeout(broker_version: str | None, broker_timeout: int, asked: int | None, queue_type: str) -> AckTimeout:
    """The timeout in effect on the service's handler queues: the one the workers ask for where the broker honours
    it, none where it enforces none, else the broker's own."""
    support = versions.ack_timeout_support(versions.parse(broker_version), queue_type)
    named = f"RabbitMQ {broker_version}" if broker_version else "the broker"
    if not support.enforced:
        return AckTimeout(None, f"none: {named} enforces no acknowledgement timeout on {queue_type} queues", False)
    if asked is not None and support.per_consumer:
        return AckTimeout(float(asked), f"x-consumer-timeout {asked} s, asked by the workers", per_consumer=True)
    source = f"consumer_timeout {broker_timeout} s of {named}"
    return AckTimeout(float(broker_timeout), source, per_consumer=False, askable=support.per_consumer)


@dataclasses.dataclass(frozen=True)
class RunOnce:
    """The TasksRunOnce condition: do the service's tasks run once?"""

    status: bool
    reason: str
    message: str
    causes: frozenset[Cause] = frozenset()  # of the re-runs said (one Event each)


_CAUSE_TEXT: dict[Cause, str] = {
    "ack_timeout": "after the broker's acknowledgement timeout delivered it again while it ran",
    "pod_stopped": "after its pod stopped while it ran (a rollout, a scale-in or an eviction)",
    "worker_lost": "after its worker process died, restarted or lost its connection while it ran",
}


def run_once(
    recent: Sequence[Rerun],
    *,
    timeout: AckTimeout,
    observed: float | None,
    grace: int | None,
) -> RunOnce:
    """From the re-runs of the last RECENT_SECONDS and the runtimes observed (what 99 % of recent tasks did not
    exceed, in powers of two; None: none ran), whether the tasks run once — and what to change when not."""
    if recent:
        parts = []
        by_cause: dict[Cause, list[Rerun]] = collections.defaultdict(list)
        for rerun in recent:
            by_cause[rerun.cause].append(rerun)
        for cause, reruns in by_cause.items():
            tasks = collections.Counter(rerun.task or "(name unknown)" for rerun in reruns)
            named = ", ".join(f"{task} ({count})" for task, count in tasks.most_common(NAMED_TASKS))
            more = len(tasks) - NAMED_TASKS
            longest = max(rerun.first_run_seconds for rerun in reruns)
            text = f"{len(reruns)} started again {_CAUSE_TEXT[cause]}: {named}{f' and {more} more' if more > 0 else ''}"
            text += f"; the longest first run lasted {longest:.0f} s"
            text += _advice(cause, timeout, grace)
            parts.append(text)
        message = "in the last hour, tasks ran twice — " + "; ".join(parts)
        return RunOnce(False, "TasksRerun", message, frozenset(by_cause))
    if observed is not None and timeout.seconds is not None and observed >= WARN_SHARE * timeout.seconds:
        message = (
            f"tasks will run twice: 99 % of the tasks of the last hour ran within {observed:.0f} s, near or past the "
            f"broker's acknowledgement timeout ({timeout.source}), after which it gives a task's message to another "
            f"worker while the first still runs it{_advice('ack_timeout', timeout, grace)}"
        )
        return RunOnce(False, "AckTimeoutTooShort", message)
    return RunOnce(
        True, "RunOnce", f"no task was started again in the last hour (acknowledgement timeout: {timeout.source})"
    )


def _advice(cause: Cause, timeout: AckTimeout, grace: int | None) -> str:
    if cause == "ack_timeout":
        if timeout.per_consumer:
            return (
                " (raise workers.maxTaskRuntimeSeconds, celery.timeLimitSeconds or maxGracePeriodSeconds: the workers "
                f"ask for {timeout.seconds:.0f} s)"
            )
        if timeout.askable:
            return (
                f" (the broker's timeout applies: {timeout.source}; give the service spec.workers — with "
                "maxTaskRuntimeSeconds, or celery.timeLimitSeconds — and its workers ask the broker for one longer "
                "than their tasks)"
            )
        return (
            f" (the broker's timeout applies: {timeout.source}; raise consumer_timeout in rabbitmq.conf above the "
            "longest task — or a consumer-timeout policy on the service's handler queues, RabbitMQ 3.12 or later — "
            "or run queueType: quorum on RabbitMQ 4.3 or later, where the workers ask for their own)"
        )
    if cause == "pod_stopped":
        given = f"{grace} s" if grace is not None else "the pod's"
        return f" (the grace period, {given}, was shorter: raise workers.maxGracePeriodSeconds)"
    return ""
