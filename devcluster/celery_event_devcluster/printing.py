"""Server-side printing (`kubectl get` asks for a Table): printer columns over objects (pure)."""

from __future__ import annotations

import datetime
import re
from typing import Any

# The JSONPath forms CRD printer columns use: `.a.b`, `.a[0]`, `.a[?(@.k=="v")].b`.
_STEP = re.compile(r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_-]+)\s*==\s*["']([^"']*)["']\)\]""")


def jsonpath(obj: Any, path: str) -> list[Any]:
    """All values at `path`; an empty list where a step finds nothing (kubectl prints `<none>`/blank)."""
    nodes = [obj]
    position = 0
    while position < len(path):
        match = _STEP.match(path, position)
        if match is None:
            raise ValueError(f"unsupported JSONPath {path!r} at {position}")
        position = match.end()
        key, index, filter_key, filter_value = match.groups()
        found: list[Any] = []
        for node in nodes:
            if key is not None and isinstance(node, dict) and key in node:
                found.append(node[key])
            elif index is not None and isinstance(node, list) and int(index) < len(node):
                found.append(node[int(index)])
            elif filter_key is not None and isinstance(node, list):
                found.extend(
                    item for item in node if isinstance(item, dict) and str(item.get(filter_key)) == filter_value
                )
        nodes = found
    return nodes


def human_age(timestamp: str, now: datetime.datetime | None = None) -> str:
    """The API server's short duration: 42s, 5m, 3h, 2d (as `kubectl get` shows ages)."""
    moment = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = int(((now or datetime.datetime.now(tz=datetime.UTC)) - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


# The columns the API server prints for built-in kinds that kubectl users read (Events: `kubectl get events`);
# other built-ins get Name and Age. An "objectReference" cell is printed as kubectl does: kind/name.
BUILTIN_COLUMNS: dict[str, list[dict[str, Any]]] = {
    "events": [
        {"name": "Last Seen", "type": "date", "jsonPath": ".lastTimestamp"},
        {"name": "Type", "type": "string", "jsonPath": ".type"},
        {"name": "Reason", "type": "string", "jsonPath": ".reason"},
        {"name": "Object", "type": "objectReference", "jsonPath": ".involvedObject"},
        {"name": "Message", "type": "string", "jsonPath": ".message"},
    ],
}
NAME_PRIORITY = {"events": 1}  # Events: the name only with -o wide


def _cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    values = jsonpath(obj, column["jsonPath"])
    if not values and column.get("type") == "date":
        values = jsonpath(obj, ".metadata.creationTimestamp")  # an Event without lastTimestamp: when it was made
    if not values:
        return None
    value = values[0]
    if column.get("type") == "date" and isinstance(value, str):
        return human_age(value)
    if column.get("type") == "objectReference" and isinstance(value, dict):
        return f"{str(value.get('kind', '')).lower()}/{value.get('name', '')}"
    return value


def table(
    items: list[dict[str, Any]], columns: list[dict[str, Any]], resource_version: str, name_priority: int = 0
) -> dict[str, Any]:
    """A meta.k8s.io/v1 Table: Name, then the printer columns (Age by default, as for builtins)."""
    columns = columns or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    definitions = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "priority": name_priority,
            "description": "Name of the object",
        }
    ]
    definitions += [
        {
            "name": column["name"],
            "type": "string" if column.get("type") == "objectReference" else column.get("type", "string"),
            "format": "",
            "priority": column.get("priority", 0),
            "description": column.get("description", ""),
        }
        for column in columns
    ]
    return {
        "apiVersion": "meta.k8s.io/v1",
        "kind": "Table",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": [
            {
                "cells": [item["metadata"]["name"], *(_cell(item, column) for column in columns)],
                "object": {
                    "apiVersion": "meta.k8s.io/v1",
                    "kind": "PartialObjectMetadata",
                    "metadata": item["metadata"],
                },
            }
            for item in items
        ],
    }
