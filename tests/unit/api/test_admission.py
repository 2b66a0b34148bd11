"""Good resources are admitted and each bad one is rejected by the rule meant to catch it.

Admission is emulated offline (tests/support/crd_validation.py: jsonschema for the OpenAPI schema,
cel-python for the CEL rules). The operator's own models must agree: what the schema rejects,
`parse_spec` rejects too, for clusters where the schema was not enforced.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from celery_event_operator.core.api import crd
from celery_event_operator.core.api.models import effective_service_name, parse_spec
from celery_event_operator.core.errors import InvalidSpecError
from tests.conftest import load_examples
from tests.support.crd_validation import Violation, admit

CRD = crd.custom_resource_definition()

VALID: dict[str, Any] = {
    "apiVersion": "celeryevents.io/v1alpha1",
    "kind": "CeleryEventService",
    "metadata": {"name": "billing", "namespace": "shop"},
    "spec": {
        "broker": {"secretRef": {"name": "rabbitmq", "key": "url"}},
        "events": {"handlers": [{"name": "orders.order.created"}]},
    },
}


def variant(changes: dict[str, Any], metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """VALID with `changes` merged into spec (None removes a key)."""

    def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
        for key, value in patch.items():
            if value is None:
                target.pop(key, None)
            elif isinstance(value, dict) and isinstance(target.get(key), dict):
                merge(target[key], value)
            else:
                target[key] = value

    body = copy.deepcopy(VALID)
    merge(body["spec"], changes)
    if metadata:
        body["metadata"].update(metadata)
    return body


SERVICE_EXAMPLES = [(name, doc) for name, doc in load_examples() if doc["kind"] == "CeleryEventService"]


def test_examples_hold_services() -> None:
    assert len(SERVICE_EXAMPLES) >= 2


@pytest.mark.parametrize(("name", "document"), SERVICE_EXAMPLES, ids=[name for name, _ in SERVICE_EXAMPLES])
def test_examples_are_admitted(name: str, document: dict[str, Any]) -> None:
    assert admit(CRD, document) == []
    spec = parse_spec(document["spec"])
    effective_service_name(spec, document["metadata"]["name"])


BAD = [
    pytest.param(
        variant({"retry": {"maxRetries": "10"}}),
        {Violation("spec.retry.maxRetries", "type")},
        id="maxRetries-as-string",
    ),
    pytest.param(
        variant({"events": {"handlers": "orders.order.created"}}),
        {Violation("spec.events.handlers", "type")},
        id="handlers-not-a-list",
    ),
    pytest.param(variant({"retries": 3}), {Violation("spec", "additionalProperties")}, id="unknown-spec-field"),
    pytest.param(
        variant({"broker": {"password": "x"}}),
        {Violation("spec.broker", "additionalProperties")},
        id="unknown-broker-field",
    ),
    pytest.param(
        variant({"retry": {"maxRetries": -1}}),
        {Violation("spec.retry.maxRetries", "minimum")},
        id="negative-maxRetries",
    ),
    pytest.param(
        variant({"retry": {"maxRetries": 21}}),
        {Violation("spec.retry.maxRetries", "maximum")},
        id="maxRetries-over-cap",
    ),
    pytest.param(
        variant({"retry": {"maxRetries": 1000}}),
        {Violation("spec.retry.maxRetries", "maximum")},
        id="absurd-maxRetries",
    ),
    pytest.param(
        variant({"serviceName": "Billing"}), {Violation("spec.serviceName", "pattern")}, id="serviceName-uppercase"
    ),
    pytest.param(
        variant({"serviceName": "billing.v2"}),
        {Violation("spec.serviceName", "pattern")},
        id="serviceName-with-topology-separator-dot",
    ),
    pytest.param(
        variant({"serviceName": "billing:x"}),
        {Violation("spec.serviceName", "pattern")},
        id="serviceName-with-topology-separator-colon",
    ),
    pytest.param(
        variant({"serviceName": "b" * 49}), {Violation("spec.serviceName", "maxLength")}, id="serviceName-too-long"
    ),
    pytest.param(
        variant({"events": {"handlers": [{"name": "orders.*"}]}}),
        {Violation("spec.events.handlers.0.name", "pattern")},
        id="event-name-wildcard",
    ),
    pytest.param(
        variant({"events": {"handlers": [{"name": "orders..created"}]}}),
        {Violation("spec.events.handlers.0.name", "pattern")},
        id="event-name-empty-word",
    ),
    pytest.param(
        variant({"events": {"handlers": [{"name": "x" * 201}]}}),
        {Violation("spec.events.handlers.0.name", "maxLength")},
        id="event-name-too-long",
    ),
    pytest.param(
        variant({"events": {"handlers": [{"name": "a.b"}, {"name": "a.b"}]}}),
        {Violation("spec.events.handlers", "x-kubernetes-list-map-keys")},
        id="duplicate-handler",
    ),
    pytest.param(variant({"queueType": "stream"}), {Violation("spec.queueType", "enum")}, id="unknown-queueType"),
    pytest.param(variant({"broker": None}), {Violation("spec", "required")}, id="missing-broker"),
    pytest.param(
        variant({"broker": {"secretRef": {"name": "Bad_Name"}}}),
        {Violation("spec.broker.secretRef.name", "pattern")},
        id="secret-name-invalid",
    ),
    pytest.param(
        variant(
            {
                "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
                "workers": {"scaleTargetRef": {"name": "w"}},
            }
        ),
        {Violation("spec.autoscaling", "minReplicas must not exceed maxReplicas")},
        id="minReplicas-over-maxReplicas",
    ),
    pytest.param(
        variant({"deliveryLimit": 5}),
        {Violation("spec", "deliveryLimit applies to quorum queues only")},
        id="deliveryLimit-on-classic",
    ),
    pytest.param(
        variant({"autoscaling": {"enabled": True}}),
        {Violation("spec", "autoscaling needs workers.scaleTargetRef")},
        id="autoscaling-without-workers",
    ),
    pytest.param(
        variant(
            {
                "autoscaling": {"enabled": True, "messagesPerReplica": 20, "targetWaitSeconds": 30},
                "workers": {"scaleTargetRef": {"name": "w"}},
            }
        ),
        {Violation("spec.autoscaling", "set messagesPerReplica or targetWaitSeconds, not both")},
        id="queue-length-and-wait-target-both",
    ),
    pytest.param(
        variant(
            {
                "autoscaling": {"enabled": True, "targetWaitSeconds": 30},
                "workers": {"scaleTargetRef": {"name": "w"}},
                "monitoring": {"enabled": False},
            }
        ),
        {
            Violation(
                "spec",
                "autoscaling.targetWaitSeconds needs monitoring.enabled: waits are judged from the Celery events",
            )
        },
        id="wait-target-without-monitoring",
    ),
    pytest.param(
        variant({"events": {"exchange": "amq.topic"}}),
        {Violation("spec.events", "exchange names starting with 'amq.' are reserved by RabbitMQ")},
        id="reserved-exchange",
    ),
]


@pytest.mark.parametrize(("body", "expected"), BAD)
def test_bad_resources_are_rejected_by_their_rule(body: dict[str, Any], expected: set[Violation]) -> None:
    assert set(admit(CRD, body)) == expected


@pytest.mark.parametrize(("body", "expected"), BAD)
def test_operator_models_reject_what_the_schema_rejects(body: dict[str, Any], expected: set[Violation]) -> None:
    with pytest.raises(InvalidSpecError):
        parse_spec(body["spec"])


def test_resource_name_that_cannot_prefix_queues_needs_serviceName() -> None:
    body = variant({}, metadata={"name": "billing.v2"})
    assert admit(CRD, body) == [Violation("", "metadata.name cannot prefix RabbitMQ names: set spec.serviceName")]
    assert admit(CRD, variant({"serviceName": "billing-v2"}, metadata={"name": "billing.v2"})) == []
    with pytest.raises(InvalidSpecError, match=r"set spec\.serviceName"):
        effective_service_name(parse_spec(body["spec"]), "billing.v2")


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            variant({"serviceName": "billing"}),
            variant({"serviceName": "invoicing"}),
            [Violation("spec", "serviceName is immutable")],
            id="serviceName-changed",
        ),
        pytest.param(
            VALID,
            variant({"serviceName": "billing"}),
            [Violation("spec", "serviceName is immutable")],
            id="serviceName-added",
        ),
        pytest.param(
            variant({"queueType": "classic"}),
            variant({"queueType": "quorum"}),
            [Violation("spec", "queueType is immutable")],
            id="queueType-changed",
        ),
        pytest.param(
            VALID,
            variant({"events": {"exchange": "other"}}),
            [Violation("spec.events", "exchange is immutable")],
            id="exchange-changed",
        ),
        pytest.param(
            variant({"broker": {"vhost": "/"}}),
            variant({"broker": {"vhost": "billing"}}),
            [Violation("spec.broker", "vhost is immutable")],
            id="vhost-changed",
        ),
        pytest.param(
            VALID,
            variant({"retry": {"maxRetries": 3}, "events": {"handlers": [{"name": "a.b"}]}}),
            [],
            id="mutable-fields-changed",
        ),
    ],
)
def test_updates_of_immutable_fields_are_rejected(
    old: dict[str, Any], new: dict[str, Any], expected: list[Violation]
) -> None:
    assert admit(CRD, new, old=old) == expected
    assert admit(CRD, new) == [], "the same object is valid when created anew"
