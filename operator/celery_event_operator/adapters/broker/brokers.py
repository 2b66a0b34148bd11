"""The brokers the operator talks to: per broker login, one control connection, one events connection and
one queue listing, shared by every service that uses it (I/O; the flow's BrokerSource and ServiceBroker).

A service acquires the broker of its current settings and releases it when its settings change (a rotated
Secret) or it goes; a broker nobody uses any more is closed, so connections of replaced URLs do not linger.
Two AMQP connections per broker login whatever the number of services: control (a thread of its own) and
events (the event loop); while declares queue up (a fleet's first minute), control lends work to up to
CONTROL_LINES connections, each closed after a few idle seconds.

Queue depths come from the broker's one listing of the vhost (shared by every service on it; management API),
or, without a management API, from passive declares of the service's queues (ready messages only).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable

import amqp
from kombu.connection import Connection

from celery_event_operator.adapters.broker.control import ControlConnection
from celery_event_operator.adapters.broker.events_connection import EventsConnection
from celery_event_operator.adapters.broker.management import QueueListing
from celery_event_operator.adapters.broker.secrets import SecretReader
from celery_event_operator.adapters.broker.tls import TlsFiles
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import BrokerRefusedError, ManagementUnavailableError
from celery_event_operator.core.lifecycle.consumers import ByConnection, Consumer, Holding
from celery_event_operator.core.scaling.depths import READY_AND_UNACKNOWLEDGED, QueueDepth
from celery_event_operator.core.service.ownership import Claim, Claimant, Holder, holder_of
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.listed import ListedEntities
from celery_event_operator.core.topology.outcome import Report
from celery_event_operator.core.topology.plan import Topology

logger = logging.getLogger(__name__)

CONTROL_LINES = 4  # 200 first declares on RabbitMQ 4.3: 6.4 s on one connection, 3.4 s on four


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.key = settings.key
        material = settings.tls
        self._tls = TlsFiles.of(material)
        self.control = ControlConnection(settings.address, self._tls, lines=CONTROL_LINES)
        self.events = EventsConnection(settings.address, self._tls, logger)
        self.listing = QueueListing(settings.address, settings.management_url, self._tls)
        self.users = 0

    @property
    def display(self) -> str:
        return self.settings.address.display

    @property
    def version(self) -> str | None:
        return self.control.server_version

    async def declare(self, topology: Topology, previous: Declared, *, remove: bool = False) -> Report:
        """Apply the service's plan (or, with `remove`, delete its empty entities) on the control connection."""
        operation = apply.delete if remove else apply.apply
        try:
            return await self.control.run_async(lambda connection: operation(connection, topology, previous))
        except amqp.exceptions.AMQPError as exc:
            message = self.settings.address.redact(f"the broker refused an operation: {exc}")
            raise BrokerRefusedError(message) from None

    async def claim(self, service: str, claimant: Claimant) -> Claim:
        """Claim the service's topology for `claimant` (ownership.py); who holds it when it is not ours. A claim the
        same resource made under another installation id is taken over."""
        refusal = await self._claim_operation(apply.claim, service, claimant)
        if refusal is None:
            return Claim()
        holder = await self._holder(service, refusal)
        if holder.id is not None and holder.same_resource_as(claimant):
            take_over = functools.partial(apply.take_over, held=holder.id)
            refusal = await self._claim_operation(take_over, service, claimant)
            if refusal is None:
                logger.info("claim of %r taken over from installation %r", service, holder.installation)
                return Claim()
            holder = await self._holder(service, refusal)
        return Claim(holder)

    async def claim_at_deletion(self, service: str, claimant: Claimant) -> Claim:
        """As `claim`, telling too whether the claim is fresh (nobody held it before)."""
        arguments = claimant.arguments()
        try:
            existed, refusal = await self.control.run_async(
                lambda connection: apply.claim_existing(connection, service, arguments)
            )
        except amqp.exceptions.AMQPError as exc:
            message = self.settings.address.redact(f"the broker refused an operation: {exc}")
            raise BrokerRefusedError(message) from None
        if refusal is not None:
            return Claim(await self._holder(service, refusal))
        return Claim(fresh=not existed)

    async def release(self, service: str, claimant: Claimant) -> Claim:
        """Release the service's claim when it is `claimant`'s (deleted last, after its entities)."""
        refusal = await self._claim_operation(apply.release, service, claimant)
        return Claim() if refusal is None else Claim(await self._holder(service, refusal))

    async def _claim_operation(
        self, operation: Callable[[Connection, str, dict[str, str]], str | None], service: str, claimant: Claimant
    ) -> str | None:
        arguments = claimant.arguments()
        try:
            return await self.control.run_async(lambda connection: operation(connection, service, arguments))
        except amqp.exceptions.AMQPError as exc:
            message = self.settings.address.redact(f"the broker refused an operation: {exc}")
            raise BrokerRefusedError(message) from None

    async def _holder(self, service: str, refusal: str) -> Holder:
        """The claim's holder: read from the management API when there is one, else from the refusal."""
        try:
            arguments = await self.listing.exchange_arguments(naming.owner_exchange_name(service))
        except ManagementUnavailableError:
            arguments = None
        return holder_of(arguments, refusal)

    async def depths(self, topology: Topology, max_age: float) -> tuple[tuple[QueueDepth, ...], str]:
        """The service's queue depths and how they were counted; BrokerUnavailableError when unknown."""
        roles = {queue.name: queue.role for queue in topology.queues if queue.role != "monitor"}
        try:
            listed = await self.listing.queues(max_age)
        except ManagementUnavailableError as exc:
            states = await self.control.run_async(lambda connection: apply.inspect(connection, topology))
            found = tuple(
                QueueDepth(state.name, roles[state.name], state.messages or 0, state.consumers or 0)
                for state in states
                if state.kind == "queue" and state.present and state.name in roles
            )
            return found, f"ready only ({exc})"
        found = tuple(
            QueueDepth(name, role, counts.ready + counts.unacknowledged, counts.consumers or 0)
            for name, role in roles.items()
            if (counts := listed.get(name)) is not None
        )
        unlisted = [depth.queue for depth in found if depth.role == "events" and listed[depth.queue].consumers is None]
        if unlisted:
            # The broker's statistics are off: the handler queues' consumers (the status counts those) are asked of
            # each queue, a passive declare each.
            counted = await self.control.run_async(lambda connection: apply.consumers(connection, unlisted))
            found = tuple(dataclasses.replace(depth, consumers=counted.get(depth.queue, 0)) for depth in found)
            return found, f"{READY_AND_UNACKNOWLEDGED} (the broker's statistics are off: consumers by passive declares)"
        return found, READY_AND_UNACKNOWLEDGED

    def listed(self, max_age: float) -> ListedEntities | None:
        return self.listing.entities(max_age)

    async def consumers(self, max_age: float) -> ByConnection[Consumer]:
        return await self.listing.consumers(max_age)

    async def alarms(self, max_age: float) -> tuple[Alarm, ...]:
        return await self.listing.alarms(max_age)

    async def holdings(self, max_age: float) -> ByConnection[Holding]:
        return await self.listing.holdings(max_age)

    async def close(self) -> None:
        await self.events.close()
        await self.listing.close()
        self.control.close()
        if self._tls is not None:
            self._tls.remove()


class Brokers:
    """The broker of each service's Secret, shared by the services whose Secrets name the same one."""

    def __init__(self, secrets: SecretReader) -> None:
        self._secrets = secrets
        self._brokers: dict[str, Broker] = {}

    async def settings(self, namespace: str, spec: CeleryEventServiceSpec) -> BrokerSettings:
        return await self._secrets.settings(namespace, spec)

    def forget_secret(self, namespace: str, name: str) -> None:
        self._secrets.forget(namespace, name)

    def acquire(self, settings: BrokerSettings) -> Broker:
        broker = self._brokers.get(settings.key)
        if broker is None:
            broker = self._brokers[settings.key] = Broker(settings)
        broker.users += 1
        return broker

    async def release(self, key: str) -> None:
        """One user fewer of the broker of the settings `key`; closed when it has none."""
        broker = self._brokers.get(key)
        if broker is None:
            return
        broker.users -= 1
        if broker.users <= 0:
            del self._brokers[broker.key]
            logger.info(
                "no service uses the broker at %s as this user any more: closing its connections", broker.display
            )
            await broker.close()

    def __len__(self) -> int:
        return len(self._brokers)

    async def close_all(self) -> None:
        brokers, self._brokers = list(self._brokers.values()), {}
        for broker in brokers:
            await broker.close()
