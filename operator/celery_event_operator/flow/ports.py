"""What one pass of a service needs of the broker and of the Kubernetes API: small interfaces the flow is given
(as messaging-topology-operator injects its RabbitMQ client factory), so that the sequencing is tested with
fakes and the decisions, pure, are tested as tables. The adapters implement them: `adapters/broker/brokers.py`
(Brokers, Broker) and `adapters/cluster.py` (Cluster)."""

from __future__ import annotations

from typing import Any, Protocol

from celery_event_operator.core.api.models import CeleryEventServiceSpec, ScaleTargetRef
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.injection.outcome import WorkersOutcome
from celery_event_operator.core.lifecycle.consumers import ByConnection, Consumer, Holding
from celery_event_operator.core.monitoring.consumer import EventsSubscription
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.options import OperatorOptions
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service.ownership import Claim, Claimant
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import ListedEntities
from celery_event_operator.core.topology.outcome import Report
from celery_event_operator.core.topology.plan import Topology


class EventsFeed(Protocol):
    """A broker's one events connection, shared by the services on it."""

    @property
    def problem(self) -> str | None: ...  # the connection's own (None while connected)

    @property
    def login_refused(self) -> bool: ...

    @property
    def connected(self) -> bool: ...  # an AMQP connection to the broker is open now

    def subscribe(self, name: str, queue: str, exchange: str, metrics: ServiceMetrics) -> EventsSubscription: ...

    def unsubscribe(self, subscription: EventsSubscription) -> None: ...


class ServiceBroker(Protocol):
    """One broker as one user, shared by the services whose Secrets name it."""

    @property
    def key(self) -> str: ...  # identifies the settings without showing them

    @property
    def display(self) -> str: ...  # host:port and vhost, for messages

    @property
    def version(self) -> str | None: ...  # the broker's, as it said when last connected

    @property
    def events(self) -> EventsFeed: ...

    async def declare(self, topology: Topology, previous: Declared, *, remove: bool = False) -> Report:
        """Apply the plan (with `remove`, delete the service's empty entities); an OperatorError carrying its
        status reason when the broker cannot be reached, refuses or does not support an operation."""
        ...

    async def claim(self, service: str, claimant: Claimant) -> Claim:
        """Claim the service's topology (core/service/ownership.py): ours, or who holds it; an OperatorError when
        the broker cannot be reached or refuses otherwise."""
        ...

    async def claim_at_deletion(self, service: str, claimant: Claimant) -> Claim:
        """As `claim`, telling too whether the claim is fresh: nobody held it before (a resource being deleted that
        never claimed its service owns none of it)."""
        ...

    async def release(self, service: str, claimant: Claimant) -> Claim:
        """Release the service's claim when it is ours (ours: released; else who holds it)."""
        ...

    def listed(self, max_age: float) -> ListedEntities | None:
        """The vhost's queues, exchanges and bindings when listed no longer than `max_age` seconds ago (never
        waited for); None when there is no such listing (one is made meanwhile) or no management API."""
        ...

    async def depths(self, topology: Topology, max_age: float) -> tuple[tuple[QueueDepth, ...], str]:
        """The service's queue depths and how they were counted; BrokerUnavailableError when unknown."""
        ...

    async def consumers(self, max_age: float) -> ByConnection[Consumer]:
        """The vhost's consumers and their connections; ManagementUnavailableError without a management API."""
        ...

    async def alarms(self, max_age: float) -> tuple[Alarm, ...]:
        """The broker's resource alarms in effect; ManagementUnavailableError without a management API."""
        ...

    async def holdings(self, max_age: float) -> ByConnection[Holding]:
        """The vhost's channels and the deliveries each holds; ManagementUnavailableError without a management API."""
        ...


class BrokerSource(Protocol):
    """The brokers of the services' Secrets."""

    async def settings(self, namespace: str, spec: CeleryEventServiceSpec) -> BrokerSettings:
        """A service's broker settings from its Secret; an OperatorError (with its reason) when unusable."""
        ...

    def acquire(self, settings: BrokerSettings) -> ServiceBroker:
        """The broker of these settings, shared; BrokerSecretError when its TLS material is unusable."""
        ...

    async def release(self, key: str) -> None: ...  # one user fewer of the broker of `key`

    def forget_secret(self, namespace: str, name: str) -> None:
        """Read the Secret again next time (a login was refused: it may have been rotated)."""
        ...


class ClusterAccess(Protocol):
    """The Kubernetes API calls of a pass (KubeError with a safe message when one fails)."""

    async def sync_workers(
        self, *, owner: dict[str, Any], service: str, spec: CeleryEventServiceSpec, pod_hashes: list[str | None]
    ) -> WorkersOutcome: ...

    async def read_scale(self, namespace: str, target: ScaleTargetRef) -> int | None: ...  # None: no such workload

    async def set_scale(self, namespace: str, target: ScaleTargetRef, replicas: int) -> None: ...

    async def evict_pod(self, namespace: str, name: str) -> bool: ...  # False: a PodDisruptionBudget refuses now

    async def patch_status(self, namespace: str, name: str, fields: dict[str, Any]) -> None: ...

    async def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...

    async def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None: ...


class MetricsStore(Protocol):
    """The metrics of every monitored service, and the operator's own counters (adapters/monitoring/collector.py)."""

    def service(
        self, namespace: str, service: str, per_pod: bool | None = None, max_task_names: int | None = None
    ) -> ServiceMetrics: ...  # made when new, with the spec's settings (None: the operator's defaults)

    def find(self, namespace: str, service: str) -> ServiceMetrics | None: ...

    def remove(self, namespace: str, service: str) -> None: ...  # the service's series go

    def status_refreshed(self, namespace: str, name: str, interval: float) -> None: ...

    def forget_status(self, namespace: str, name: str) -> None: ...

    def count_reconcile(self, succeeded: bool) -> None: ...


class KeeperContext(Protocol):
    """What every service's keeper is given (flow.context.Context in the operator; fakes in tests)."""

    @property
    def options(self) -> OperatorOptions: ...

    @property
    def cluster(self) -> ClusterAccess: ...

    @property
    def brokers(self) -> BrokerSource: ...

    @property
    def metrics(self) -> MetricsStore: ...
