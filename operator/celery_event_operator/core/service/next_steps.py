"""What happens next, said at the end of every service condition that is not True (pure): when the operator looks
again by itself, and what only a person can change.

A message says what went wrong, often in the broker's or the API's own words; this says what follows, as kopf's
`TemporaryError(delay=…)` and the replays' "…; trying again" do. Every reason a service condition can carry has its
line in NEXT_STEPS (the unit table lists them all, so a new reason without one fails it); a reason whose message
already says what follows (another resource owns the service, tasks that ran twice and what to change) has None.
The texts hold no countdown: a message that stays the same while its failure does is one Event, not one per pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from celery_event_operator.core.broker.address import ManagementURLRejectedError
from celery_event_operator.core.broker.backoff import BACKOFF_MAX_SECONDS
from celery_event_operator.core.errors import (
    ArchiveNotFoundError,
    BrokerRefusedError,
    BrokerSecretError,
    BrokerUnavailableError,
    ImmutableFieldChangedError,
    InvalidSpecError,
    KubeError,
    KubeForbiddenError,
    KubeUnavailableError,
    ManagementUnavailableError,
    NotFoundError,
    UnsupportedOperationError,
)


@dataclasses.dataclass(frozen=True)
class Rhythm:
    """When the operator looks at a service again by itself."""

    resync_seconds: float  # every resource is reconciled again (the operator's --resync-seconds)
    api_retry_seconds: float  # sooner, when a read of the Kubernetes API was not answered
    status_seconds: float  # the service's statusIntervalSeconds: queue lengths, workers, alarms


def _seconds(value: float) -> str:
    return f"{value:.0f} s"


def _again(rhythm: Rhythm) -> str:
    return f"tried again within {_seconds(rhythm.resync_seconds)}"


NEXT_STEPS: dict[str, Callable[[Rhythm], str] | None] = {
    # Ready False: the spec.
    InvalidSpecError.reason: lambda _: "nothing is done until the spec is corrected",
    ImmutableFieldChangedError.reason: None,  # "(set it back, or create a new resource)"
    # BrokerReachable, TopologyReady, Ready.
    BrokerSecretError.reason: lambda r: f"the Secret is read again within {_seconds(r.resync_seconds)}",
    ManagementURLRejectedError.reason: lambda r: f"the Secret is read again within {_seconds(r.resync_seconds)}",
    BrokerUnavailableError.reason: _again,
    BrokerRefusedError.reason: lambda r: f"{_again(r)}; the broker's user needs the rights to declare it",
    UnsupportedOperationError.reason: lambda r: f"{_again(r)}; the broker must support it (see its version)",
    ManagementUnavailableError.reason: _again,
    KubeUnavailableError.reason: lambda r: f"asked again within {_seconds(r.api_retry_seconds)}",
    KubeForbiddenError.reason: lambda r: f"{_again(r)}; the operator's RBAC must allow it",
    KubeError.reason: _again,
    NotFoundError.reason: _again,
    ArchiveNotFoundError.reason: _again,  # a replay's (its own conditions say what follows); listed for completeness
    "BrokerAlarm": lambda r: (
        f"publishers stay blocked until RabbitMQ clears it; checked every {_seconds(r.status_seconds)}"
    ),
    "ArgumentMismatch": lambda r: f"compared again within {_seconds(r.resync_seconds)}",
    "TopologyMismatch": lambda r: f"compared again within {_seconds(r.resync_seconds)}",
    "WorkersNotConfigured": lambda r: f"written again within {_seconds(r.resync_seconds)}",
    "ServiceNameConflict": None,  # "…takes it over once that resource is gone (set a spec.serviceName of its own…)"
    # WorkersConfigured.
    "ConfigMapFailed": lambda r: f"written again within {_seconds(r.resync_seconds)}",
    "ScaleTargetNotFound": lambda r: f"looked for again within {_seconds(r.resync_seconds)}",
    "RolloutPending": None,  # how the other pods get the settings (conclusion._workers)
    # WorkersHealthy.
    "NotChecked": lambda r: f"checked again every {_seconds(r.status_seconds)}",
    "WorkersStuck": None,  # whether they are replaced (conclusion._lifecycle)
    # TasksRunOnce: each message ends with what to change (core/lifecycle/long_tasks.py).
    "TasksRerun": None,
    "AckTimeoutTooShort": None,
    # MonitoringReady.
    "EventsNotConsumed": lambda _: (
        f"the consumer connects again by itself, at most {_seconds(BACKOFF_MAX_SECONDS)} apart"
    ),
}


def next_step(reason: str, rhythm: Rhythm) -> str | None:
    """What follows a condition of this reason that is not True; None when its message says it already."""
    step = NEXT_STEPS.get(reason)
    return step(rhythm) if step is not None else None


def with_next_step(message: str, reason: str, rhythm: Rhythm) -> str:
    step = next_step(reason, rhythm)
    return f"{message}; {step}" if step and message else step or message
