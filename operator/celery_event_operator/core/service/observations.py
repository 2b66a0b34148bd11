"""What one pass of a service observed, step by step (pure data): the input of its conclusion.

A reconcile observes the spec, the broker and its topology, the workers' settings and the events consumer; a
status pass observes the queues, the workers' replicas (and what scaling them did), healing and the consumer.
What a pass did not observe is None: the conclusion keeps what the status says of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from celery_event_operator.core.api.models import AutoscalingStatus, CeleryEventServiceSpec
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.injection.outcome import WorkersOutcome
from celery_event_operator.core.lifecycle.grace import Grace
from celery_event_operator.core.lifecycle.long_tasks import RunOnce
from celery_event_operator.core.lifecycle.stuck import Judgement, StuckWorker
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service.ownership import Claim, Claimant
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.outcome import DeclareOutcome


@dataclasses.dataclass(frozen=True)
class QueuesSeen:
    """The service's queue depths; None when they could not be read (then `problem` says why)."""

    depths: tuple[QueueDepth, ...] | None
    source: str = ""  # how they were counted ("ready + unacknowledged", or ready only and why)
    problem: str | None = None


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A change of the workers' replicas, done."""

    target: str  # "Deployment/name"
    before: int
    after: int
    why: str
    at: str  # when (RFC 3339)


@dataclasses.dataclass(frozen=True)
class ScalingSeen:
    """The workers' replicas: what runs, what is wished, and what changing them did."""

    selector: str  # of the worker pods (the scale subresource)
    replicas: int | None = None  # live pods, once the workload's scale is known
    desired: int | None = None  # the autoscaler's or spec.workers.replicas' wish
    workload: int | None = None  # the workload's own desired replicas (its /scale), as last read
    scale_checked: bool = False  # the workload's /scale was read (or known) this pass
    scale_problem: str | None = None  # the workload's /scale could not be read
    scaled: Scaled | None = None
    failed: str | None = None  # the change of replicas was refused
    autoscaling: AutoscalingStatus | None = None  # the wait target's figures, when it decided
    estimated_wait: float | None = None  # the wait target's estimate at the replicas decided (None: none)


@dataclasses.dataclass(frozen=True)
class MonitoringSeen:
    """The service's events consumer: `problem` None while it consumes."""

    enabled: bool
    problem: str | None = None
    own_failure: bool = False  # the consumer's own (not the broker's, not a connection still being made)


@dataclasses.dataclass(frozen=True)
class LifecycleSeen:
    """The workers' lifecycle: which Running pods on the current settings are stuck (judged only on what is known),
    the deletion costs written, and the pods that are busy (never evicted)."""

    judgement: Judgement
    threshold: float  # stuckAfterSeconds
    unchecked: str | None = None  # why the pods were not judged this pass
    costs_written: int = 0
    busy: frozenset[str] = frozenset()  # pods whose deletion cost says they are busy

    @property
    def stuck(self) -> tuple[StuckWorker, ...]:
        return self.judgement.stuck if self.unchecked is None else ()


@dataclasses.dataclass(frozen=True)
class Evicted:
    pod: str
    why: str


@dataclasses.dataclass(frozen=True)
class OwnershipSeen:
    """The claim on the service's topology (on the broker): ours, or who holds it."""

    service: str
    claimant: Claimant
    claim: Claim
    broker: str  # host:port and vhost, for messages


@dataclasses.dataclass(frozen=True)
class Observations:
    generation: int | None
    spec: CeleryEventServiceSpec | None = None  # None: invalid (`invalid` says why)
    invalid: InvalidSpecError | None = None
    ownership: OwnershipSeen | None = None  # None: not claimed this pass (no usable broker, or a status pass)
    declared: Declared = dataclasses.field(default_factory=Declared)  # what the resource remembers declaring
    topology: DeclareOutcome | None = None
    workers: WorkersOutcome | None = None
    queues: QueuesSeen | None = None
    scaling: ScalingSeen | None = None
    monitoring: MonitoringSeen | None = None
    lifecycle: LifecycleSeen | None = None
    evicted: Evicted | None = None
    overflowing: Mapping[str, tuple[int, int]] | None = None  # metric labels past their bound: (refused, kept)
    # The broker Secret has not been readable for long (the Kubernetes API does not answer): the settings last read
    # are still used; why, said once.
    settings_unavailable: str | None = None
    # The broker's resource alarms in effect (it blocks publishers); None: not seen (no management API).
    alarms: tuple[Alarm, ...] | None = None
    grace: Grace | None = None  # the grace period new worker pods get (None: not worked out this pass)
    run_once: RunOnce | None = None  # do the service's tasks run once (None: not known: no events)
