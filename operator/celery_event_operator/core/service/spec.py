"""What a resource body says, understood once per generation (pure): the validated spec, its topology plan,
the immutable fields, and what the operator remembers on the resource (its annotations)."""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from celery_event_operator.core.api import models
from celery_event_operator.core.api.metadata import ACCEPTED_IMMUTABLE_ANNOTATION, DECLARED_ANNOTATION
from celery_event_operator.core.api.models import CeleryEventServiceSpec, effective_service_name, parse_spec
from celery_event_operator.core.errors import ImmutableFieldChangedError, InvalidSpecError
from celery_event_operator.core.topology import plan
from celery_event_operator.core.topology.declared import Declared

T = TypeVar("T")
_IMMUTABLE_PATHS = tuple(models.immutable_paths())  # read from the models once, not at every reconcile


@dataclasses.dataclass(frozen=True)
class Validated:
    spec: CeleryEventServiceSpec
    service_name: str


@dataclasses.dataclass(frozen=True)
class Understood:
    """A valid spec and its plan."""

    validated: Validated
    topology: plan.Topology

    @property
    def spec(self) -> CeleryEventServiceSpec:
        return self.validated.spec

    @property
    def service(self) -> str:
        return self.validated.service_name


class GenerationCache(Generic[T]):
    """What was worked out from a resource's spec, per (uid, generation): the spec of a generation never changes.

    Bounded: the oldest entries go first (one per resource is what is used).
    """

    def __init__(self, size: int = 20_000) -> None:
        self._size = size
        self._found: collections.OrderedDict[tuple[str, int], T] = collections.OrderedDict()

    def get(self, body: Mapping[str, Any], work: Callable[[], T]) -> T:
        meta = body.get("metadata") or {}
        uid, generation = meta.get("uid"), meta.get("generation")
        if not isinstance(uid, str) or not isinstance(generation, int):
            return work()
        key = (uid, generation)
        if key in self._found:
            self._found.move_to_end(key)
            return self._found[key]
        found = self._found[key] = work()
        while len(self._found) > self._size:
            self._found.popitem(last=False)
        return found


def validate(body: Mapping[str, Any]) -> Validated:
    """The spec as the operator will act on it; InvalidSpecError with a readable message otherwise."""
    spec = parse_spec(body.get("spec") or {})
    return Validated(spec, effective_service_name(spec, body.get("metadata", {}).get("name", "")))


def understand(body: Mapping[str, Any]) -> Understood | InvalidSpecError:
    """The validated spec and its plan, or why the spec cannot be acted on."""
    try:
        validated = validate(body)
    except InvalidSpecError as exc:
        return exc
    return Understood(validated, plan.plan(validated.service_name, validated.spec))


def immutable_values(body: Mapping[str, Any]) -> dict[str, Any]:
    """`{"broker.vhost": ..., "queueType": ...}`: the spec's immutable fields as written (None when absent)."""
    values: dict[str, Any] = {}
    for path in _IMMUTABLE_PATHS:
        value: Any = body.get("spec") or {}
        for part in path:
            value = value.get(part) if isinstance(value, Mapping) else None
        values[".".join(path)] = value
    return values


def immutable_changes(body: Mapping[str, Any]) -> tuple[dict[str, Any], ImmutableFieldChangedError | None]:
    """The immutable fields to remember, and the error when one changed since the operator accepted them."""
    current = immutable_values(body)
    raw = annotations_of(body).get(ACCEPTED_IMMUTABLE_ANNOTATION)
    try:
        accepted = json.loads(raw) if raw else None
    except ValueError:
        accepted = None  # hand-edited: start again from what is there now
    if not isinstance(accepted, dict):
        return current, None
    changed = [
        f"{field} is immutable: it was {accepted.get(field)!r} when the resource was accepted and is {value!r} now"
        for field, value in current.items()
        if field in accepted and accepted[field] != value
    ]
    if not changed:
        return current, None
    return accepted, ImmutableFieldChangedError("; ".join(changed) + " (set it back, or create a new resource)")


def as_accepted(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The resource with its immutable fields as the operator accepted them — what its entities and its claim on
    the broker were made under — when a change of one was refused (an API that does not enforce the CRD's rule)."""
    accepted, changed = immutable_changes(body)
    if changed is None:
        return body
    spec = copy.deepcopy(dict(body.get("spec") or {}))
    for field, value in accepted.items():
        *parents, last = field.split(".")
        target = spec
        for part in parents:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return {**body, "spec": spec}


def annotations_of(body: Mapping[str, Any]) -> Mapping[str, str]:
    return (body.get("metadata") or {}).get("annotations") or {}


def generation_of(body: Mapping[str, Any]) -> int | None:
    generation = (body.get("metadata") or {}).get("generation")
    return generation if isinstance(generation, int) else None


def declared_entities(body: Mapping[str, Any]) -> Declared:
    raw = annotations_of(body).get(DECLARED_ANNOTATION)
    return _declared(raw) if raw else Declared()


@functools.lru_cache(maxsize=4096)  # read at every resync of every service, changed only by a declare that removes
def _declared(raw: str) -> Declared:
    return Declared.from_json(raw)
