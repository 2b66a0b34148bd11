"""Render the CustomResourceDefinition from the pydantic models (pure).

Pydantic emits JSON Schema with `$ref`, `anyOf: [X, null]` for optionals and titles; a CRD needs a
structural schema: every node typed, everything inlined, no nulls. This module translates one into
the other and adds what only Kubernetes knows: subresources, printer columns, CEL rules.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from celery_event_operator.api import models

# Keywords a structural CRD schema may carry over from pydantic's output.
_KEPT_KEYWORDS = frozenset(
    {
        "type",
        "description",
        "default",
        "enum",
        "format",
        "pattern",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "properties",
        "items",
        "required",
        "x-kubernetes-validations",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    }
)

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
    {"name": "Reason", "type": "string", "priority": 1, "jsonPath": '.status.conditions[?(@.type=="Ready")].reason'},
    {
        "name": "Queue",
        "type": "integer",
        "jsonPath": ".status.queueLength",
        "description": "Messages waiting in the handler queues",
    },
    {"name": "Retrying", "type": "integer", "priority": 1, "jsonPath": ".status.retrying"},
    {"name": "Archived", "type": "integer", "priority": 1, "jsonPath": ".status.archived"},
    {"name": "Consumers", "type": "integer", "jsonPath": ".status.consumers"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# The root rule sees metadata.name, which the spec's own schema cannot.
ROOT_VALIDATIONS = [models.SERVICE_NAME_RULE.rendered()]


def _inline(node: Any, definitions: dict[str, Any]) -> Any:
    """Resolve `$ref`s, drop nullable branches, and keep only structural keywords."""
    if isinstance(node, list):
        return [_inline(item, definitions) for item in node]
    if not isinstance(node, dict):
        return node

    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
        return _inline(merged, definitions)

    if "anyOf" in node:
        # Optional[X] → X: absence, not null, is how a CRD says "unset".
        branches = [branch for branch in node["anyOf"] if branch.get("type") != "null"]
        if len(branches) != 1:
            raise ValueError(f"cannot express a union in a structural schema: {node['anyOf']!r}")
        merged = {**branches[0], **{key: value for key, value in node.items() if key != "anyOf"}}
        if merged.get("default", ...) is None:
            del merged["default"]
        return _inline(merged, definitions)

    result: dict[str, Any] = {}
    for key, value in node.items():
        if key not in _KEPT_KEYWORDS:
            continue
        if key == "properties":
            result[key] = {name: _inline(prop, definitions) for name, prop in value.items()}
        elif key in ("items",):
            result[key] = _inline(value, definitions)
        elif key == "default":
            result[key] = _without_nulls(value)
        else:
            result[key] = copy.deepcopy(value)
    if "enum" in result and "type" not in result:
        result["type"] = "string"
    if "properties" in result:
        result.setdefault("type", "object")
    return result


def _without_nulls(value: Any) -> Any:
    """A default as the API server may apply it: an object's unset optional fields absent, not null."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return copy.deepcopy(value)


def _schema_of(model: type[models.Model]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    schema: dict[str, Any] = _inline(raw, definitions)
    return schema


def open_api_schema() -> dict[str, Any]:
    spec = _schema_of(models.CeleryEventServiceSpec)
    status = _schema_of(models.CeleryEventServiceStatus)
    spec["description"] = "Desired state of one Celery event service."
    status["description"] = "Observed state, written by the operator."
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": ROOT_VALIDATIONS,
    }


def custom_resource_definition() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{models.PLURAL}.{models.GROUP}",
            "labels": {"app.kubernetes.io/name": "celery-event-operator"},
        },
        "spec": {
            "group": models.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": models.KIND,
                "listKind": f"{models.KIND}List",
                "plural": models.PLURAL,
                "singular": models.SINGULAR,
                "shortNames": list(models.SHORT_NAMES),
                "categories": ["celery"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": open_api_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


CRD_FILE_NAME = f"{models.PLURAL}.{models.GROUP}.yaml"
_HEADER = "# Generated by `celery-event-operator crd` from operator/celery_event_operator/api/models.py; do not edit.\n"


def render_yaml() -> str:
    return _HEADER + yaml.safe_dump(custom_resource_definition(), sort_keys=False, width=120)
