"""Render the CustomResourceDefinitions from the pydantic models (pure).

Pydantic emits JSON Schema with `$ref`, `anyOf: [X, null]` for optionals and titles; a CRD needs a
structural schema: every node typed, everything inlined, no nulls. This module translates one into
the other and adds what only Kubernetes knows: subresources, printer columns, CEL rules.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import yaml

from celery_event_operator.core.api import models
from celery_event_operator.core.api.metadata import GROUP

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
    """A default as the API server stores it: an unset optional field is absent, never null."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return copy.deepcopy(value)


def _schema_of(model: type[models.Model]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    definitions = raw.pop("$defs", {})
    schema: dict[str, Any] = _inline(raw, definitions)
    return schema


# A run to completion, as Knative and Tekton say it: one condition, Succeeded, Unknown while it runs (its reason
# says how far: waiting, running) and True or False at the end.
REPLAY_PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Service", "type": "string", "jsonPath": ".spec.serviceRef.name"},
    {"name": "Action", "type": "string", "jsonPath": ".spec.action"},
    {"name": "Succeeded", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Succeeded")].status'},
    {"name": "Reason", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Succeeded")].reason'},
    {"name": "Matched", "type": "integer", "jsonPath": ".status.matched"},
    {"name": "Replayed", "type": "integer", "jsonPath": ".status.replayed"},
    {"name": "Purged", "type": "integer", "priority": 1, "jsonPath": ".status.purged"},
    {"name": "Skipped", "type": "integer", "priority": 1, "jsonPath": ".status.skipped"},
    {"name": "Remaining", "type": "integer", "jsonPath": ".status.remaining"},
    {"name": "Started", "type": "date", "priority": 1, "jsonPath": ".status.startTime"},
    {"name": "Completed", "type": "date", "priority": 1, "jsonPath": ".status.completionTime"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


@dataclasses.dataclass(frozen=True)
class Kind:
    """One custom resource of the API: its models and what only Kubernetes knows of it."""

    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    spec: type[models.Model]
    status: type[models.Model]
    description: str
    printer_columns: list[dict[str, Any]]
    subresources: dict[str, Any]
    root_validations: list[models.JsonDict]

    @property
    def file_name(self) -> str:
        return f"{self.plural}.{GROUP}.yaml"


SERVICE = Kind(
    kind=models.KIND,
    plural=models.PLURAL,
    singular=models.SINGULAR,
    short_names=models.SHORT_NAMES,
    spec=models.CeleryEventServiceSpec,
    status=models.CeleryEventServiceStatus,
    description="Desired state of one Celery event service.",
    printer_columns=PRINTER_COLUMNS,
    subresources={
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.workers.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    },
    root_validations=ROOT_VALIDATIONS,
)
REPLAY = Kind(
    kind=models.REPLAY_KIND,
    plural=models.REPLAY_PLURAL,
    singular=models.REPLAY_SINGULAR,
    short_names=models.REPLAY_SHORT_NAMES,
    spec=models.CeleryEventReplaySpec,
    status=models.CeleryEventReplayStatus,
    description="A replay or purge of a service's archived events, run once by the operator.",
    printer_columns=REPLAY_PRINTER_COLUMNS,
    subresources={"status": {}},
    root_validations=[],
)
KINDS = (SERVICE, REPLAY)


def open_api_schema(kind: Kind = SERVICE) -> dict[str, Any]:
    spec = _schema_of(kind.spec)
    status = _schema_of(kind.status)
    spec["description"] = kind.description
    status["description"] = "Observed state, written by the operator."
    schema: dict[str, Any] = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    if kind.root_validations:
        schema["x-kubernetes-validations"] = kind.root_validations
    return schema


def custom_resource_definition(kind: Kind = SERVICE) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{kind.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "celery-event-operator"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": ["celery"],
            },
            "versions": [
                {
                    "name": models.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": open_api_schema(kind)},
                    "subresources": kind.subresources,
                    "additionalPrinterColumns": kind.printer_columns,
                }
            ],
        },
    }


def custom_resource_definitions() -> list[dict[str, Any]]:
    """Every CRD of the operator, the service's first."""
    return [custom_resource_definition(kind) for kind in KINDS]


CRD_FILE_NAME = SERVICE.file_name
_HEADER = (
    "# Generated by `celery-event-operator crd` from operator/celery_event_operator/core/api/models.py; do not edit.\n"
)


def render_yaml(kind: Kind = SERVICE) -> str:
    return _HEADER + yaml.safe_dump(custom_resource_definition(kind), sort_keys=False, width=120)
