"""A CeleryEventReplay is admitted when it makes sense and refused by the rule meant to catch it; the operator's
own models (for clusters where the schema was not enforced, and the emulated API) refuse the same."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from celery_event_operator.core.api import crd
from celery_event_operator.core.api.models import parse_replay_spec
from celery_event_operator.core.errors import InvalidSpecError
from tests.conftest import load_examples
from tests.support.crd_validation import Violation, admit

CRD = crd.custom_resource_definition(crd.REPLAY)
IMMUTABLE = "a replay's spec is immutable: create another replay"
UNCONFIRMED = "a purge deletes archived events for good: set confirm: true (or dryRun: true to see what it would take)"

VALID: dict[str, Any] = {
    "apiVersion": "celeryevents.io/v1alpha1",
    "kind": "CeleryEventReplay",
    "metadata": {"name": "retry-typeerrors", "namespace": "shop"},
    "spec": {"serviceRef": {"name": "billing"}},
}


def replay(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    body["spec"].update(spec)
    return body


REPLAY_EXAMPLES = [(name, doc) for name, doc in load_examples() if doc["kind"] == "CeleryEventReplay"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(VALID, id="everything"),
        pytest.param(
            replay(
                filter={
                    "events": ["orders.order.created", "orders.order.cancelled"],
                    "exceptionTypes": ["TypeError", "PaymentProviderTimeout"],
                    "taskIds": ["0b4f6c52-8f9c-4c8e-9d1d-2f1a3c4b5d6e"],
                    "olderThanSeconds": 60,
                    "newerThanSeconds": 86400,
                },
                limit=100,
                ratePerSecond=20,
            ),
            id="every-filter",
        ),
        pytest.param(replay(action="purge", confirm=True), id="confirmed-purge"),
        pytest.param(replay(action="purge", dryRun=True), id="purge-dry-run-needs-no-confirmation"),
        *(pytest.param(doc, id=name) for name, doc in REPLAY_EXAMPLES),
    ],
)
def test_good_replays_are_admitted(body: dict[str, Any]) -> None:
    assert admit(CRD, body) == []
    parse_replay_spec(body["spec"])


BAD = [
    pytest.param(replay(action="purge"), {Violation("spec", UNCONFIRMED)}, id="purge-without-confirmation"),
    pytest.param(replay(action="redrive"), {Violation("spec.action", "enum")}, id="unknown-action"),
    pytest.param(
        replay(serviceRef={"name": "billing", "namespace": "other"}),
        {Violation("spec.serviceRef", "additionalProperties")},
        id="service-of-another-namespace",
    ),
    pytest.param(replay(serviceRef={}), {Violation("spec.serviceRef", "required")}, id="no-service"),
    pytest.param(
        replay(filter={"events": ["orders.*"]}), {Violation("spec.filter.events.0", "pattern")}, id="wildcard-event"
    ),
    pytest.param(
        replay(filter={"events": "orders.order.created"}),
        {Violation("spec.filter.events", "type")},
        id="events-not-a-list",
    ),
    pytest.param(
        replay(filter={"exceptionTypes": ["Type Error"]}),
        {Violation("spec.filter.exceptionTypes.0", "pattern")},
        id="exception-not-a-class-name",
    ),
    pytest.param(
        replay(filter={"taskIds": [f"id-{n}" for n in range(1001)]}),
        {Violation("spec.filter.taskIds", "maxItems")},
        id="too-many-task-ids",
    ),
    pytest.param(
        replay(filter={"olderThanSeconds": "1h"}), {Violation("spec.filter.olderThanSeconds", "type")}, id="age-text"
    ),
    pytest.param(
        replay(filter={"olderThanSeconds": 3600, "newerThanSeconds": 60}),
        {Violation("spec.filter", "olderThanSeconds must be below newerThanSeconds (the age window would be empty)")},
        id="empty-age-window",
    ),
    pytest.param(replay(filter={"event": "a"}), {Violation("spec.filter", "additionalProperties")}, id="misspelt"),
    pytest.param(replay(ratePerSecond=0), {Violation("spec.ratePerSecond", "minimum")}, id="zero-rate"),
    pytest.param(replay(limit=-1), {Violation("spec.limit", "minimum")}, id="negative-limit"),
]


@pytest.mark.parametrize(("body", "expected"), BAD)
def test_bad_replays_are_refused_by_their_rule(body: dict[str, Any], expected: set[Violation]) -> None:
    assert set(admit(CRD, body)) == expected


@pytest.mark.parametrize(("body", "expected"), BAD)
def test_the_operator_refuses_what_the_schema_refuses(body: dict[str, Any], expected: set[Violation]) -> None:
    with pytest.raises(InvalidSpecError):
        parse_replay_spec(body["spec"])


def test_the_spec_is_immutable() -> None:
    assert admit(CRD, replay(limit=5), old=VALID) == [Violation("spec", IMMUTABLE)]
    assert admit(CRD, VALID, old=VALID) == []
