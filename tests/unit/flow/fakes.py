"""Fakes of the flow's ports (flow/ports.py, flow/replay_ports.py): brokers and a Kubernetes API that record what a
keeper asks of them and answer as told; the status written goes into the body, as the API server and the watch
would bring it back.
They stand for the ports, not for the adapters (none is imported here): mypy checks this module (pyproject.toml)
and the assignments at its end to each port's Protocol."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from celery_event_operator.core.api.models import CeleryEventServiceSpec, ScaleTargetRef
from celery_event_operator.core.archive.messages import Archived, Selection
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.broker.settings import BrokerSettings, TlsMaterial
from celery_event_operator.core.errors import KubeError, NotFoundError, OperatorError
from celery_event_operator.core.injection.outcome import WorkersOutcome, count_pods
from celery_event_operator.core.lifecycle.consumers import ByConnection, Consumer, Holding
from celery_event_operator.core.monitoring.bounds import DEFAULT_SETTINGS, series_settings
from celery_event_operator.core.monitoring.consumer import CONNECTING, EventsSubscription
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.core.replay.conclusion import ArchiveSeen
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service.ownership import Claim, Claimant, Holder
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import ListedEntities
from celery_event_operator.core.topology.outcome import Report
from celery_event_operator.core.topology.plan import Topology
from celery_event_operator.flow.ports import (
    BrokerSource,
    ClusterAccess,
    EventsFeed,
    KeeperContext,
    MetricsStore,
    ServiceBroker,
)
from celery_event_operator.flow.replay_ports import ReplayApi, ReplayBroker, ReplayContext

ADDRESS = broker_address.parse("amqp://user:secret@broker.example:5672/shop")
SETTINGS = BrokerSettings(ADDRESS, TlsMaterial(), ADDRESS.management_url())


@dataclasses.dataclass
class FakeSubscription:
    queue: str
    tag: bytes
    problem: str | None = CONNECTING  # as a consumer begins: its connection not made yet


class FakeEvents:
    def __init__(self) -> None:
        self.problem: str | None = None
        self.login_refused = False
        self.connected = True
        self.subscriptions: list[EventsSubscription] = []

    def subscribe(self, name: str, queue: str, exchange: str, metrics: ServiceMetrics) -> EventsSubscription:
        subscription = FakeSubscription(queue, f"tag-{len(self.subscriptions)}".encode())
        self.subscriptions.append(subscription)
        return subscription

    def unsubscribe(self, subscription: EventsSubscription) -> None:
        self.subscriptions.remove(subscription)


class FakeBroker:
    def __init__(self, settings: BrokerSettings = SETTINGS) -> None:
        self.key = settings.key
        self.display = settings.address.display
        self.version: str | None = "3.10.8"
        self.events = FakeEvents()
        self.declares: list[tuple[str, bool]] = []  # service, remove
        self.declare_failure: OperatorError | None = None
        self.depth_answer: tuple[tuple[QueueDepth, ...], str] | OperatorError = ((), "ready + unacknowledged")
        self.consumer_answer: tuple[Consumer, ...] | OperatorError = ()
        self.alarm_answer: tuple[Alarm, ...] | OperatorError = ()
        self.holding_answer: tuple[Holding, ...] | OperatorError = ()
        # The vhost's entities as the management API lists them (by default: none at hand).
        self.listed_answer: ListedEntities | None = None
        self.calls: list[str] = []
        self.claims: dict[str, Claimant] = {}  # service → who holds it (the claim exchanges on this broker)
        self.claim_failure: OperatorError | None = None
        self.claims_asked = 0
        self.claim_gate: asyncio.Event | None = None  # set: a claim waits for it (a broker round trip under way)

    async def claim(self, service: str, claimant: Claimant) -> Claim:
        self.claims_asked += 1
        if self.claim_gate is not None:
            await self.claim_gate.wait()
        if self.claim_failure is not None:
            raise self.claim_failure
        held = self.claims.setdefault(service, claimant)
        return Claim() if held.id == claimant.id else Claim(Holder(held.id, held.namespace, held.name))

    async def claim_at_deletion(self, service: str, claimant: Claimant) -> Claim:
        existed = service in self.claims
        found = await self.claim(service, claimant)
        return dataclasses.replace(found, fresh=found.ours and not existed)

    async def release(self, service: str, claimant: Claimant) -> Claim:
        found = await self.claim(service, claimant)
        if found.ours:
            del self.claims[service]
        return found

    async def declare(self, topology: Topology, previous: Declared, *, remove: bool = False) -> Report:
        self.declares.append((topology.service, remove))
        if self.declare_failure is not None:
            raise self.declare_failure
        return Report()

    def listed(self, max_age: float) -> ListedEntities | None:
        self.calls.append("listed")
        return self.listed_answer

    async def depths(self, topology: Topology, max_age: float) -> tuple[tuple[QueueDepth, ...], str]:
        if isinstance(self.depth_answer, OperatorError):
            raise self.depth_answer
        return self.depth_answer

    async def consumers(self, max_age: float) -> ByConnection[Consumer]:
        if isinstance(self.consumer_answer, OperatorError):
            raise self.consumer_answer
        return ByConnection(self.consumer_answer)

    async def alarms(self, max_age: float) -> tuple[Alarm, ...]:
        if isinstance(self.alarm_answer, OperatorError):
            raise self.alarm_answer
        return self.alarm_answer

    async def holdings(self, max_age: float) -> ByConnection[Holding]:
        self.calls.append("holdings")
        if isinstance(self.holding_answer, OperatorError):
            raise self.holding_answer
        return ByConnection(self.holding_answer)


class FakeBrokers:
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.secret_failure: OperatorError | None = None
        self.users = 0
        self.forgotten: list[tuple[str, str]] = []

    async def settings(self, namespace: str, spec: CeleryEventServiceSpec) -> BrokerSettings:
        if self.secret_failure is not None:
            raise self.secret_failure
        return SETTINGS

    def acquire(self, settings: BrokerSettings) -> FakeBroker:
        self.users += 1
        return self.broker

    async def release(self, key: str) -> None:
        assert key == self.broker.key
        self.users -= 1

    def forget_secret(self, namespace: str, name: str) -> None:
        self.forgotten.append((namespace, name))


class FakeCluster:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.calls: list[tuple[Any, ...]] = []
        self.scale: int | None = 1
        self.scale_failure: KubeError | None = None
        self.workers_unavailable: str | None = None  # the API does not answer sync_workers' reads
        self.evictable = True
        self.synced: list[CeleryEventServiceSpec] = []  # the spec of each sync_workers (what the ConfigMap holds)

    async def sync_workers(
        self, *, owner: dict[str, Any], service: str, spec: CeleryEventServiceSpec, pod_hashes: list[str | None]
    ) -> WorkersOutcome:
        self.calls.append(("sync_workers", service))
        self.synced.append(spec)
        if self.workers_unavailable is not None:
            return WorkersOutcome("h1", unavailable=self.workers_unavailable)
        return count_pods("h1", pod_hashes)

    async def read_scale(self, namespace: str, target: ScaleTargetRef) -> int | None:
        self.calls.append(("read_scale", target.name))
        if self.scale_failure is not None:
            raise self.scale_failure
        return self.scale

    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None:
        self.calls.append(("set_scale", target.name, replicas))
        self.scale = replicas

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.calls.append(("annotate_pod", name, annotations))

    async def evict_pod(self, namespace: str, name: str) -> bool:
        self.calls.append(("evict_pod", name))
        return self.evictable

    async def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        self.calls.append(("patch_status", *sorted(fields)))
        status = self.body.setdefault("status", {})
        status.update(fields)
        for removed in [field for field, value in fields.items() if value is None]:  # a merge patch's null
            del status[removed]

    async def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.calls.append(("annotate", *sorted(annotations)))
        self.body["metadata"].setdefault("annotations", {}).update(annotations)

    def made(self, call: str) -> list[tuple[Any, ...]]:
        return [found for found in self.calls if found[0] == call]


class FakeMetrics:
    """The services' metrics (core's ServiceMetrics, as the registry makes them), and what a keeper reports."""

    def __init__(self) -> None:
        self.services: dict[tuple[str, str], ServiceMetrics] = {}
        self.status_passes: dict[tuple[str, str], float] = {}  # (namespace, resource) → its interval
        self.reconciles = {"success": 0, "failure": 0}

    def service(
        self, namespace: str, service: str, per_pod: bool | None = None, max_task_names: int | None = None
    ) -> ServiceMetrics:
        settings = series_settings(per_pod, max_task_names, DEFAULT_SETTINGS)
        found = self.services.get((namespace, service))
        if found is None:
            found = self.services[(namespace, service)] = ServiceMetrics(namespace, service, settings=settings)
        else:
            found.configure(settings)
        return found

    def find(self, namespace: str, service: str) -> ServiceMetrics | None:
        return self.services.get((namespace, service))

    def remove(self, namespace: str, service: str) -> None:
        self.services.pop((namespace, service), None)

    def status_refreshed(self, namespace: str, name: str, interval: float) -> None:
        self.status_passes[(namespace, name)] = interval

    def forget_status(self, namespace: str, name: str) -> None:
        self.status_passes.pop((namespace, name), None)

    def count_reconcile(self, succeeded: bool) -> None:
        self.reconciles["success" if succeeded else "failure"] += 1


@dataclasses.dataclass
class FakeContext:
    cluster: FakeCluster
    brokers: FakeBrokers
    options: OperatorOptions = dataclasses.field(default_factory=OperatorOptions)
    metrics: FakeMetrics = dataclasses.field(default_factory=FakeMetrics)


def resource(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": "billing", "namespace": "shop", "uid": "u1", "generation": 1, "annotations": {}},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "events": {"handlers": [{"name": "order"}]},
            "workers": {"scaleTargetRef": {"kind": "Deployment", "name": "billing-worker"}},
            **spec,
        },
    }


@dataclasses.dataclass
class Tally:
    done: int = 0
    unroutable: int = 0
    first: Archived | None = None
    last: Archived | None = None


class FakeReplayBroker:
    """Answers each observation with the next of `seen`; a move moves `moves` events; after a move the archive is
    `left` (None: it is observed again)."""

    def __init__(self, seen: list[ArchiveSeen], moves: list[int], firsts: list[Archived] | None = None) -> None:
        self.seen = seen
        self.moves = moves
        self.firsts = firsts or []
        self.tally = Tally()
        self.asked: list[str] = []
        self.left: ArchiveSeen | None = None

    async def observe(self, service: str, selection: Selection, keep: int = 0, *, count: bool = True) -> ArchiveSeen:
        seen = self.seen.pop(0)
        if not count:  # the archive's size only (and what is held of it)
            self.asked.append("size")
            return dataclasses.replace(seen, selected=None, sample=(), originals=seen.archived)
        self.asked.append("observe")
        return seen

    async def seen_after_move(self, service: str) -> ArchiveSeen | None:
        self.asked.append("seen_after_move")
        return self.left

    async def move(
        self, service: str, selection: Selection, *, purge: bool, limit: int | None, rate: float | None
    ) -> Tally:
        self.asked.append(f"move limit={limit}")
        self.tally = Tally(done=self.moves.pop(0), first=self.firsts.pop(0) if self.firsts else None)
        return self.tally

    def halt(self) -> None:
        self.asked.append("halt")

    def close(self) -> None:
        self.asked.append("close")


class FakeReplayApi:
    """The replay's API: the service as given, status patches recorded and shown in the replay's body at once."""

    def __init__(self, replay: dict[str, Any], service: dict[str, Any] | None) -> None:
        self.replay = replay
        self.service = service
        self.patches: list[dict[str, Any]] = []

    async def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        if self.service is None:
            raise NotFoundError(f"no CeleryEventService {name}")
        return self.service

    async def patch_replay_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None:
        self.patches.append(fields)
        self.replay.setdefault("status", {}).update(fields)


@dataclasses.dataclass
class FakeReplayContext:
    cluster: FakeReplayApi
    brokers: FakeBrokers
    broker: FakeReplayBroker  # every replay's

    def replay_broker(self, settings: BrokerSettings, queue_type: str) -> FakeReplayBroker:
        return self.broker


class RecordingLogger:
    """A logger's info and warning, kept as lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, message: str, *args: Any) -> None:
        self.lines.append(message % args)

    warning = info


def listing_of(topology: Topology, claimant: Claimant | None = None) -> dict[str, list[dict[str, Any]]]:
    """The management API's listings (queues, exchanges, bindings) of a vhost that holds exactly `topology`, and the
    claim of `claimant` when given: JSON as the broker answers it."""
    kept = {"durable": True, "auto_delete": False}
    exchanges = [
        {"name": e.name, "type": e.type, "internal": False, "arguments": {}, **kept} for e in topology.exchanges
    ]
    if claimant is not None:
        name = f"{topology.service}:owner"
        exchanges.append({"name": name, "type": "fanout", "internal": False, "arguments": claimant.arguments(), **kept})
    return {
        "queues": [
            {"name": q.name, "arguments": dict(q.arguments), "exclusive": False, "state": "running", **kept}
            for q in topology.queues
        ],
        "exchanges": exchanges,
        "bindings": [
            {"source": "", "destination": q.name, "destination_type": "queue", "routing_key": q.name, "arguments": {}}
            for q in topology.queues
        ]
        + [
            {
                "source": b.exchange,
                "destination": b.queue,
                "destination_type": "queue",
                "routing_key": b.routing_key,
                "arguments": {},
            }
            for b in topology.bindings
        ],
    }


# Each fake stands for its port: mypy fails here when a port changes and its fake does not.
_events: EventsFeed = FakeEvents()
_broker: ServiceBroker = FakeBroker()
_brokers: BrokerSource = FakeBrokers(FakeBroker())
_cluster: ClusterAccess = FakeCluster(resource())
_metrics: MetricsStore = FakeMetrics()
_context: KeeperContext = FakeContext(FakeCluster(resource()), FakeBrokers(FakeBroker()))
_replay_broker: ReplayBroker = FakeReplayBroker([], [])
_replay_api: ReplayApi = FakeReplayApi({}, None)
_replay_context: ReplayContext = FakeReplayContext(
    FakeReplayApi({}, None), FakeBrokers(FakeBroker()), FakeReplayBroker([], [])
)
