"""What declaring a service's topology did, as the status and the CLI show it (pure)."""

from __future__ import annotations

import dataclasses

from celery_event_operator.core.errors import OperatorError
from celery_event_operator.core.topology.declared import Declared, Entity
from celery_event_operator.core.topology.plan import QueueRole, Topology


@dataclasses.dataclass(frozen=True)
class QueueState:
    name: str
    role: QueueRole | None  # None: a queue the plan no longer has
    messages: int
    consumers: int


@dataclasses.dataclass(frozen=True)
class Problem:
    """Why the broker does not hold the plan; `message` names the entity and is safe to show."""

    entity: str
    message: str


@dataclasses.dataclass
class Report:
    problems: list[Problem] = dataclasses.field(default_factory=list)
    recreated: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)  # names, for people
    kept: list[QueueState] = dataclasses.field(default_factory=list)  # obsolete, waiting to drain
    removed_entities: set[Entity] = dataclasses.field(default_factory=set)

    def note_removed(self, entity: Entity) -> None:
        self.removed_entities.add(entity)
        if entity[1] not in self.removed:  # a retry level's queue and exchange share their name
            self.removed.append(entity[1])

    def remembered(self, topology: Topology, previous: Declared) -> Declared:
        """What to remember as declared: the plan, and whatever obsolete entity is still there."""
        return previous.obsolete(topology).without(self.removed_entities) | Declared.of(topology)


@dataclasses.dataclass(frozen=True)
class DeclareOutcome:
    """A declare (or removal) of a service's topology: its report, or the failure that stopped it — the
    Secret unusable, the broker unreachable, an operation refused or unsupported (each error's `reason`)."""

    topology: Topology
    broker: str | None = None  # host:port and vhost, for messages
    failure: OperatorError | None = None
    report: Report | None = None


@dataclasses.dataclass(frozen=True)
class EntityState:
    kind: str  # "exchange" or "queue"
    name: str
    present: bool
    messages: int | None = None
    consumers: int | None = None
