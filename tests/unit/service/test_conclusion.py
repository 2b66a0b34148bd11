"""The whole status of a service concluded from what a pass observed (pure): tables of observations → status,
Events and annotations — the cases of the reconcile, of the status pass and of the events consumer."""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

import pytest

from celery_event_operator.core.api.metadata import DECLARED_ANNOTATION
from celery_event_operator.core.api.models import CeleryEventServiceSpec, CeleryEventServiceStatus, parse_spec
from celery_event_operator.core.broker.address import ManagementURLRejectedError
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import (
    BrokerRefusedError,
    BrokerSecretError,
    BrokerUnavailableError,
    ImmutableFieldChangedError,
    InvalidSpecError,
    KubeForbiddenError,
    KubeUnavailableError,
    UnsupportedOperationError,
)
from celery_event_operator.core.injection.outcome import WorkersOutcome
from celery_event_operator.core.lifecycle.grace import Grace
from celery_event_operator.core.lifecycle.long_tasks import RunOnce
from celery_event_operator.core.lifecycle.stuck import Judgement, StuckWorker
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service.conclusion import (
    Announced,
    Conclusion,
    conclude,
    conclude_deletion,
    patch_of,
    settled,
    status_of,
)
from celery_event_operator.core.service.next_steps import NEXT_STEPS, Rhythm
from celery_event_operator.core.service.observations import (
    Evicted,
    LifecycleSeen,
    MonitoringSeen,
    Observations,
    QueuesSeen,
    Scaled,
    ScalingSeen,
)
from celery_event_operator.core.service.ownership import Claimant
from celery_event_operator.core.topology import outcome, plan
from celery_event_operator.core.topology.declared import Declared, DeclaredQueue
from celery_event_operator.core.topology.outcome import DeclareOutcome

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=1)
GOOD_SPEC = {
    "broker": {"secretRef": {"name": "rabbitmq"}},
    "events": {"handlers": [{"name": "e"}]},
    "retry": {"maxRetries": 1},
    "workers": {"scaleTargetRef": {"kind": "Deployment", "name": "w"}},
}
SPEC = parse_spec(GOOD_SPEC)
AUTOSCALED = parse_spec({**GOOD_SPEC, "autoscaling": {"enabled": True}})
TOPOLOGY = plan.plan("billing", SPEC)
HEALTHY = DeclareOutcome(TOPOLOGY, "h:5672 vhost '/'", report=outcome.Report())
DEPTHS = (
    QueueDepth("billing.e", "events", 7, 2),
    QueueDepth("billing:retry", "retry", 3, 0),
    QueueDepth("billing:archived", "archive", 1, 0),
)
SELECTOR = "celeryevents.io/service=billing"
CLAIMANT = Claimant("operator", "default", "billing", "uid")
RHYTHM = Rhythm(resync_seconds=30, status_seconds=15)


def reconciled(topology: DeclareOutcome = HEALTHY, **seen: Any) -> Observations:
    return Observations(3, SPEC, topology=topology, **seen)


def status_passed(spec: CeleryEventServiceSpec = SPEC, **seen: Any) -> Observations:
    return Observations(3, spec, **seen)


def run(*passes: Observations, status: CeleryEventServiceStatus | None = None) -> list[Conclusion]:
    """Passes one after the other, each from the last one's status and memory, as the keeper runs them."""
    previous, announced, found = status or CeleryEventServiceStatus(), Announced(), []
    for number, seen in enumerate(passes):
        conclusion = conclude(previous, seen, announced, NOW + datetime.timedelta(minutes=number), RHYTHM)
        previous, announced = conclusion.status, conclusion.announced
        # Every condition that is not True says what happens next (a reason without its line fails here).
        assert {c.reason for c in previous.conditions if c.status != "True"} <= set(NEXT_STEPS)
        found.append(conclusion)
    return found


def conditions(conclusion: Conclusion) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in conclusion.status.conditions}


def events(conclusion: Conclusion) -> list[tuple[str, str]]:
    return [(note.type, note.reason) for note in conclusion.events]


# --- the reconcile --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seen", "expected", "expected_events"),
    [
        pytest.param(
            reconciled(),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
            },
            [],
            id="healthy",
        ),
        pytest.param(
            Observations(3, invalid=InvalidSpecError("invalid spec: retry.maxRetries: too large")),
            {"Ready": ("False", "InvalidSpec")},
            [("Warning", "InvalidSpec")],
            id="invalid-spec",
        ),
        pytest.param(
            Observations(3, invalid=ImmutableFieldChangedError("queueType is immutable")),
            {"Ready": ("False", "ImmutableFieldChanged")},
            [("Warning", "ImmutableFieldChanged")],
            id="immutable-changed",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, failure=BrokerSecretError("Secret default/rabbitmq does not exist"))),
            {
                "Ready": ("False", "BrokerSecretInvalid"),
                "BrokerReachable": ("False", "BrokerSecretInvalid"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "BrokerSecretInvalid")],
            id="secret-invalid",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, failure=KubeUnavailableError("cannot read Secret x: HTTP 503"))),
            {
                "Ready": ("False", "KubernetesAPIUnavailable"),
                "BrokerReachable": ("False", "KubernetesAPIUnavailable"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "KubernetesAPIUnavailable")],
            id="secret-never-read-api-unavailable",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, failure=KubeForbiddenError("HTTP 403: lacks `get` on secrets"))),
            {
                "Ready": ("False", "KubernetesAPIForbidden"),
                "BrokerReachable": ("False", "KubernetesAPIForbidden"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "KubernetesAPIForbidden")],
            id="secret-forbidden",
        ),
        pytest.param(
            reconciled(alarms=(Alarm("memory", "rabbit@a"),)),
            {
                "Ready": ("False", "BrokerAlarm"),
                "BrokerReachable": ("False", "BrokerAlarm"),
                "TopologyReady": ("True", "Declared"),
            },
            [("Warning", "BrokerAlarm")],
            id="broker-alarm",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("down")), alarms=(Alarm("disk", "r@a"),)),
            {
                "Ready": ("False", "BrokerUnreachable"),
                "BrokerReachable": ("False", "BrokerUnreachable"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "BrokerUnreachable")],
            id="unreachable-before-alarm",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", unavailable="cannot read ConfigMap default/x: HTTP 500")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("Unknown", "KubernetesAPIUnavailable"),
            },
            [],
            id="workers-never-checked-api-unavailable",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, failure=ManagementURLRejectedError("another host"))),
            {
                "Ready": ("False", "ManagementURLRejected"),
                "BrokerReachable": ("False", "ManagementURLRejected"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "ManagementURLRejected")],
            id="management-url-rejected",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("cannot reach the broker"))),
            {
                "Ready": ("False", "BrokerUnreachable"),
                "BrokerReachable": ("False", "BrokerUnreachable"),
                "TopologyReady": ("Unknown", "BrokerUnreachable"),
            },
            [("Warning", "BrokerUnreachable")],
            id="unreachable",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, "h", BrokerRefusedError("access refused"))),
            {
                "Ready": ("False", "BrokerRefused"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("False", "BrokerRefused"),
            },
            [("Warning", "BrokerRefused")],
            id="refused",
        ),
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, "h", UnsupportedOperationError("if-empty on a quorum queue"))),
            {
                "Ready": ("False", "UnsupportedOperation"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("False", "UnsupportedOperation"),
            },
            [("Warning", "UnsupportedOperation")],
            id="unsupported",
        ),
        pytest.param(
            reconciled(
                DeclareOutcome(
                    TOPOLOGY,
                    "h",
                    report=outcome.Report(problems=[outcome.Problem("billing:archived", "another x-max-length")]),
                )
            ),
            {
                "Ready": ("False", "TopologyMismatch"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("False", "ArgumentMismatch"),
            },
            [("Warning", "ArgumentMismatch")],
            id="argument-mismatch",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", configmap_error="cannot write ConfigMap default/x: HTTP 403")),
            {
                "Ready": ("False", "WorkersNotConfigured"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("False", "ConfigMapFailed"),
            },
            [("Warning", "ConfigMapFailed")],
            id="configmap-failed",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", pods=2, pods_current=2)),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("True", "SettingsCurrent"),
            },
            [],
            id="workers-current",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("True", "SettingsCurrent"),
            },
            [],
            id="no-pods-yet",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", stamped="Deployment/w", pods=2, pods_current=0)),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("False", "RolloutPending"),
            },
            [("Normal", "RolloutStarted")],
            id="rolling-out",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", pods=2, pods_current=0, mounted_from="billing-celery-events")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("Unknown", "SettingsNotInjected"),
            },
            [],
            id="no-webhook-pods-mount-the-settings-unchecked",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", pods=2, pods_current=2, mounted_from="billing-celery-events")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("True", "SettingsCurrent"),
            },
            [],
            id="no-webhook-pods-stamped-before",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", target_error="Deployment default/w does not exist")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "WorkersConfigured": ("False", "ScaleTargetNotFound"),
            },
            [("Warning", "ScaleTargetNotFound")],
            id="target-missing",
        ),
        pytest.param(
            reconciled(monitoring=MonitoringSeen(True)),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "MonitoringReady": ("True", "Consuming"),
            },
            [],
            id="consuming",
        ),
        pytest.param(
            reconciled(monitoring=MonitoringSeen(True, "not connected yet")),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "MonitoringReady": ("False", "EventsNotConsumed"),
            },
            [],
            id="consumer-connecting-is-no-event",
        ),
        pytest.param(
            reconciled(monitoring=MonitoringSeen(True, "queue billing.celeryev missing", own_failure=True)),
            {
                "Ready": ("True", "Reconciled"),
                "BrokerReachable": ("True", "Connected"),
                "TopologyReady": ("True", "Declared"),
                "MonitoringReady": ("False", "EventsNotConsumed"),
            },
            [("Warning", "EventsNotConsumed")],
            id="consumer-failure",
        ),
    ],
)
def test_a_pass_concludes_conditions_and_events(
    seen: Observations, expected: dict[str, tuple[str, str]], expected_events: list[tuple[str, str]]
) -> None:
    [conclusion] = run(seen)
    assert conditions(conclusion) == expected
    assert list(conditions(conclusion)) == sorted(
        expected, key=["Ready", "BrokerReachable", "TopologyReady", "WorkersConfigured", "MonitoringReady"].index
    ), "conditions in a fixed order"
    assert events(conclusion) == expected_events
    assert conclusion.status.observed_generation == 3


def test_the_same_failure_again_posts_nothing_and_a_recovery_posts_one_event() -> None:
    down = reconciled(DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("cannot reach the broker")))
    first, again, back = run(down, down, reconciled())
    assert events(first) == [("Warning", "BrokerUnreachable")]
    assert events(again) == []
    assert events(back) == [("Normal", "Connected")]
    broker = next(c for c in back.status.conditions if c.type == "BrokerReachable")
    assert broker.last_transition_time == "2026-01-01T00:02:00Z", "moved with the status, not with each pass"


@pytest.mark.parametrize(
    "blip",
    [
        pytest.param(
            reconciled(DeclareOutcome(TOPOLOGY, failure=KubeUnavailableError("cannot read Secret x: HTTP 500"))),
            id="secret-unread",
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", unavailable="cannot read ConfigMap x: HTTP 429")), id="cm"
        ),
        pytest.param(
            reconciled(workers=WorkersOutcome("h1", unavailable="cannot read Deployment x: HTTP 503")), id="target"
        ),
    ],
)
def test_a_blip_of_the_kubernetes_api_changes_nothing(blip: Observations) -> None:
    """A 5xx/429 is no NotFound, no invalid Secret, no ConfigMapFailed: the conditions stay as the last pass left
    them, with no Event; the next pass concludes afresh."""
    workers = WorkersOutcome("h1", pods=1, pods_current=1)
    ready, blipped, again = run(reconciled(workers=workers), blip, reconciled(workers=workers))
    assert conditions(blipped) == conditions(ready) == conditions(again)
    assert blipped.status.conditions == ready.status.conditions, "not even a transition time moved"
    assert events(blipped) == events(again) == []


def test_a_spec_whose_secret_could_not_be_read_is_not_observed() -> None:
    unread = DeclareOutcome(TOPOLOGY, failure=KubeUnavailableError("cannot read Secret x: HTTP 500"))
    _, changed = run(reconciled(), dataclasses.replace(reconciled(unread), generation=4))
    assert changed.status.observed_generation == 3


def test_a_blip_keeps_a_configmap_failure_as_it_was() -> None:
    failed, blipped = run(
        reconciled(workers=WorkersOutcome("h1", configmap_error="cannot write ConfigMap x: HTTP 422")),
        reconciled(workers=WorkersOutcome("h1", unavailable="cannot read ConfigMap x: HTTP 500")),
    )
    assert conditions(blipped) == conditions(failed)
    assert conditions(blipped)["Ready"] == ("False", "WorkersNotConfigured")


def test_a_secret_unreadable_for_long_is_said_once_and_nothing_else_changes() -> None:
    lasting = "cannot read Secret x: the Kubernetes API does not answer (for 60 s; the settings last read are kept)"
    ready, first, again, back = run(
        reconciled(),
        reconciled(settings_unavailable=lasting),
        reconciled(settings_unavailable=lasting),
        reconciled(),
    )
    assert conditions(first) == conditions(ready)
    assert events(first) == [("Warning", "KubernetesAPIUnavailable")]
    assert events(again) == events(back) == []


def test_a_broker_alarm_is_seen_in_status_passes_and_its_end_asks_for_a_reconcile() -> None:
    """A memory alarm: one Warning naming it (whichever pass sees it first, none again), no change while it lasts or
    while the alarms cannot be seen, and when it clears a reconcile concludes afresh (one Normal Event)."""
    memory = (Alarm("memory", "rabbit@a"),)
    ready, alarmed, still, reconciled_meanwhile, unseen, cleared, back = run(
        reconciled(alarms=()),
        status_passed(alarms=memory),
        status_passed(alarms=memory),
        reconciled(alarms=memory),
        status_passed(alarms=None),
        status_passed(alarms=()),
        reconciled(alarms=()),
    )
    assert conditions(ready)["Ready"] == ("True", "Reconciled")
    assert events(alarmed) == [("Warning", "BrokerAlarm")]
    assert conditions(alarmed)["Ready"] == conditions(alarmed)["BrokerReachable"] == ("False", "BrokerAlarm")
    message = next(c.message for c in alarmed.status.conditions if c.type == "Ready")
    assert "memory alarm on node rabbit@a" in message
    assert "cannot publish retries, archives or events" in message
    for later in (still, reconciled_meanwhile, unseen):
        assert events(later) == []
        assert conditions(later) == conditions(alarmed)
        assert not later.resync
    assert cleared.resync, "the status pass asks for a reconcile"
    assert conditions(cleared) == conditions(alarmed)
    assert events(back) == [("Normal", "Connected")]
    assert conditions(back) == conditions(ready)
    assert not back.resync


def test_an_outage_keeps_the_counters_no_numbers_from_missing_data() -> None:
    counted, down, unknown = run(
        status_passed(queues=QueuesSeen(DEPTHS, "ready + unacknowledged")),
        reconciled(DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("down"))),
        status_passed(queues=QueuesSeen(None, problem="down")),
    )
    assert (counted.status.queue_length, counted.status.retrying, counted.status.archived) == (7, 3, 1)
    assert counted.status.consumers == 2, "consumers of the handler queues only"
    assert down.status.queue_length == unknown.status.queue_length == 7


def test_remembered_entities_change_only_when_the_declared_ones_do() -> None:
    [first] = run(reconciled())
    assert Declared.from_json(first.annotations[DECLARED_ANNOTATION]) == Declared.of(TOPOLOGY)
    [again] = run(reconciled(declared=Declared.of(TOPOLOGY)))
    assert again.annotations == {}


def test_kept_and_removed_entities_are_told() -> None:
    report = outcome.Report(kept=[outcome.QueueState("billing.old", None, 4, 0)])
    report.note_removed(("queue", "billing:retry.1"))
    report.note_removed(("exchange", "billing:retry.1"))
    obsolete = Declared(
        frozenset({"billing:retry.1"}), frozenset({DeclaredQueue("billing:retry.1"), DeclaredQueue("billing.old")})
    )
    [conclusion] = run(
        reconciled(DeclareOutcome(TOPOLOGY, "h", report=report), declared=Declared.of(TOPOLOGY) | obsolete)
    )
    topology = next(c for c in conclusion.status.conditions if c.type == "TopologyReady")
    assert "billing.old (4 messages)" in topology.message
    assert events(conclusion) == [("Normal", "Removed")]
    remembered = Declared.from_json(conclusion.annotations[DECLARED_ANNOTATION]).entities
    assert ("queue", "billing.old") in remembered
    assert not {("queue", "billing:retry.1"), ("exchange", "billing:retry.1")} & remembered


# --- the status pass ------------------------------------------------------------------------------------------

SCALED = Scaled("Deployment/w", 1, 3, "queue length 60 asks for 3", "2026-01-01T00:00:00Z")


@pytest.mark.parametrize(
    ("scaling", "fields", "expected_events"),
    [
        pytest.param(ScalingSeen(SELECTOR), {"selector": SELECTOR}, [], id="no-workers"),
        pytest.param(
            ScalingSeen(SELECTOR, replicas=2, workload=2, scale_checked=True),
            {"selector": SELECTOR, "replicas": 2},
            [],
            id="replicas",
        ),
        pytest.param(
            ScalingSeen(SELECTOR, replicas=2, desired=3, workload=1, scale_checked=True, scaled=SCALED),
            {"selector": SELECTOR, "replicas": 2, "desiredReplicas": 3, "lastScaleTime": "2026-01-01T00:00:00Z"},
            [("Normal", "Scaled")],
            id="scaled",
        ),
        pytest.param(
            ScalingSeen(SELECTOR, replicas=1, desired=3, workload=1, scale_checked=True, failed="HTTP 403"),
            {"selector": SELECTOR, "replicas": 1, "desiredReplicas": 3},
            [("Warning", "ScalingFailed")],
            id="scale-refused",
        ),
        pytest.param(
            ScalingSeen(SELECTOR, scale_problem="cannot read the scale of Deployment default/w: HTTP 403"),
            {"selector": SELECTOR},
            [("Warning", "ScalingPaused")],
            id="scale-unreadable",
        ),
    ],
)
def test_the_status_pass_concludes_replicas(
    scaling: ScalingSeen, fields: dict[str, Any], expected_events: list[tuple[str, str]]
) -> None:
    [conclusion] = run(status_passed(AUTOSCALED, scaling=scaling))
    assert patch_of(conclusion.status) == {"conditions": [], **fields}
    assert events(conclusion) == expected_events
    assert conclusion.status.observed_generation is None, "a status pass does not observe the spec"


@pytest.mark.parametrize(
    ("spec", "passes", "paused"),
    [
        pytest.param(SPEC, 3, 0, id="nothing-to-scale-no-event"),
        pytest.param(AUTOSCALED, 3, 1, id="once-per-problem"),
        pytest.param(parse_spec({**GOOD_SPEC, "workers": {**GOOD_SPEC["workers"], "replicas": 2}}), 3, 1, id="spec"),
    ],
)
def test_an_unreadable_scale_is_announced_once_and_only_when_something_is_to_be_scaled(
    spec: CeleryEventServiceSpec, passes: int, paused: int
) -> None:
    unreadable = ScalingSeen(SELECTOR, scale_problem="cannot read the scale: HTTP 403")
    found = run(*[status_passed(spec, scaling=unreadable)] * passes)
    assert sum(events(c).count(("Warning", "ScalingPaused")) for c in found) == paused


def test_a_scale_problem_is_announced_again_only_after_the_scale_was_read() -> None:
    unreadable = ScalingSeen(SELECTOR, scale_problem="HTTP 403")
    unknown_depths = ScalingSeen(SELECTOR)  # the scale was not looked at
    readable = ScalingSeen(SELECTOR, replicas=1, workload=1, scale_checked=True)
    found = run(*(status_passed(AUTOSCALED, scaling=s) for s in (unreadable, unknown_depths, unreadable, readable)))
    assert [events(c) for c in found] == [[("Warning", "ScalingPaused")], [], [], []]
    again = run(*(status_passed(AUTOSCALED, scaling=s) for s in (unreadable, readable, unreadable)))
    assert [events(c) for c in again] == [[("Warning", "ScalingPaused")], [], [("Warning", "ScalingPaused")]]


@pytest.mark.parametrize(
    ("spec", "paused"),
    [pytest.param(SPEC, [], id="not-autoscaled"), pytest.param(AUTOSCALED, [("Warning", "ScalingPaused")], id="auto")],
)
def test_unknown_queue_lengths_pause_autoscaling_once(
    spec: CeleryEventServiceSpec, paused: list[tuple[str, str]]
) -> None:
    unknown = status_passed(spec, queues=QueuesSeen(None, problem="management API down"))
    first, again, known, unknown_again = run(unknown, unknown, status_passed(spec, queues=QueuesSeen(DEPTHS)), unknown)
    assert events(first) == paused
    assert events(again) == []
    assert events(unknown_again) == paused, "a new episode is announced again"
    assert all("management API down" in note.message for note in first.events)
    assert known.status.queue_length == 7


def test_an_eviction_is_told() -> None:
    [conclusion] = run(status_passed(evicted=Evicted("w-1", "it runs settings old, not the current new")))
    assert [(n.reason, n.message) for n in conclusion.events] == [
        ("PodEvicted", "evicted pod w-1: it runs settings old, not the current new")
    ]


def test_the_consumer_recovers_with_one_event_only_after_an_announced_failure() -> None:
    failing = status_passed(monitoring=MonitoringSeen(True, "queue missing", own_failure=True))
    broker_down = status_passed(monitoring=MonitoringSeen(True, "broker down"))
    fine = status_passed(monitoring=MonitoringSeen(True))
    found = run(failing, failing, fine, broker_down, fine)
    assert [events(c) for c in found] == [
        [("Warning", "EventsNotConsumed")],
        [],
        [("Normal", "Consuming")],
        [],
        [],
    ]
    [off] = run(status_passed(monitoring=MonitoringSeen(False)), status=found[-1].status)
    assert "MonitoringReady" not in conditions(off), "monitoring switched off: no condition"


def test_status_of_a_body_keeps_what_fits_the_schema() -> None:
    body = {
        "status": {
            "queueLength": 4,
            "replicas": "many",  # hand-edited
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }
    }
    status = status_of(body)
    assert (status.queue_length, status.replicas) == (4, None)
    assert [c.type for c in status.conditions] == ["Ready"]
    assert status_of({}) == CeleryEventServiceStatus()


def test_deletion_events() -> None:
    report = outcome.Report(removed=["billing.e"], kept=[outcome.QueueState("billing:archived", None, 2, 0)])
    notes = conclude_deletion(DeclareOutcome(TOPOLOGY, "h", report=report), CLAIMANT, removing=True)
    assert [(n.type, n.reason) for n in notes] == [("Normal", "Removed"), ("Warning", "KeptNonEmpty")]
    assert "billing:archived (2 messages)" in notes[1].message
    unreachable = conclude_deletion(
        DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("down")), CLAIMANT, removing=True
    )
    assert [(n.type, n.reason, n.message) for n in unreachable] == [
        ("Warning", "BrokerUnreachable", "the service's queues were not removed: down")
    ]


def test_observations_are_plain_frozen_data() -> None:
    seen = reconciled()
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen.generation = 4  # type: ignore[misc]


def lifecycle(judged: int, stuck: tuple[StuckWorker, ...] = (), **seen: Any) -> LifecycleSeen:
    """What a lifecycle step saw: `judged` pods heartbeating and consuming, `stuck` among them."""
    judgement = Judgement(stuck, judged=judged, heartbeating=judged, consuming=judged, paused=seen.pop("paused", None))
    return LifecycleSeen(judgement, 120.0, **seen)


def test_stuck_workers_are_named_in_workers_healthy_and_announced_once_each() -> None:
    silent = StuckWorker("w-1", "no heartbeat for 130 s while Running")
    idle = StuckWorker("w-2", "heartbeats but consumes from no handler queue for 125 s while 40 messages wait")
    found = run(
        status_passed(lifecycle=lifecycle(2)),
        status_passed(lifecycle=lifecycle(2, (silent,))),
        status_passed(lifecycle=lifecycle(2, (silent, idle))),
        status_passed(lifecycle=lifecycle(2, (silent, idle))),
        status_passed(lifecycle=lifecycle(2, unchecked="queue lengths unknown: down")),
        status_passed(lifecycle=lifecycle(2)),
    )
    assert [conditions(c)["WorkersHealthy"] for c in found] == [
        ("True", "WorkersHealthy"),
        ("False", "WorkersStuck"),
        ("False", "WorkersStuck"),
        ("False", "WorkersStuck"),
        ("Unknown", "NotChecked"),
        ("True", "WorkersHealthy"),
    ]
    assert [[n.message for n in c.events] for c in found[:4]] == [
        [],
        ["worker pod w-1: no heartbeat for 130 s while Running"],
        ["worker pod w-2: heartbeats but consumes from no handler queue for 125 s while 40 messages wait"],
        [],
    ]
    message = next(c.message for c in found[2].status.conditions if c.type == "WorkersHealthy")
    assert message.startswith("w-1: no heartbeat for 130 s while Running; w-2: heartbeats but")
    assert events(found[4]) == [], "not judged: no Event"
    healthy = next(c.message for c in found[0].status.conditions if c.type == "WorkersHealthy")
    assert healthy == "2 running workers: 2 send heartbeats, 2 consume from the handler queues"


def test_a_pause_of_the_replacing_is_said_in_workers_healthy_and_announced_once() -> None:
    stuck = (StuckWorker("w-2", "task t (0123abcd) has run 95 s, past its limit of 90 s", "hung:t", replace=False),)
    paused = "replacing paused: w-2 started after w-1 was evicted for the same reason"
    found = run(*[status_passed(lifecycle=lifecycle(2, stuck, paused=paused))] * 2)
    message = next(c.message for c in found[0].status.conditions if c.type == "WorkersHealthy")
    assert message.startswith(paused + ". w-2: task t")
    assert [events(c) for c in found] == [[("Warning", "ReplacementPaused"), ("Warning", "WorkerStuck")], []]


def test_metric_labels_past_their_bound_are_announced_once_per_label() -> None:
    names = {"name": (4_900, 500)}
    found = run(
        status_passed(overflowing={}),
        status_passed(overflowing=names),
        status_passed(overflowing=names),
        status_passed(overflowing={**names, "exception": (30, 20)}),
    )
    assert [events(c) for c in found] == [
        [],
        [("Warning", "MetricLabelsOverflowed")],
        [],
        [("Warning", "MetricLabelsOverflowed")],
    ]
    assert "exception classes" in found[3].events[0].message
    assert "task names" not in found[3].events[0].message, "each label once"


def test_many_stuck_workers_are_named_up_to_a_bound_and_announced_a_few_per_pass() -> None:
    stuck = tuple(StuckWorker(f"w-{number:03d}", "no heartbeat for over 120 s while Running") for number in range(600))
    found = run(*[status_passed(lifecycle=lifecycle(600, stuck))] * 3)
    message = next(c.message for c in found[0].status.conditions if c.type == "WorkersHealthy")
    assert message.count("no heartbeat") == 10
    assert "and 590 more (celery_event_operator_stuck_workers); each not said" in message
    assert [len(c.events) for c in found] == [5, 5, 5], "a few Events per pass, each pod once"
    assert len({note.message for c in found for note in c.events}) == 15


def test_a_refused_change_of_replicas_is_announced_once_per_distinct_refusal() -> None:
    refused = ScalingSeen(SELECTOR, replicas=1, desired=3, workload=1, scale_checked=True, failed="HTTP 403")
    unchanged = ScalingSeen(SELECTOR, replicas=1, workload=1, scale_checked=True)
    found = run(*(status_passed(AUTOSCALED, scaling=s) for s in (refused, refused, unchanged, refused)))
    assert [events(c) for c in found] == [[("Warning", "ScalingFailed")], [], [], [("Warning", "ScalingFailed")]]


def test_workers_healthy_goes_with_the_workers() -> None:
    [healthy] = run(status_passed(lifecycle=lifecycle(2)))
    assert "WorkersHealthy" in conditions(healthy)
    without_workers = parse_spec({key: value for key, value in GOOD_SPEC.items() if key != "workers"})
    [gone] = run(status_passed(without_workers), status=healthy.status)
    assert "WorkersHealthy" not in conditions(gone)


def test_an_overflow_is_announced_again_after_the_series_started_afresh() -> None:
    names = {"name": (4_900, 500)}
    found = run(status_passed(overflowing=names), status_passed(overflowing={}), status_passed(overflowing=names))
    assert [events(c) for c in found] == [
        [("Warning", "MetricLabelsOverflowed")],
        [],
        [("Warning", "MetricLabelsOverflowed")],
    ]


def test_tasks_run_once_says_each_cause_of_reruns_once_and_the_grace_period_goes_into_status() -> None:
    rerun = RunOnce(False, "TasksRerun", "in the last hour, tasks ran twice — 1 …", frozenset({"ack_timeout"}))
    more = RunOnce(False, "TasksRerun", "in the last hour, tasks ran twice — 2 …", frozenset({"ack_timeout"}))
    both = RunOnce(
        False, "TasksRerun", "in the last hour, tasks ran twice — 3 …", frozenset({"ack_timeout", "pod_stopped"})
    )
    fine = RunOnce(True, "RunOnce", "no task was started again in the last hour")
    grace = Grace(600, "what 99 % of the tasks of the last hour ran, and 10 s for the worker to exit")
    found = run(*(status_passed(run_once=seen, grace=grace) for seen in (fine, rerun, more, both, fine, rerun)))
    assert [conditions(c)["TasksRunOnce"] for c in found] == [
        ("True", "RunOnce"),
        *[("False", "TasksRerun")] * 3,
        ("True", "RunOnce"),
        ("False", "TasksRerun"),
    ]
    assert [events(c) for c in found] == [
        [],
        [("Warning", "TasksRerun")],
        [],
        [("Warning", "TasksRerun")],
        [],
        [("Warning", "TasksRerun")],
    ], "one Warning per cause, per episode"
    assert (found[0].status.grace_period_seconds, found[0].status.grace_period_basis) == (600, grace.basis)
    warned = run(status_passed(run_once=RunOnce(False, "AckTimeoutTooShort", "tasks will run twice: …")))
    assert events(warned[0]) == [("Warning", "AckTimeoutTooShort")]


def test_the_grace_basis_is_written_again_only_with_the_grace() -> None:
    """Within a step, what decides the grace may alternate (a task running now, then the last hour's runtimes): the
    status keeps the basis it has until the grace itself changes (issue 43: a status write per service per minute)."""
    observed = Grace(60, "what 99 % of the tasks of the last hour ran, and 10 s for the worker to exit")
    running = Grace(60, "a task running now, longer than the tasks of the last hour, and 10 s for the worker to exit")
    longer = Grace(120, "a task running now, longer than the tasks of the last hour, and 10 s for the worker to exit")
    found = run(*(status_passed(grace=grace) for grace in (observed, running, observed, longer, observed)))
    assert [(c.status.grace_period_seconds, c.status.grace_period_basis) for c in found] == [
        (60, observed.basis),
        (60, observed.basis),
        (60, observed.basis),
        (120, longer.basis),
        (60, observed.basis),
    ]


@pytest.mark.parametrize(
    ("seen", "then"),
    [
        (
            reconciled(workers=WorkersOutcome("h1", pods=2, pods_current=1)),
            "1/2 pods run with settings h1; the others get them when they are created again (a rollout, a restart)",
        ),
        (
            reconciled(workers=WorkersOutcome("h1", pods=2, pods_current=1, heal_after_seconds=300)),
            "1/2 pods run with settings h1; the other 1 are evicted one at a time after 300 s without them",
        ),
        (
            reconciled(topology=DeclareOutcome(TOPOLOGY, failure=BrokerUnavailableError("cannot reach h:5672"))),
            "cannot reach h:5672; tried again at the next resync (about every 30 s), and no more often than its "
            "backoff allows (up to 60 s)",
        ),
    ],
    ids=["rollout-without-healing", "rollout-healing", "broker-unreachable"],
)
def test_a_condition_that_is_not_true_says_what_happens_next(seen: Observations, then: str) -> None:
    [conclusion] = run(seen)
    assert then in [c.message for c in conclusion.status.conditions]


@pytest.mark.parametrize(
    ("replace", "then"),
    [
        (True, '; each not said "not replaced" is evicted, one at a time, and its replacement watched'),
        (False, "; none is replaced (workers.replaceStuckWorkers is off)"),
    ],
)
def test_stuck_workers_say_whether_they_are_replaced(replace: bool, then: str) -> None:
    spec = parse_spec({**GOOD_SPEC, "workers": {**GOOD_SPEC["workers"], "replaceStuckWorkers": replace}})
    stuck = (StuckWorker("w-1", "no heartbeat for over 120 s while Running"),)
    [conclusion] = run(status_passed(spec, lifecycle=lifecycle(2, stuck)))
    message = next(c.message for c in conclusion.status.conditions if c.type == "WorkersHealthy")
    assert message == f"w-1: no heartbeat for over 120 s while Running{then}"


# --- a settled conclusion is not worked out again ------------------------------------------------------------------

# What a resource whose topology was declared remembers (its annotation, read back into the next pass).
DECLARED = Declared.of(TOPOLOGY)

SETTLING = [
    pytest.param(reconciled(declared=DECLARED), id="reconciled"),
    pytest.param(
        reconciled(
            declared=DECLARED, monitoring=MonitoringSeen(True, "queue billing.celeryev missing", own_failure=True)
        ),
        id="consumer-failure",
    ),
    pytest.param(reconciled(declared=DECLARED, alarms=(Alarm("memory", "rabbit@a"),)), id="alarm-in-a-reconcile"),
    pytest.param(
        status_passed(
            AUTOSCALED,
            queues=QueuesSeen(DEPTHS),
            scaling=ScalingSeen(SELECTOR, replicas=2, desired=2, workload=2, scale_checked=True),
        ),
        id="counted",
    ),
    pytest.param(
        status_passed(AUTOSCALED, scaling=ScalingSeen(SELECTOR, scale_problem="HTTP 403")), id="scale-unreadable"
    ),
    pytest.param(status_passed(alarms=(Alarm("disk", "rabbit@a"),)), id="alarm"),
    pytest.param(
        status_passed(lifecycle=lifecycle(2, (StuckWorker("w-1", "no heartbeat for 130 s while Running"),))),
        id="stuck",
    ),
    pytest.param(status_passed(grace=Grace(64, "a task running now has run up to 32 s")), id="grace"),
    pytest.param(status_passed(overflowing={"name": (3, 100)}), id="overflowing"),
]


@pytest.mark.parametrize("seen", SETTLING)
def test_a_settled_conclusion_is_what_concluding_again_gives(seen: Observations) -> None:
    """The same observations again, pass after pass: once a conclusion changed nothing, concluding again (later, from
    the status it left) gives the same status, no Event, nothing newly announced: so the keeper reuses it."""
    previous, announced = CeleryEventServiceStatus(), Announced()
    for minute in range(4):
        conclusion = conclude(previous, seen, announced, NOW + datetime.timedelta(minutes=minute), RHYTHM)
        found = settled(previous, seen, announced, RHYTHM, conclusion)
        if found is not None:
            break
        previous, announced = conclusion.status, conclusion.announced
    assert found is not None, "the same observations settle within a few passes"
    again = conclude(conclusion.status, seen, conclusion.announced, LATER + datetime.timedelta(hours=1), RHYTHM)
    assert again.status == conclusion.status
    assert (again.events, again.annotations, again.announced, again.resync) == ((), {}, conclusion.announced, False)
    assert found.answers(conclusion.status, dataclasses.replace(seen), conclusion.announced, RHYTHM)


def test_a_settled_conclusion_answers_only_the_same_start_and_equal_observations() -> None:
    seen = reconciled(declared=DECLARED)
    first = conclude(CeleryEventServiceStatus(), seen, Announced(), NOW, RHYTHM)
    assert settled(CeleryEventServiceStatus(), seen, Announced(), RHYTHM, first) is None, "the status changed"
    second = conclude(first.status, seen, first.announced, LATER, RHYTHM)
    found = settled(first.status, seen, first.announced, RHYTHM, second)
    assert found is not None
    status, announced = second.status, second.announced
    assert found.answers(status, seen, announced, RHYTHM)
    assert found.answers(status.model_copy(), dataclasses.replace(seen), dataclasses.replace(announced), RHYTHM)
    assert not found.answers(status.model_copy(update={"queue_length": 7}), seen, announced, RHYTHM)
    assert not found.answers(status, seen, dataclasses.replace(announced, overflowed=frozenset({"task"})), RHYTHM)
    assert not found.answers(status, reconciled(declared=DECLARED, monitoring=MonitoringSeen(True)), announced, RHYTHM)
    assert not found.answers(status, seen, announced, Rhythm(resync_seconds=30, status_seconds=60))
    failing = reconciled(
        declared=DECLARED, monitoring=MonitoringSeen(True, "queue billing.celeryev missing", own_failure=True)
    )
    warned = conclude(status, failing, announced, LATER, RHYTHM)
    assert events(warned) == [("Warning", "EventsNotConsumed")]
    assert settled(status, failing, announced, RHYTHM, warned) is None, "an Event: not settled"
