"""Status, Events and remembered entities concluded from a reconcile (pure)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from celery_event_operator import service_status
from celery_event_operator.api.models import parse_spec
from celery_event_operator.errors import InvalidSpecError
from celery_event_operator.injection import outcome as injection
from celery_event_operator.topology import apply, outcome, plan
from celery_event_operator.topology.declared import Declared, DeclaredQueue
from celery_event_operator.topology.outcome import Outcome

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=1)
GOOD_SPEC = {
    "broker": {"secretRef": {"name": "rabbitmq"}},
    "events": {"handlers": [{"name": "e"}]},
    "retry": {"maxRetries": 1},
}
TOPOLOGY = plan.plan("billing", parse_spec(GOOD_SPEC))


def body(
    spec: dict[str, Any] | None = None,
    name: str = "billing",
    generation: int = 3,
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "generation": generation, "annotations": annotations or {}},
        "spec": GOOD_SPEC if spec is None else spec,
        "status": status or {},
    }


def healthy_report(**changes: Any) -> outcome.Report:
    report = outcome.Report()
    for key, value in changes.items():
        setattr(report, key, value)
    return report


def conditions_by_type(decision: service_status.Decision) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in decision.status_patch["conditions"]}


def test_validate_uses_the_resource_name_as_default_service_name() -> None:
    assert service_status.validate(body()).service_name == "billing"
    with pytest.raises(InvalidSpecError, match="serviceName"):
        service_status.validate(body(name="billing.v2"))


def test_invalid_spec_is_not_ready_and_warns_once() -> None:
    bad = body({**GOOD_SPEC, "retry": {"maxRetries": 99}})
    with pytest.raises(InvalidSpecError) as error:
        service_status.validate(bad)
    first = service_status.conclude_invalid(bad, error.value, NOW)
    ready = conditions_by_type(first)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "retry.maxRetries" in ready["message"]
    assert first.status_patch["observedGeneration"] == 3
    assert [(e.type, e.reason) for e in first.events] == [("Warning", "InvalidSpec")]
    again = service_status.conclude_invalid(body(bad["spec"], status=first.status_patch), error.value, LATER)
    assert again.events == (), "the same failure seen again posts no second Event"


def test_healthy_sync_is_ready_and_remembers_entities() -> None:
    decision = service_status.conclude(body(), Outcome(TOPOLOGY, "h:5672 vhost '/'", report=healthy_report()), NOW)
    found = conditions_by_type(decision)
    assert [c["type"] for c in decision.status_patch["conditions"]] == ["Ready", "BrokerReachable", "TopologyReady"]
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("True", "Reconciled")
    assert found["BrokerReachable"]["message"] == "connected to h:5672 vhost '/'"
    assert "queueLength" not in decision.status_patch, "the counters are the status daemon's (scaling/run.py)"
    assert Declared.from_json(decision.annotations[service_status.DECLARED_ANNOTATION]) == Declared.of(TOPOLOGY)
    assert decision.events == (), "nothing failed or recovered"


def test_unchanged_entities_are_not_rewritten() -> None:
    annotations = {service_status.DECLARED_ANNOTATION: Declared.of(TOPOLOGY).to_json()}
    decision = service_status.conclude(
        body(annotations=annotations), Outcome(TOPOLOGY, "h", report=healthy_report()), NOW
    )
    assert decision.annotations == {}


def test_outage_keeps_counters_and_announces_failure_then_recovery() -> None:
    healthy = service_status.conclude(body(), Outcome(TOPOLOGY, "h", report=healthy_report()), NOW)
    down = service_status.conclude(
        body(status=healthy.status_patch), Outcome(TOPOLOGY, "h", "BrokerUnreachable", "cannot reach the broker"), LATER
    )
    found = conditions_by_type(down)
    assert (found["BrokerReachable"]["status"], found["BrokerReachable"]["reason"]) == ("False", "BrokerUnreachable")
    assert found["TopologyReady"]["status"] == "Unknown"
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "BrokerUnreachable")
    assert "queueLength" not in down.status_patch, "no numbers from missing data"
    assert [(e.type, e.reason) for e in down.events] == [("Warning", "BrokerUnreachable")]

    still_down = service_status.conclude(
        body(status=down.status_patch), Outcome(TOPOLOGY, "h", "BrokerUnreachable", "cannot reach the broker"), LATER
    )
    assert still_down.events == ()
    back = service_status.conclude(
        body(status=still_down.status_patch), Outcome(TOPOLOGY, "h", report=healthy_report()), LATER
    )
    assert [(e.type, e.reason) for e in back.events] == [("Normal", "Connected")], "one recovery Event"
    assert conditions_by_type(back)["BrokerReachable"]["lastTransitionTime"] == "2026-01-01T00:01:00Z"


def test_argument_mismatch_is_named_in_topology_ready() -> None:
    problem = apply.Problem("billing:archived", "queue 'billing:archived' was declared with another x-max-length")
    decision = service_status.conclude(body(), Outcome(TOPOLOGY, "h", report=healthy_report(problems=[problem])), NOW)
    found = conditions_by_type(decision)
    assert (found["TopologyReady"]["status"], found["TopologyReady"]["reason"]) == ("False", "ArgumentMismatch")
    assert "x-max-length" in found["TopologyReady"]["message"]
    assert (found["Ready"]["status"], found["Ready"]["reason"]) == ("False", "TopologyMismatch")
    assert [e.reason for e in decision.events] == ["ArgumentMismatch"]


def test_refused_operation_is_a_topology_failure_on_a_reachable_broker() -> None:
    decision = service_status.conclude(body(), Outcome(TOPOLOGY, "h", "BrokerRefused", "access refused"), NOW)
    found = conditions_by_type(decision)
    assert found["BrokerReachable"]["status"] == "True"
    assert (found["TopologyReady"]["status"], found["TopologyReady"]["reason"]) == ("False", "BrokerRefused")


def test_kept_and_removed_entities_are_told() -> None:
    report = healthy_report(kept=[outcome.QueueState("billing.old", None, 4, 0)])
    report.note_removed(("queue", "billing:retry.1"))
    report.note_removed(("exchange", "billing:retry.1"))
    obsolete = Declared(
        frozenset({"billing:retry.1"}), frozenset({DeclaredQueue("billing:retry.1"), DeclaredQueue("billing.old")})
    )
    previous = {service_status.DECLARED_ANNOTATION: (Declared.of(TOPOLOGY) | obsolete).to_json()}
    decision = service_status.conclude(body(annotations=previous), Outcome(TOPOLOGY, "h", report=report), NOW)
    assert "billing.old (4 messages)" in conditions_by_type(decision)["TopologyReady"]["message"]
    assert [e.reason for e in decision.events] == ["Removed"]
    remembered = Declared.from_json(decision.annotations[service_status.DECLARED_ANNOTATION]).entities
    assert ("queue", "billing.old") in remembered
    assert not {("queue", "billing:retry.1"), ("exchange", "billing:retry.1")} & remembered


@pytest.mark.parametrize("raw", ["", "not json", '{"a": 1}', '[1, "x"]'])
def test_declared_entities_survive_garbage(raw: str) -> None:
    found = service_status.declared_entities(body(annotations={service_status.DECLARED_ANNOTATION: raw}))
    assert found.entities <= {("queue", "x"), ("exchange", "x")}


def test_deletion_events() -> None:
    report = outcome.Report(removed=["billing.e"], kept=[outcome.QueueState("billing:archived", None, 2, 0)])
    notes = service_status.conclude_deletion(Outcome(TOPOLOGY, "h", report=report))
    assert [(n.type, n.reason) for n in notes] == [("Normal", "Removed"), ("Warning", "KeptNonEmpty")]
    assert "billing:archived (2 messages)" in notes[1].message
    unreachable = service_status.conclude_deletion(Outcome(TOPOLOGY, "h", "BrokerUnreachable", "down"))
    assert [(n.type, n.reason) for n in unreachable] == [("Warning", "BrokerUnreachable")]


@pytest.mark.parametrize(
    ("workers", "status", "reason", "events"),
    [
        pytest.param(injection.Outcome("h1", pods=2, pods_current=2), "True", "SettingsCurrent", [], id="current"),
        pytest.param(injection.Outcome("h1"), "True", "SettingsCurrent", [], id="no-pods-yet"),
        pytest.param(
            injection.Outcome("h1", stamped="Deployment/w", pods=2, pods_current=0),
            "False",
            "RolloutPending",
            ["RolloutStarted"],
            id="rolling",
        ),
        pytest.param(
            injection.Outcome("h1", target_error="Deployment default/w does not exist"),
            "False",
            "ScaleTargetNotFound",
            ["ScaleTargetNotFound"],
            id="missing-target",
        ),
        pytest.param(
            injection.Outcome("h1", configmap_error="cannot write ConfigMap"),
            "False",
            "ConfigMapFailed",
            ["ConfigMapFailed"],
            id="configmap-failed",
        ),
    ],
)
def test_workers_configured(workers: injection.Outcome, status: str, reason: str, events: list[str]) -> None:
    decision = service_status.conclude(body(), Outcome(TOPOLOGY, "h", report=healthy_report()), NOW, workers)
    found = conditions_by_type(decision)
    assert (found["WorkersConfigured"]["status"], found["WorkersConfigured"]["reason"]) == (status, reason)
    assert [e.reason for e in decision.events] == events
    expected_ready = "False" if workers.configmap_error else "True"
    assert found["Ready"]["status"] == expected_ready


def _with_spec(spec: dict[str, Any], accepted: dict[str, Any] | str | None) -> dict[str, Any]:
    annotations = {}
    if accepted is not None:
        raw = accepted if isinstance(accepted, str) else json.dumps(accepted)
        annotations[service_status.ACCEPTED_IMMUTABLE_ANNOTATION] = raw
    return {"metadata": {"annotations": annotations}, "spec": spec}


def test_immutable_fields_are_remembered_and_a_change_is_refused_with_what_changed() -> None:
    spec = {"serviceName": "billing", "queueType": "classic", "broker": {"secretRef": {"name": "s"}}}
    first, error = service_status.immutable_changes(_with_spec(spec, None))
    assert error is None
    assert first == {"serviceName": "billing", "queueType": "classic", "broker.vhost": None, "events.exchange": None}
    assert service_status.immutable_changes(_with_spec(spec, first)) == (first, None)
    renamed = {**spec, "serviceName": "billing2", "queueType": "quorum"}
    kept, refused = service_status.immutable_changes(_with_spec(renamed, first))
    assert kept == first, "what was accepted stays remembered"
    assert refused is not None
    assert "serviceName is immutable: it was 'billing' when the resource was accepted and is 'billing2' now" in str(
        refused
    )
    assert "queueType is immutable" in str(refused)
    with_vhost = {**spec, "broker": {"secretRef": {"name": "s"}, "vhost": "/other"}}
    assert service_status.immutable_changes(_with_spec(with_vhost, first))[1] is not None, "set where it was unset"
    assert service_status.immutable_changes(_with_spec(renamed, "not json"))[1] is None, "garbage: start again"
