"""Offline admission of a resource against a CRD, the way the API server does it.

Order as in kube-apiserver: nulls pruned and defaults from the structural schema, strict field validation (unknown
fields rejected, as `kubectl apply` asks by default), OpenAPI validation, then the CEL rules
(`x-kubernetes-validations`), transition rules (those naming `oldSelf`) only on update.
Each violation names its path and the rule that caught it, so tests can assert *which* rule fired.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import celpy
import jsonschema

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Violation:
    path: str  # e.g. "spec.retry.maxRetries"
    rule: str  # a JSON-schema keyword ("maximum", "pattern", …) or a CEL rule's message


def openapi_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _strict(schema: Any) -> Any:
    """Objects with declared properties accept no others (server-side strict field validation)."""
    if not isinstance(schema, dict):
        return schema
    result = {key: _strict(value) if key in ("items",) else value for key, value in schema.items()}
    if "properties" in schema:
        result["properties"] = {name: _strict(prop) for name, prop in schema["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields"):
            result["additionalProperties"] = False
    return result


def prune_nulls(schema: dict[str, Any], value: Any) -> Any:
    """A field set to null that the schema does not call nullable is dropped before defaulting (the API server's
    structural pruning: `field: null` means the field is unset)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name in value and value[name] is None and not prop.get("nullable"):
                del value[name]
            elif name in value:
                value[name] = prune_nulls(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [prune_nulls(schema["items"], item) for item in value]
    return value


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting: absent properties with a default get it, recursively."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                value[name] = apply_defaults(prop, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _path(parts: Any) -> str:
    return ".".join(str(part) for part in parts)


def _duplicate_map_keys(schema: dict[str, Any], value: Any, path: list[str]) -> list[Violation]:
    """`x-kubernetes-list-type: map` lists hold one item per key (JSON schema cannot say so)."""
    found = []
    if isinstance(value, list) and schema.get("x-kubernetes-list-type") == "map":
        # (an item that is no object, or a key of another type, is the schema's violation: compared as text here)
        keys = [
            repr([item.get(key) for key in schema["x-kubernetes-list-map-keys"]])
            for item in value
            if isinstance(item, dict)
        ]
        if len(keys) != len(set(keys)):
            found.append(Violation(_path(path), "x-kubernetes-list-map-keys"))
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                found += _duplicate_map_keys(prop, value[name], [*path, name])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += _duplicate_map_keys(schema["items"], item, [*path, str(index)])
    return found


def _schema_violations(schema: dict[str, Any], obj: Any) -> list[Violation]:
    validator = jsonschema.Draft7Validator(_strict(schema))
    found = [
        Violation(_path(error.absolute_path), str(error.validator))
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]
    return found + _duplicate_map_keys(schema, obj, [])


_ENVIRONMENT = celpy.Environment()


def _evaluate(rule: str, self_value: Any, old_value: Any) -> bool:
    program = _ENVIRONMENT.program(_ENVIRONMENT.compile(rule))
    activation = {"self": celpy.json_to_cel(self_value)}
    if old_value is not _MISSING:
        activation["oldSelf"] = celpy.json_to_cel(old_value)
    result = program.evaluate(activation)
    if isinstance(result, celpy.CELEvalError):
        return False
    return bool(result)


def _cel_violations(schema: dict[str, Any], value: Any, old: Any, path: list[str]) -> list[Violation]:
    found = []
    for validation in schema.get("x-kubernetes-validations", []):
        is_transition = "oldSelf" in validation["rule"]
        if is_transition and old is _MISSING:
            continue  # transition rules only run on update, where the old value exists
        if not _evaluate(validation["rule"], value, old):
            found.append(Violation(_path(path), validation["message"]))
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                old_child = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
                found += _cel_violations(prop, value[name], old_child, [*path, name])
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            found += _cel_violations(schema["items"], item, _MISSING, [*path, str(index)])
    return found


def stored(crd: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server stores it, and the operator reads it: nulls pruned, defaults applied, and a number
    with a zero fraction an integer (the API server decodes `1.0` to a float and writes it back as `1`: measured on
    v1.37.2 with a replay's ratePerSecond)."""
    schema = openapi_schema(crd)
    found: dict[str, Any] = apply_defaults(schema, prune_nulls(schema, _whole_numbers(copy.deepcopy(obj))))
    return found


def _whole_numbers(value: Any) -> Any:
    # Go writes a float below 1e21 without exponent (`1`), larger ones with one (`1e+21`), read back as a float.
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(inner) for inner in value]
    return value


def admit(crd: dict[str, Any], obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[Violation]:
    """All violations of `obj` (an update of `old` when given); empty when the API would accept it."""
    schema = openapi_schema(crd)
    new = stored(crd, obj)
    violations = _schema_violations(schema, new)
    if violations:
        return violations  # as the API server: CEL runs on well-typed objects only
    previous = stored(crd, old) if old is not None else _MISSING
    return _cel_violations(schema, new, previous, [])
