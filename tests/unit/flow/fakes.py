"""Fakes of the flow's ports (flow/ports.py): a broker and a Kubernetes API that record what a keeper asks of them
and answer as told; the status written goes into the body, as the API server and the watch would bring it back."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from celery_event_operator.adapters.broker.events_connection import Subscription
from celery_event_operator.adapters.monitoring.collector import MetricsRegistry
from celery_event_operator.core.api.models import CeleryEventServiceSpec, ScaleTargetRef
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.broker.settings import BrokerSettings, TlsMaterial
from celery_event_operator.core.errors import KubeError, OperatorError
from celery_event_operator.core.injection.outcome import WorkersOutcome, count_pods
from celery_event_operator.core.lifecycle.consumers import ByConnection, Consumer, Holding
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service.ownership import Claim, Claimant, Holder
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import ListedEntities
from celery_event_operator.core.topology.outcome import Report
from celery_event_operator.core.topology.plan import Topology

ADDRESS = broker_address.parse("amqp://user:secret@broker.example:5672/shop")
SETTINGS = BrokerSettings(ADDRESS, TlsMaterial(), ADDRESS.management_url())


class FakeEvents:
    def __init__(self) -> None:
        self.problem: str | None = None
        self.login_refused = False
        self.connected = True
        self.subscriptions: list[Subscription] = []

    def subscribe(self, name: str, queue: str, exchange: str, metrics: ServiceMetrics) -> Subscription:
        subscription = Subscription(name, queue, exchange, metrics, f"tag-{len(self.subscriptions)}".encode())
        self.subscriptions.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
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


@dataclasses.dataclass
class FakeContext:
    cluster: FakeCluster
    brokers: FakeBrokers
    options: OperatorOptions = dataclasses.field(default_factory=OperatorOptions)
    metrics: MetricsRegistry = dataclasses.field(default_factory=MetricsRegistry)


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
