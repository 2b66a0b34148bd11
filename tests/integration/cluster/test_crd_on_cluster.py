"""The CRDs on the real API server: every bad resource the offline admission (tests/support/crd_validation.py,
used by tests/unit/api/test_admission.py) rejects is refused by kube-apiserver too, for the same field and, for a
CEL rule, with its message as the API server words it; immutable fields refused on update; the status and scale
subresources and the printer columns as `kubectl` shows them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_operator.core.api import crd
from tests.support.cluster import Cluster
from tests.support.crd_validation import Violation
from tests.support.kube import ApiError
from tests.unit.api.test_admission import BAD, VALID, variant

SCHEMA_KEYWORDS = {"type", "additionalProperties", "minimum", "maximum", "pattern", "maxLength", "enum", "required"}


@pytest.fixture(scope="module")
def crd_namespace(cluster: Cluster) -> Iterator[str]:
    cluster.apply(list(crd.custom_resource_definitions()), cluster.directory / "crds.yaml")
    for definition in crd.custom_resource_definitions():
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{definition['metadata']['name']}")
    name = cluster.create_namespace("crd")
    yield name
    cluster.client.delete(f"/api/v1/namespaces/{name}")


def services(namespace: str) -> str:
    return f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"


def refusal(cluster: Cluster, namespace: str, body: dict[str, Any]) -> ApiError:
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = namespace
    with pytest.raises(ApiError) as refused:  # strict field validation, as kubectl asks for it
        cluster.client.create(services(namespace) + "?fieldValidation=Strict", body)
    return refused.value


@pytest.mark.parametrize(("body", "expected"), BAD)
def test_the_api_server_refuses_what_the_offline_admission_refuses(
    cluster: Cluster, crd_namespace: str, body: dict[str, Any], expected: set[Violation]
) -> None:
    error = refusal(cluster, crd_namespace, body)
    message = error.body["message"]
    assert error.status in (400, 422), message
    for violation in expected:
        if violation.rule in SCHEMA_KEYWORDS or violation.rule.startswith("x-kubernetes"):
            # The schema's refusals name the field (an unknown field: the one not declared under it).
            assert violation.path.split(".")[0] in message, message
        else:
            assert violation.rule in message, message


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        (variant({"serviceName": "billing"}), variant({"serviceName": "invoicing"}), "serviceName is immutable"),
        (VALID, variant({"serviceName": "billing"}), "serviceName is immutable"),
        (variant({"queueType": "classic"}), variant({"queueType": "quorum"}), "queueType is immutable"),
        (VALID, variant({"events": {"exchange": "other"}}), "exchange is immutable"),
        (variant({"broker": {"vhost": "/"}}), variant({"broker": {"vhost": "billing"}}), "vhost is immutable"),
    ],
)
def test_immutable_fields_are_refused_on_update_with_the_rules_message(
    cluster: Cluster, crd_namespace: str, old: dict[str, Any], new: dict[str, Any], rule: str
) -> None:
    path = services(crd_namespace)
    created = cluster.client.create(path, {**copy.deepcopy(old), "metadata": {"name": "immutable"}})
    try:
        changed = {
            **copy.deepcopy(new),
            "metadata": {"name": "immutable", **{"resourceVersion": created["metadata"]["resourceVersion"]}},
        }
        with pytest.raises(ApiError) as refused:
            cluster.client.request("PUT", f"{path}/immutable", changed)
        assert refused.value.status == 422
        assert rule in refused.value.body["message"]
    finally:
        cluster.client.delete(f"{path}/immutable")


def test_a_service_stored_with_the_old_default_switches_to_a_wait_target_with_the_upgrade_guides_patch(
    cluster: Cluster, crd_namespace: str
) -> None:
    """docs/getting-started/upgrade.md: a service an earlier release stored carries `messagesPerReplica: 20` (the
    schema's default then); adding the target alone is refused with the rule's message, the guide's merge patch
    (`messagesPerReplica: null` beside it) is taken; and back the same way."""
    path = services(crd_namespace)
    stored = variant(
        {
            "workers": {"scaleTargetRef": {"name": "billing-worker"}},
            "autoscaling": {"enabled": True, "messagesPerReplica": 20},
        }
    )
    stored["metadata"] = {"name": "upgraded"}
    cluster.client.create(path, stored)
    try:
        with pytest.raises(ApiError) as refused:
            cluster.client.merge_patch(f"{path}/upgraded", {"spec": {"autoscaling": {"targetWaitSeconds": 30}}})
        assert refused.value.status == 422
        assert "set messagesPerReplica or targetWaitSeconds, not both" in refused.value.body["message"]
        switched = cluster.client.merge_patch(
            f"{path}/upgraded", {"spec": {"autoscaling": {"messagesPerReplica": None, "targetWaitSeconds": 30}}}
        )
        autoscaling = switched["spec"]["autoscaling"]
        assert (autoscaling.get("messagesPerReplica"), autoscaling["targetWaitSeconds"]) == (None, 30)
        back = cluster.client.merge_patch(
            f"{path}/upgraded", {"spec": {"autoscaling": {"targetWaitSeconds": None, "messagesPerReplica": 10}}}
        )
        assert (
            back["spec"]["autoscaling"].get("targetWaitSeconds"),
            back["spec"]["autoscaling"]["messagesPerReplica"],
        ) == (
            None,
            10,
        )
    finally:
        cluster.client.delete(f"{path}/upgraded")


def test_status_and_scale_subresources_and_printer_columns(cluster: Cluster, crd_namespace: str) -> None:
    path = services(crd_namespace)
    body = variant({"workers": {"scaleTargetRef": {"name": "billing-worker"}, "replicas": 1}})
    body["metadata"] = {"name": "columns"}
    created = cluster.client.create(path, body)
    assert created["metadata"]["generation"] == 1
    status = cluster.client.merge_patch(
        f"{path}/columns/status",
        {
            "status": {
                "queueLength": 42,
                "consumers": 3,
                "replicas": 2,
                "selector": "app=billing-worker",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "Reconciled",
                        "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        },
    )
    assert status["metadata"]["generation"] == 1, "a status write is no new generation"
    scale = cluster.client.get(f"{path}/columns/scale")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"], scale["status"]["selector"]) == (
        1,
        2,
        "app=billing-worker",
    )
    cluster.kubectl("scale", "ces", "columns", "-n", crd_namespace, "--replicas=4")
    assert cluster.client.get(f"{path}/columns")["spec"]["workers"]["replicas"] == 4
    table = cluster.kubectl("get", "ces", "columns", "-n", crd_namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "QUEUE", "CONSUMERS", "REPLICAS", "AGE"]
    assert table[1].split()[:5] == ["columns", "True", "42", "3", "2"]
    cluster.client.delete(f"{path}/columns")
