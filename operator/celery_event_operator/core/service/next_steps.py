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
    status_seconds: float  # the service's statusIntervalSeconds: queue lengths, workers, alarms


def _seconds(value: float) -> str:
    return f"{value:.0f} s"


def _resync(rhythm: Rhythm) -> str:
    """A resync comes every --resync-seconds, jittered by a tenth, after the pass before it ended."""
    return f"at the next resync (about every {_seconds(rhythm.resync_seconds)})"


def _again(rhythm: Rhythm) -> str:
    return f"tried again {_resync(rhythm)}"


NEXT_STEPS: dict[str, Callable[[Rhythm], str] | None] = {
    # Ready False: the spec.
    InvalidSpecError.reason: lambda _: "nothing is done until the spec is corrected",
    ImmutableFieldChangedError.reason: None,  # "(set it back, or create a new resource)"
    # BrokerReachable, TopologyReady, Ready.
    BrokerSecretError.reason: lambda r: f"the Secret is read again {_resync(r)}",
    ManagementURLRejectedError.reason: lambda r: f"the Secret is read again {_resync(r)}",
    # A failed connection is not tried again before its backoff ends, whatever the resyncs (control.py).
    BrokerUnavailableError.reason: lambda r: (
        f"{_again(r)}, and no more often than its backoff allows (up to {_seconds(BACKOFF_MAX_SECONDS)})"
    ),
    BrokerRefusedError.reason: lambda r: f"{_again(r)}; what the broker refused must change first",
    UnsupportedOperationError.reason: lambda r: f"{_again(r)}; the broker must support it first",
    ManagementUnavailableError.reason: _again,
    KubeUnavailableError.reason: lambda _: "asked again in a few seconds",
    KubeForbiddenError.reason: lambda r: f"{_again(r)}; the operator's RBAC must allow it first",
    KubeError.reason: _again,
    NotFoundError.reason: _again,
    "BrokerAlarm": lambda r: (
        f"publishers stay blocked until RabbitMQ clears it; checked about every {_seconds(r.status_seconds)}"
    ),
    "ArgumentMismatch": lambda r: f"compared again {_resync(r)}",
    "TopologyMismatch": lambda r: f"compared again {_resync(r)}",
    "WorkersNotConfigured": lambda r: f"written again {_resync(r)}",
    "ServiceNameConflict": None,  # "…takes it over once that resource is gone (set a spec.serviceName of its own…)"
    # WorkersConfigured.
    "ConfigMapFailed": lambda r: f"written again {_resync(r)}",
    "ScaleTargetNotFound": lambda r: f"looked for again {_resync(r)}",
    "RolloutPending": None,  # how the other pods get the settings (conclusion._workers)
    "SettingsNotInjected": None,  # no webhook: the pods mount the settings themselves, unchecked (said so)
    # WorkersHealthy: each text says what it waits for (core/lifecycle/stuck.py); whether stuck ones are replaced.
    "NotChecked": None,
    "WorkersStuck": None,
    # TasksRunOnce: each message ends with what to change (core/lifecycle/long_tasks.py).
    "TasksRerun": None,
    "AckTimeoutTooShort": None,
    # MonitoringReady: the consumer's connection backs off by itself; without a broker, the resyncs bring one.
    "EventsNotConsumed": lambda _: (
        f"consumed by itself once the broker can be reached and allows it (retried, backing off up to "
        f"{_seconds(BACKOFF_MAX_SECONDS)})"
    ),
}


def next_step(reason: str, rhythm: Rhythm) -> str | None:
    """What follows a condition of this reason that is not True; None when its message says it already."""
    step = NEXT_STEPS.get(reason)
    return step(rhythm) if step is not None else None


def with_next_step(message: str, reason: str, rhythm: Rhythm) -> str:
    """The message and what follows; once (a message carried over from another condition may have it already)."""
    step = next_step(reason, rhythm)
    if not step or message.endswith(step):
        return message
    return f"{message}; {step}" if message else step
