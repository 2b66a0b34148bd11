"""Typed models of the CeleryEventService and CeleryEventReplay resources: the single source of the CRD schemas.

Field constraints here become the CRD's openAPIV3Schema (see `crd.py`), and the same models
validate a resource inside the operator, so a spec that slipped past the API server (an old
CRD, a cluster without validation) is still caught before anything reaches the broker.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from celery_event_operator.core.errors import InvalidSpecError

VERSION = "v1alpha1"
KIND = "CeleryEventService"
PLURAL = "celeryeventservices"
SINGULAR = "celeryeventservice"
SHORT_NAMES = ("ces", "celeryevents")

# 2^20 s is about 12 days: a longer delay is a parking lot, not a retry; use the archive.
MAX_RETRIES_CAP = 20

# serviceName prefixes queue/exchange names (`S.<event>`, `S:retry.<n>`) and Kubernetes names
# (`S-celery-events` ConfigMap, label values), so it must satisfy both: DNS-1123 label, and free of
# the `.`/`:` separators the topology uses.
SERVICE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SERVICE_NAME_MAX_LENGTH = 48
# An event name is an AMQP routing key bound to a queue `S.<event>`: dot-separated words, no topic
# wildcards (a queue per handler needs one concrete key). 48 + 1 + 200 stays under AMQP's 255.
EVENT_NAME_PATTERN = r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$"
EVENT_NAME_MAX_LENGTH = 200
# AMQP short strings; `amq.` names are reserved by the broker.
EXCHANGE_NAME_PATTERN = r"^[A-Za-z0-9_.:-]+$"
VHOST_PATTERN = r"^[^\s]+$"
# A DNS-1123 subdomain: names of Secrets and workload objects.
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
K8S_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"

_SERVICE_NAME_RE = re.compile(SERVICE_NAME_PATTERN)

JsonDict = dict[str, JsonValue]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of the API, written once: CEL for the API server, the same check in the operator, one message.

    `check` is the rule over the model; a transition rule (one naming `oldSelf`) has none: it keeps the field
    `immutable` as it was at creation, which the operator checks against the last spec it accepted.
    """

    cel: str
    message: str
    check: Callable[[Any], bool] | None = None
    immutable: str | None = None  # the field (camelCase) a transition rule keeps unchanged

    def rendered(self) -> JsonDict:
        """Its `x-kubernetes-validations` entry."""
        return {"rule": self.cel, "message": self.message}


def immutable(field: str, *, optional: bool = False) -> Rule:
    """A field that cannot change after creation (an optional one can neither be set nor unset)."""
    cel = f"self.{field} == oldSelf.{field}"
    if optional:
        cel = f"has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || {cel})"
    return Rule(cel, f"{field} is immutable", immutable=field)


def _render_rules(schema: dict[str, JsonValue], cls: type[BaseModel]) -> None:
    rules: tuple[Rule, ...] = getattr(cls, "RULES", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.rendered() for rule in rules]


class Model(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error, as with kubectl."""

    RULES: ClassVar[tuple[Rule, ...]] = ()  # checked here, rendered into the CRD (crd.py)

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,  # "10" is not an integer to the API server either
        json_schema_extra=_render_rules,
    )

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        for rule in type(self).RULES:
            if rule.check is not None and not rule.check(self):
                raise ValueError(rule.message)
        return self


class SecretKeyRef(Model):
    name: Annotated[
        str,
        Field(pattern=K8S_NAME_PATTERN, max_length=253, description="Name of the Secret in the resource's namespace."),
    ]
    key: Annotated[str, Field(pattern=K8S_KEY_PATTERN, max_length=253, description="Key holding the broker URL.")] = (
        "url"
    )


class Broker(Model):
    RULES = (immutable("vhost", optional=True),)

    secret_ref: Annotated[
        SecretKeyRef,
        Field(
            description=(
                "Secret key holding the broker URL as Celery takes it (CELERY_BROKER_URL): "
                "amqp://, pyamqp:// or amqps://user:pass@host[:port]/vhost, '//' being the vhost '/'; "
                "several URLs separated by ';' form a failover list."
            )
        ),
    ]
    failover_strategy: Annotated[
        Literal["round-robin", "shuffle"], Field(description="How kombu walks the failover list.")
    ] = "round-robin"
    vhost: Annotated[
        str | None,
        Field(
            default=None,
            pattern=VHOST_PATTERN,
            max_length=255,
            description="Virtual host of the topology; overrides the URL's path. Immutable.",
        ),
    ] = None
    management_url: Annotated[
        str | None,
        Field(
            default=None,
            alias="managementURL",
            pattern=r"^https?://[^\s]+$",
            max_length=2048,
            description=(
                "RabbitMQ management API base URL (no credentials: those of the broker URL are used); "
                "derived from the broker host when unset."
            ),
        ),
    ] = None


class EventHandler(Model):
    name: Annotated[
        str,
        Field(
            pattern=EVENT_NAME_PATTERN,
            min_length=1,
            max_length=EVENT_NAME_MAX_LENGTH,
            description="Event name = routing key; consumed from queue `<serviceName>.<name>`.",
        ),
    ]


class Events(Model):
    RULES = (
        immutable("exchange"),
        Rule(
            "!self.exchange.startsWith('amq.')",
            "exchange names starting with 'amq.' are reserved by RabbitMQ",
            lambda events: not events.exchange.startswith("amq."),
        ),
        Rule(
            "self.handlers.all(h, h.name != 'celeryev')",
            "'celeryev' is reserved: the queue <serviceName>.celeryev carries the service's Celery events",
            lambda events: all(handler.name != "celeryev" for handler in events.handlers),
        ),
    )

    exchange: Annotated[
        str,
        Field(
            pattern=EXCHANGE_NAME_PATTERN,
            min_length=1,
            max_length=200,
            description="Shared topic exchange of the vhost; never deleted by the operator.",
        ),
    ] = "events"
    handlers: Annotated[
        list[EventHandler],
        Field(
            max_length=500,
            description="Events this service consumes; one queue each.",
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        ),
    ] = []

    @model_validator(mode="after")
    def _unique_handlers(self) -> Events:
        # The CRD says it with `x-kubernetes-list-map-keys: [name]`, which is no CEL rule.
        names = [handler.name for handler in self.handlers]
        if len(names) != len(set(names)):
            raise ValueError("handler names must be unique")
        return self


class Retry(Model):
    max_retries: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_RETRIES_CAP,
            description=(
                "Broker-side retry levels; level n delays 2^n seconds. 0 sends a failure straight to the archive."
            ),
        ),
    ] = 10


class Archive(Model):
    enabled: bool = True
    message_ttl_seconds: Annotated[
        int, Field(alias="messageTTLSeconds", ge=1, le=4_294_967, description=("How long an archived event is kept."))
    ] = 604_800
    max_length: Annotated[
        int,
        Field(ge=1, le=100_000_000, description=("How many archived events are kept; the oldest are dropped first.")),
    ] = 10_000


class ScaleTargetRef(Model):
    api_version: Annotated[Literal["apps/v1"], Field(description="API version of the workload.")] = "apps/v1"
    kind: Annotated[Literal["Deployment", "StatefulSet"], Field(description="Kind of the workload.")] = "Deployment"
    name: Annotated[
        str,
        Field(
            pattern=K8S_NAME_PATTERN, max_length=253, description="Name of the workload in the resource's namespace."
        ),
    ]


class CelerySettings(Model):
    """The worker settings a service may tune; the ones that keep messages safe are not offered."""

    RULES = (
        Rule(
            "!has(self.softTimeLimitSeconds) || !has(self.timeLimitSeconds)"
            " || self.softTimeLimitSeconds < self.timeLimitSeconds",
            "softTimeLimitSeconds must be below timeLimitSeconds",
            lambda settings: (
                settings.soft_time_limit_seconds is None
                or settings.time_limit_seconds is None
                or settings.soft_time_limit_seconds < settings.time_limit_seconds
            ),
        ),
    )

    prefetch_multiplier: Annotated[
        int,
        Field(ge=1, le=1000, description=("Messages each worker process reserves ahead (worker_prefetch_multiplier).")),
    ] = 1
    concurrency: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=1000,
            description=("Worker processes per pod (worker_concurrency); Celery's default when unset."),
        ),
    ] = None
    time_limit_seconds: Annotated[
        int | None, Field(default=None, ge=1, le=86_400, description=("Hard time limit of a task (task_time_limit)."))
    ] = None
    soft_time_limit_seconds: Annotated[
        int | None,
        Field(default=None, ge=1, le=86_400, description=("Soft time limit of a task (task_soft_time_limit).")),
    ] = None


class Workers(Model):
    scale_target_ref: Annotated[ScaleTargetRef, Field(description="The workload running this service's workers.")]
    rollout_on_change: Annotated[bool, Field(description=("Roll the workers when the injected settings change."))] = (
        True
    )
    replicas: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            le=10_000,
            description=("Desired workers (the scale subresource): applied to the target when autoscaling is off."),
        ),
    ] = None
    celery: Annotated[
        CelerySettings | None,
        Field(default=None, description=("Worker settings to tune; the rest is fixed by the operator.")),
    ] = None
    heal_unconfigured_pods: Annotated[
        bool,
        Field(
            description=(
                "Evict (one at a time, through the Eviction API) a pod of this service that runs without the "
                "injected settings, or with old ones when rolloutOnChange is true, once healAfterSeconds passed."
            )
        ),
    ] = True
    heal_after_seconds: Annotated[
        int,
        Field(ge=5, le=86_400, description="How long a pod may run without the current settings before it is evicted."),
    ] = 120
    set_deletion_cost: Annotated[
        bool,
        Field(
            description=(
                "Keep controller.kubernetes.io/pod-deletion-cost on the worker pods from the tasks they run (how long "
                "their longest task has run), so that any scale-down of a Deployment removes idle workers first."
            )
        ),
    ] = True
    replace_stuck_workers: Annotated[
        bool,
        Field(
            description=(
                "Evict (one at a time, through the Eviction API) a stuck worker: one that consumes from no handler "
                "queue while messages wait, or stopped sending heartbeats while it runs no task, for "
                "stuckAfterSeconds; or whose task runs past maxTaskRuntimeSeconds (else celery.timeLimitSeconds + "
                "30 s). A worker running a task is never judged on silence; a busy pod is never evicted; a "
                "replacement stuck for the same reason pauses the replacing. Stuck workers are reported either way "
                "(needs monitoring.enabled)."
            )
        ),
    ] = True
    stuck_after_seconds: Annotated[
        int,
        Field(
            ge=5,
            le=86_400,
            description=(
                "How long an idle worker may go without heartbeats, or any worker without consuming while messages "
                "wait, before it is stuck (a worker running a task is judged by its tasks instead)."
            ),
        ),
    ] = 120
    max_task_runtime_seconds: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=604_800,
            description=(
                "A task running longer than this has hung: its pod is stuck (and replaced when replaceStuckWorkers). "
                "Unset: celery.timeLimitSeconds + 30 s (the pool's own enforcement first; solo and threads pools do "
                "not enforce it); with neither, tasks are not judged on how long they run."
            ),
        ),
    ] = None
    max_grace_period_seconds: Annotated[
        int,
        Field(
            ge=30,
            le=86_400,
            description=(
                "The longest grace period (terminationGracePeriodSeconds) the webhook gives a new worker pod so that "
                "the tasks it runs finish on SIGTERM (a rollout, a scale-in, an eviction): it covers "
                "maxTaskRuntimeSeconds, else celery.timeLimitSeconds, else the task runtimes observed "
                "(status.gracePeriodSeconds says how much and why); a pod's own longer grace period is kept."
            ),
        ),
    ] = 3600


# What messagesPerReplica is when neither it nor targetWaitSeconds is set (KEDA's RabbitMQ scaler's default too).
DEFAULT_MESSAGES_PER_REPLICA = 20


class Autoscaling(Model):
    RULES = (
        Rule(
            "self.minReplicas <= self.maxReplicas",
            "minReplicas must not exceed maxReplicas",
            lambda autoscaling: autoscaling.min_replicas <= autoscaling.max_replicas,
        ),
        Rule(
            "!has(self.messagesPerReplica) || !has(self.targetWaitSeconds)",
            "set messagesPerReplica or targetWaitSeconds, not both",
            lambda autoscaling: autoscaling.messages_per_replica is None or autoscaling.target_wait_seconds is None,
        ),
    )

    enabled: bool = False
    min_replicas: Annotated[int, Field(ge=0, le=10_000)] = 1
    max_replicas: Annotated[int, Field(ge=1, le=10_000)] = 10
    # No schema default: the API server would put it beside every targetWaitSeconds (DEFAULT_MESSAGES_PER_REPLICA
    # applies when neither is set).
    messages_per_replica: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=1_000_000,
            description=(
                "Waiting messages one worker replica is meant for: desired = ceil(queueLength / this);"
                f" {DEFAULT_MESSAGES_PER_REPLICA} when neither this nor targetWaitSeconds is set."
            ),
        ),
    ] = None
    target_wait_seconds: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=86_400,
            description=(
                "Size the workers so that a task published now starts within this many seconds (the 95th percentile"
                " of its wait), from the arrivals, runtimes and backlog the operator observes; needs monitoring."
            ),
        ),
    ] = None
    activation_queue_length: Annotated[
        int,
        Field(ge=0, le=1_000_000, description=("From zero replicas, scale up only when more messages than this wait.")),
    ] = 0
    scale_down_stabilization_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=86_400,
            description=("Scale down only to the highest replica count recommended within this window."),
        ),
    ] = 300
    scale_up_limit_per_interval: Annotated[
        int, Field(ge=0, le=10_000, description=("Most replicas added per status interval; 0: no limit."))
    ] = 0


class Monitoring(Model):
    enabled: Annotated[bool, Field(description="Prometheus metrics from the service's Celery events.")] = True
    per_pod_task_series: Annotated[
        bool | None,
        Field(
            default=None,
            description=(
                "Label task series with the worker's hostname (celery-exporter's shape: a set of series per pod, "
                "new ones at every rollout). Unset: the operator's --per-pod-task-series (default false: task "
                "series per service, by name and queue)."
            ),
        ),
    ] = None
    max_task_names: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=100_000,
            description=(
                "Most distinct task names with series of their own (besides the handlers'); the events of the "
                'others count under name="__overflow__". Unset: the operator\'s --max-task-names (default 500).'
            ),
        ),
    ] = None


class CeleryEventServiceSpec(Model):
    RULES = (
        immutable("serviceName", optional=True),
        immutable("queueType"),
        Rule(
            "!has(self.deliveryLimit) || self.queueType == 'quorum'",
            "deliveryLimit applies to quorum queues only",
            lambda spec: spec.delivery_limit is None or spec.queue_type == "quorum",
        ),
        Rule(
            "!self.autoscaling.enabled || has(self.workers)",
            "autoscaling needs workers.scaleTargetRef",
            lambda spec: not spec.autoscaling.enabled or spec.workers is not None,
        ),
        Rule(
            "!has(self.autoscaling.targetWaitSeconds) || self.monitoring.enabled",
            "autoscaling.targetWaitSeconds needs monitoring.enabled: waits are judged from the Celery events",
            lambda spec: spec.autoscaling.target_wait_seconds is None or spec.monitoring.enabled,
        ),
    )

    service_name: Annotated[
        str | None,
        Field(
            default=None,
            pattern=SERVICE_NAME_PATTERN,
            min_length=1,
            max_length=SERVICE_NAME_MAX_LENGTH,
            description="Prefix of every queue and exchange; defaults to metadata.name. Immutable.",
        ),
    ] = None
    broker: Broker
    events: Events = Events()
    retry: Retry = Retry()
    archive: Archive = Archive()
    queue_type: Annotated[
        Literal["classic", "quorum"], Field(description=("Queue type of every queue of the service. Immutable."))
    ] = "classic"
    delivery_limit: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=1000,
            description=("Quorum only: deliveries before a message is dead-lettered (default 20)."),
        ),
    ] = None
    deletion_policy: Annotated[
        Literal["retain", "delete"],
        Field(description=("What happens to the service's queues and exchanges when the resource is deleted.")),
    ] = "retain"
    workers: Workers | None = None
    status_interval_seconds: Annotated[
        int, Field(ge=1, le=3600, description=("How often queue lengths are read into status and autoscaling decides."))
    ] = 15
    autoscaling: Autoscaling = Autoscaling()
    monitoring: Monitoring = Monitoring()


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Model):
    type: Annotated[str, Field(max_length=316)]
    status: ConditionStatus
    reason: Annotated[str, Field(max_length=1024)]
    message: Annotated[str, Field(max_length=32_768)] = ""
    observed_generation: Annotated[int | None, Field(default=None, ge=0)] = None
    last_transition_time: Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class AutoscalingStatus(Model):
    """What the wait target's last decision saw and concluded (written at a decision, else at most once a minute)."""

    target_wait_seconds: Annotated[int, Field(ge=1, description="spec.autoscaling.targetWaitSeconds.")]
    estimated_wait: Annotated[
        str, Field(max_length=100, description="The 95th percentile of the wait of a task published now, estimated.")
    ]
    measured_wait: Annotated[
        str, Field(max_length=200, description="The 95th percentile of the waits measured in the last minute.")
    ]
    arrivals: Annotated[str, Field(max_length=100, description="Tasks arriving per second.")]
    runtime: Annotated[str, Field(max_length=100, description="The mean runtime of the tasks lately.")]
    slots_per_pod: Annotated[int, Field(ge=0, description="Tasks one worker pod runs at once.")]
    capacity_per_pod: Annotated[str, Field(max_length=100, description="Tasks per second one pod runs.")]
    backlog: Annotated[int, Field(ge=0, description="Tasks waiting for a worker.")]
    reason: Annotated[str, Field(max_length=1000, description="Why the replicas are what they are.")]
    decided_at: Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class CeleryEventServiceStatus(Model):
    observed_generation: Annotated[int | None, Field(default=None, ge=0)] = None
    conditions: Annotated[
        list[Condition],
        Field(
            json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        ),
    ] = []
    queue_length: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description=(
                "Messages waiting in the handler queues (ready + unacked when the management API is reachable)."
            ),
        ),
    ] = None
    retrying: Annotated[int | None, Field(default=None, ge=0, description="Messages in retry levels.")] = None
    archived: Annotated[int | None, Field(default=None, ge=0, description="Messages in the archive.")] = None
    consumers: Annotated[int | None, Field(default=None, ge=0, description="Consumers of the handler queues.")] = None
    replicas: Annotated[int | None, Field(default=None, ge=0, description="Workers currently running.")] = None
    desired_replicas: Annotated[int | None, Field(default=None, ge=0)] = None
    selector: Annotated[str | None, Field(default=None, description="Label selector of the worker pods.")] = None
    last_scale_time: Annotated[str | None, Field(default=None, json_schema_extra={"format": "date-time"})] = None
    grace_period_seconds: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description=(
                "The grace period (terminationGracePeriodSeconds) the webhook gives new worker pods: long enough for "
                "the tasks they run to finish on SIGTERM."
            ),
        ),
    ] = None
    grace_period_basis: Annotated[
        str | None, Field(default=None, max_length=1000, description="What gracePeriodSeconds covers, and why.")
    ] = None
    autoscaling: Annotated[
        AutoscalingStatus | None,
        Field(default=None, description="The wait target's figures (autoscaling.targetWaitSeconds)."),
    ] = None


# --- CeleryEventReplay: a replay or purge of a service's archive, run by the operator -------------------------

REPLAY_KIND = "CeleryEventReplay"
REPLAY_PLURAL = "celeryeventreplays"
REPLAY_SINGULAR = "celeryeventreplay"
REPLAY_SHORT_NAMES = ("cer",)
# Python class names, as the runtime records a failure's exception (`type(exc).__name__`).
EXCEPTION_TYPE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# What a filter may list, and what status shows of the messages: bounded, whatever the archive holds.
MAX_FILTER_EVENTS = 100
MAX_FILTER_EXCEPTION_TYPES = 50
MAX_FILTER_TASK_IDS = 1000
PREVIEW_SIZE = 20
SHOWN_EXCEPTION_LENGTH = 300
TEN_YEARS_SECONDS = 315_360_000

EventName = Annotated[str, Field(pattern=EVENT_NAME_PATTERN, min_length=1, max_length=EVENT_NAME_MAX_LENGTH)]
ExceptionType = Annotated[str, Field(pattern=EXCEPTION_TYPE_PATTERN, min_length=1, max_length=200)]
TaskId = Annotated[str, Field(min_length=1, max_length=255)]  # an AMQP short string


class ServiceRef(Model):
    name: Annotated[
        str,
        Field(
            pattern=K8S_NAME_PATTERN,
            max_length=253,
            description="Name of the CeleryEventService, in the replay's own namespace (there is no other).",
        ),
    ]


class ReplayFilter(Model):
    """Which archived events are taken; every part given must hold (an empty filter takes them all)."""

    RULES = (
        Rule(
            "!has(self.olderThanSeconds) || !has(self.newerThanSeconds)"
            " || self.olderThanSeconds < self.newerThanSeconds",
            "olderThanSeconds must be below newerThanSeconds (the age window would be empty)",
            lambda f: (
                f.older_than_seconds is None
                or f.newer_than_seconds is None
                or f.older_than_seconds < f.newer_than_seconds
            ),
        ),
    )

    events: Annotated[
        list[EventName],
        Field(max_length=MAX_FILTER_EVENTS, description="Only these events (routing keys); any when empty."),
    ] = []
    exception_types: Annotated[
        list[ExceptionType],
        Field(
            max_length=MAX_FILTER_EXCEPTION_TYPES,
            description="Only events archived after one of these exceptions (class names, e.g. TypeError).",
        ),
    ] = []
    task_ids: Annotated[
        list[TaskId], Field(max_length=MAX_FILTER_TASK_IDS, description="Only the events of these Celery task ids.")
    ] = []
    older_than_seconds: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            le=TEN_YEARS_SECONDS,
            description="Only events archived at least this long before the replay was created.",
        ),
    ] = None
    newer_than_seconds: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=TEN_YEARS_SECONDS,
            description="Only events archived at most this long before the replay was created.",
        ),
    ] = None


REPLAY_SPEC_IMMUTABLE = Rule("self == oldSelf", "a replay's spec is immutable: create another replay")


class CeleryEventReplaySpec(Model):
    RULES = (
        Rule(
            "self.action != 'purge' || self.dryRun || self.confirm",
            "a purge deletes archived events for good: set confirm: true (or dryRun: true to see what it would take)",
            lambda spec: spec.action != "purge" or spec.dry_run or spec.confirm,
        ),
        REPLAY_SPEC_IMMUTABLE,
    )

    service_ref: Annotated[ServiceRef, Field(description="The service whose archive this acts on.")]
    action: Annotated[
        Literal["replay", "purge"],
        Field(description="replay: back to the service's handler queues; purge: deleted for good."),
    ] = "replay"
    filter: Annotated[ReplayFilter, Field(description="Which archived events; all of them when empty.")] = (
        ReplayFilter()
    )
    limit: Annotated[
        int | None, Field(default=None, ge=1, le=100_000_000, description="At most this many, oldest first.")
    ] = None
    rate_per_second: Annotated[
        int | None,
        Field(
            default=None,
            ge=1,
            le=100_000,
            description="At most this many a second; as fast as the broker confirms when unset.",
        ),
    ] = None
    dry_run: Annotated[
        bool, Field(description="Count what would be taken and show the first ones in status; change nothing.")
    ] = False
    confirm: Annotated[bool, Field(description="Required with action purge (unless dryRun).")] = False


class ArchivedMessage(Model):
    """One archived event as status shows it (never its arguments: they may hold personal data)."""

    event: Annotated[str, Field(max_length=255)]
    task_id: Annotated[str | None, Field(default=None, max_length=255)] = None
    exception: Annotated[
        str | None,
        Field(
            default=None,
            max_length=SHOWN_EXCEPTION_LENGTH,
            description="The exception's class (its message may echo the arguments: not shown).",
        ),
    ] = None
    archived_at: Annotated[str | None, Field(default=None, json_schema_extra={"format": "date-time"})] = None


Count = Annotated[int | None, Field(default=None, ge=0)]


class CeleryEventReplayStatus(Model):
    observed_generation: Annotated[int | None, Field(default=None, ge=0)] = None
    conditions: Annotated[
        list[Condition],
        Field(json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}),
    ] = []
    service_name: Annotated[
        str | None, Field(default=None, description="The serviceName whose archive is acted on.")
    ] = None
    archived: Annotated[int | None, Field(default=None, ge=0, description="Events in the archive at the start.")] = None
    matched: Annotated[
        int | None,
        Field(default=None, ge=0, description="Events archived before startTime that the filter selects."),
    ] = None
    replayed: Annotated[int | None, Field(default=None, ge=0, description="Sent back, the copy confirmed.")] = None
    purged: Annotated[int | None, Field(default=None, ge=0, description="Deleted from the archive.")] = None
    skipped: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="Selected but left archived: beyond the limit, or no queue takes them any more.",
        ),
    ] = None
    remaining: Annotated[int | None, Field(default=None, ge=0, description="Still to replay or purge.")] = None
    first_message: Annotated[ArchivedMessage | None, Field(default=None, description="The first one taken.")] = None
    last_message: Annotated[ArchivedMessage | None, Field(default=None, description="The last one taken so far.")] = (
        None
    )
    preview: Annotated[
        list[ArchivedMessage],
        Field(max_length=PREVIEW_SIZE, description=f"With dryRun: the first {PREVIEW_SIZE} it would take."),
    ] = []
    start_time: Annotated[
        str | None,
        Field(
            default=None,
            json_schema_extra={"format": "date-time"},
            description="When it started; only events archived before it are taken.",
        ),
    ] = None
    completion_time: Annotated[str | None, Field(default=None, json_schema_extra={"format": "date-time"})] = None


# At the root of the resource, where metadata.name is seen (the spec's own schema cannot see it): without
# spec.serviceName, the name prefixes every RabbitMQ name and must be a valid one.
SERVICE_NAME_RULE = Rule(
    f"has(self.spec.serviceName) || (size(self.metadata.name) <= {SERVICE_NAME_MAX_LENGTH}"
    f" && self.metadata.name.matches('{SERVICE_NAME_PATTERN}'))",
    "metadata.name cannot prefix RabbitMQ names: set spec.serviceName",
)


def effective_service_name(spec: CeleryEventServiceSpec, resource_name: str) -> str:
    """`spec.serviceName`, else the resource name — which the CRD's schema cannot constrain."""
    name = spec.service_name or resource_name
    if len(name) > SERVICE_NAME_MAX_LENGTH or not _SERVICE_NAME_RE.match(name):
        raise InvalidSpecError(SERVICE_NAME_RULE.message)
    return name


def parse_spec(raw_spec: Any) -> CeleryEventServiceSpec:
    """Validate a raw spec; errors become one readable InvalidSpecError (field paths, no input values)."""
    return _parsed(CeleryEventServiceSpec, raw_spec)


def parse_replay_spec(raw_spec: Any) -> CeleryEventReplaySpec:
    """A CeleryEventReplay's spec, validated as parse_spec validates a service's."""
    return _parsed(CeleryEventReplaySpec, raw_spec)


M = TypeVar("M", bound=BaseModel)


def _parsed(model: type[M], raw_spec: Any) -> M:
    try:
        return model.model_validate(raw_spec)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'spec'}: {error['msg']}"
            for error in exc.errors(include_input=False, include_url=False)
        )
        raise InvalidSpecError(f"invalid spec: {problems}") from exc


def immutable_paths(model: type[BaseModel] | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The spec's immutable fields as camelCase paths (`("broker", "vhost")`), from the models' transition rules."""
    model = model or CeleryEventServiceSpec
    rules: tuple[Rule, ...] = getattr(model, "RULES", ())
    paths = [(*prefix, rule.immutable) for rule in rules if rule.immutable]
    for name, field in model.model_fields.items():
        for candidate in get_args(field.annotation) or (field.annotation,):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                paths += immutable_paths(candidate, (*prefix, field.alias or name))
    return paths
