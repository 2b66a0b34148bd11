"""What the operator declared for a service, each entity with its kind (pure).

Kept in an annotation on the resource, so that what the spec drops can be removed later. Deletion acts on
this record — kinds, bindings and dead-letter targets as declared — and never infers anything from a name.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from celery_event_operator.core.topology.plan import Topology

EntityKind = Literal["queue", "exchange"]
Entity = tuple[EntityKind, str]


@dataclasses.dataclass(frozen=True)
class DeclaredQueue:
    name: str
    bindings: tuple[tuple[str, str], ...] = ()  # (exchange, routing key) it is bound to
    dead_letter_exchange: str | None = None
    # "classic" or "quorum"; None in records older than the field. Quorum queues refuse `if-empty` deletes.
    queue_type: str | None = None


@dataclasses.dataclass(frozen=True)
class Declared:
    exchanges: frozenset[str] = frozenset()  # owned ones: the shared events exchange is never recorded
    queues: frozenset[DeclaredQueue] = frozenset()

    @classmethod
    def of(cls, topology: Topology) -> Declared:
        bindings: dict[str, list[tuple[str, str]]] = {}
        for binding in topology.bindings:
            bindings.setdefault(binding.queue, []).append((binding.exchange, binding.routing_key))
        queues = frozenset(
            DeclaredQueue(
                queue.name,
                tuple(sorted(bindings.get(queue.name, ()))),
                _text_or_none(queue.arguments.get("x-dead-letter-exchange")),
                queue.queue_type,
            )
            for queue in topology.queues
        )
        return cls(frozenset(e.name for e in topology.exchanges if not e.shared), queues)

    def __or__(self, other: Declared) -> Declared:
        queues = {queue.name: queue for queue in self.queues} | {queue.name: queue for queue in other.queues}
        return Declared(self.exchanges | other.exchanges, frozenset(queues.values()))

    def obsolete(self, current: Topology) -> Declared:
        """What was declared before and the current plan no longer has."""
        planned_queues = {queue.name for queue in current.queues}
        return Declared(
            self.exchanges - {exchange.name for exchange in current.exchanges},
            frozenset(queue for queue in self.queues if queue.name not in planned_queues),
        )

    def without(self, removed: Iterable[Entity]) -> Declared:
        gone = set(removed)
        return Declared(
            frozenset(name for name in self.exchanges if ("exchange", name) not in gone),
            frozenset(queue for queue in self.queues if ("queue", queue.name) not in gone),
        )

    @property
    def entities(self) -> frozenset[Entity]:
        return frozenset({("exchange", name) for name in self.exchanges} | {("queue", q.name) for q in self.queues})

    def __bool__(self) -> bool:
        return bool(self.exchanges or self.queues)

    def to_json(self) -> str:
        return json.dumps(
            {
                "exchanges": sorted(self.exchanges),
                "queues": [
                    {"name": queue.name, "bindings": [list(b) for b in queue.bindings]}
                    | ({"deadLetterExchange": queue.dead_letter_exchange} if queue.dead_letter_exchange else {})
                    | ({"type": queue.queue_type} if queue.queue_type else {})
                    for queue in sorted(self.queues, key=lambda queue: queue.name)
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str) -> Declared:
        """The record as written by `to_json`; anything else (hand-edited garbage) is an empty record."""
        try:
            loaded = json.loads(raw)
        except ValueError:
            return cls()
        if isinstance(loaded, list):
            # The first releases stored bare names, without kinds: each may be either kind, and deleting
            # what does not exist is harmless, so each is treated as both.
            names = frozenset(name for name in loaded if isinstance(name, str))
            return cls(names, frozenset(DeclaredQueue(name) for name in names))
        if not isinstance(loaded, Mapping):
            return cls()
        return cls(
            frozenset(name for name in _list(loaded.get("exchanges")) if isinstance(name, str)),
            frozenset(queue for queue in map(_queue_from_json, _list(loaded.get("queues"))) if queue is not None),
        )


NOTHING = Declared()


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _queue_from_json(raw: object) -> DeclaredQueue | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
        return None
    bindings = tuple(
        (binding[0], binding[1])
        for binding in _list(raw.get("bindings"))
        if isinstance(binding, list) and len(binding) == 2 and all(isinstance(part, str) for part in binding)
    )
    queue_type = raw.get("type")
    return DeclaredQueue(
        raw["name"],
        bindings,
        _text_or_none(raw.get("deadLetterExchange")),
        queue_type if queue_type in ("classic", "quorum") else None,
    )
