"""What a resource body says, understood once per generation (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_event_operator.core.api.metadata import ACCEPTED_IMMUTABLE_ANNOTATION, DECLARED_ANNOTATION
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.service import spec as specs

GOOD_SPEC = {"broker": {"secretRef": {"name": "rabbitmq"}}, "events": {"handlers": [{"name": "e"}]}}


def body(spec: dict[str, Any] | None = None, name: str = "billing", **metadata: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, **metadata}, "spec": GOOD_SPEC if spec is None else spec}


def test_the_resource_name_is_the_default_service_name() -> None:
    assert specs.validate(body()).service_name == "billing"
    with pytest.raises(InvalidSpecError, match="serviceName"):
        specs.validate(body(name="billing.v2"))


def test_understand_plans_a_valid_spec_and_returns_why_not_otherwise() -> None:
    understood = specs.understand(body())
    assert isinstance(understood, specs.Understood)
    assert understood.service == "billing"
    assert [q.name for q in understood.topology.queues if q.role == "events"] == ["billing.e"]
    invalid = specs.understand(body({**GOOD_SPEC, "retry": {"maxRetries": 99}}))
    assert isinstance(invalid, InvalidSpecError)
    assert invalid.reason == "InvalidSpec"
    assert "retry.maxRetries" in str(invalid)


def test_the_generation_cache_works_once_per_uid_and_generation_and_stays_bounded() -> None:
    cache = specs.GenerationCache[int](size=2)
    calls: list[int] = []

    def work(value: int) -> int:
        calls.append(value)
        return value

    first = body(uid="u1", generation=1)
    assert cache.get(first, lambda: work(1)) == 1
    assert cache.get(first, lambda: work(99)) == 1, "the same generation is not worked out again"
    cache.get(body(uid="u1", generation=2), lambda: work(2))
    cache.get(body(uid="u2", generation=1), lambda: work(3))
    assert cache.get(first, lambda: work(4)) == 4, "the oldest entry went"
    assert cache.get(body(), lambda: work(5)) == 5, "without uid and generation nothing is cached"
    assert calls == [1, 2, 3, 4, 5]


def _with_spec(spec: dict[str, Any], accepted: dict[str, Any] | str | None) -> dict[str, Any]:
    annotations = {}
    if accepted is not None:
        annotations[ACCEPTED_IMMUTABLE_ANNOTATION] = accepted if isinstance(accepted, str) else json.dumps(accepted)
    return {"metadata": {"annotations": annotations}, "spec": spec}


def test_immutable_fields_are_remembered_and_a_change_is_refused_with_what_changed() -> None:
    spec = {"serviceName": "billing", "queueType": "classic", "broker": {"secretRef": {"name": "s"}}}
    first, error = specs.immutable_changes(_with_spec(spec, None))
    assert error is None
    assert first == {"serviceName": "billing", "queueType": "classic", "broker.vhost": None, "events.exchange": None}
    assert specs.immutable_changes(_with_spec(spec, first)) == (first, None)
    renamed = {**spec, "serviceName": "billing2", "queueType": "quorum"}
    kept, refused = specs.immutable_changes(_with_spec(renamed, first))
    assert kept == first, "what was accepted stays remembered"
    assert refused is not None
    assert refused.reason == "ImmutableFieldChanged"
    assert "serviceName is immutable: it was 'billing' when the resource was accepted and is 'billing2' now" in str(
        refused
    )
    assert "queueType is immutable" in str(refused)
    with_vhost = {**spec, "broker": {"secretRef": {"name": "s"}, "vhost": "/other"}}
    assert specs.immutable_changes(_with_spec(with_vhost, first))[1] is not None, "set where it was unset"
    assert specs.immutable_changes(_with_spec(renamed, "not json"))[1] is None, "garbage: start again"


@pytest.mark.parametrize("raw", ["", "not json", '{"a": 1}', '[1, "x"]'])
def test_declared_entities_survive_garbage(raw: str) -> None:
    found = specs.declared_entities({"metadata": {"annotations": {DECLARED_ANNOTATION: raw}}})
    assert found.entities <= {("queue", "x"), ("exchange", "x")}
