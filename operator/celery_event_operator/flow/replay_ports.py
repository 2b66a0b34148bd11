"""What a replay needs of the broker and of the Kubernetes API (the ports flow/replays.py is given;
adapters/replay/runner.py and adapters/cluster.py implement them, flow/context.py wires them), so that the replay flow
imports no adapter and its sequencing runs on fakes."""

from __future__ import annotations

from typing import Any, Protocol

from celery_event_operator.core.archive.messages import Archived, Selection
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.replay.conclusion import ArchiveSeen
from celery_event_operator.flow.ports import BrokerSource


class MoveProgress(Protocol):
    """How far a move is (written by the move's thread, read by the event loop)."""

    done: int  # replayed (the copy confirmed) or purged
    unroutable: int  # no queue took the copy: it stays archived
    first: Archived | None
    last: Archived | None


class ReplayBroker(Protocol):
    """One replay's broker work, on a connection of its own."""

    @property
    def tally(self) -> MoveProgress: ...  # the current (or last) move's

    async def observe(self, service: str, selection: Selection, keep: int = 0, *, count: bool = True) -> ArchiveSeen:
        """The archive counted whole (without `count`: its size only), and what other clients hold of it."""
        ...

    async def seen_after_move(self, service: str) -> ArchiveSeen | None:
        """The archive as the last move left it, when that move's walk saw all of it and nothing was held elsewhere
        meanwhile (it selected as many events as the count before it); None when it must be observed again."""
        ...

    async def move(
        self, service: str, selection: Selection, *, purge: bool, limit: int | None, rate: float | None
    ) -> MoveProgress:
        """One walk of the archive moving the selected events (BrokerUnavailableError when the connection fails)."""
        ...

    def halt(self) -> None: ...  # the move returns after the events in hand

    def close(self) -> None: ...


class ReplayApi(Protocol):
    """The Kubernetes API calls of a replay."""

    async def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        """The service's body; NotFoundError, or KubeError when the API does not answer."""
        ...

    async def patch_replay_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None: ...


class ReplayContext(Protocol):
    """What every replay's keeper is given (flow.context.Context in the operator; fakes in tests)."""

    @property
    def cluster(self) -> ReplayApi: ...

    @property
    def brokers(self) -> BrokerSource: ...

    def replay_broker(self, settings: BrokerSettings, queue_type: str) -> ReplayBroker:
        """A replay's own broker connection (and thread), for an archive of this queue type."""
        ...
