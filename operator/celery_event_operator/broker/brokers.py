"""The brokers the operator talks to: per broker login, one control connection, one events connection and
one queue listing, shared by every service that uses it (I/O).

A service acquires the broker of its current settings and releases it when its settings change (a rotated
Secret) or it goes; a broker nobody uses any more is closed, so connections of replaced URLs do not linger.
Two AMQP connections per broker login whatever the number of services: control (a thread of its own) and
events (the event loop).
"""

from __future__ import annotations

import logging

from celery_event_operator.broker.control import ControlConnection
from celery_event_operator.broker.management import QueueListing
from celery_event_operator.broker.secret import BrokerSettings
from celery_event_operator.broker.tls import TlsFiles
from celery_event_operator.monitoring.events_connection import EventsConnection

logger = logging.getLogger(__name__)


class Broker:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.key = settings.key
        material = settings.tls
        self._tls = TlsFiles(material) if material.ca or material.cert else None
        self.control = ControlConnection(settings.address, self._tls)
        self.events = EventsConnection(settings.address, self._tls, logger)
        self.listing = QueueListing(settings.address, settings.management_url, self._tls)
        self.users = 0

    @property
    def display(self) -> str:
        return self.settings.address.display

    async def close(self) -> None:
        await self.events.close()
        await self.listing.close()
        self.control.close()
        if self._tls is not None:
            self._tls.remove()


class Brokers:
    def __init__(self) -> None:
        self._brokers: dict[str, Broker] = {}

    def acquire(self, settings: BrokerSettings) -> Broker:
        broker = self._brokers.get(settings.key)
        if broker is None:
            broker = self._brokers[settings.key] = Broker(settings)
        broker.users += 1
        return broker

    async def release(self, broker: Broker) -> None:
        broker.users -= 1
        if broker.users <= 0 and self._brokers.get(broker.key) is broker:
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
