"""What one resource holds of its broker: the shared broker of its Secret's settings and its events consumer on it.

Taken on the first reconcile, switched when the Secret names another broker or vhost (the claim on the one left is
released: new credentials for the same one keep it), kept while only the Kubernetes API fails to answer (that is
not the Secret's fault), and let go when the settings become unusable, the spec cannot be acted on, the resource
goes or the operator stops.
"""

from __future__ import annotations

import logging
from typing import Any

from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import KubeUnavailableError, OperatorError
from celery_event_operator.core.monitoring.consumer import EventsSubscription
from celery_event_operator.core.naming import event_exchange_name, handler_queue_name, monitor_queue_name
from celery_event_operator.core.service.ownership import Claimant
from celery_event_operator.core.service.spec import Understood
from celery_event_operator.flow import steps
from celery_event_operator.flow.ports import KeeperContext, ServiceBroker


class BrokerHold:
    def __init__(
        self,
        context: KeeperContext,
        namespace: str,
        name: str,
        declared: steps.DeclareMemory,
        logger: logging.Logger | Any,
    ) -> None:
        self.context = context
        self.namespace = namespace
        self.name = name
        self._declared = declared  # forgotten on new settings: their rights may differ
        self._logger = logger
        self.broker: ServiceBroker | None = None
        self.subscription: EventsSubscription | None = None
        self.settings: BrokerSettings | None = None  # as last read from the Secret

    async def broker_for(
        self, understood: Understood, claimant: Claimant, *, owner: bool | None
    ) -> tuple[ServiceBroker | None, OperatorError | None, str | None]:
        """The broker of the service's current settings (switching when the Secret changed), or why none; and,
        when the Secret has not been readable for long, why the broker of the settings last read is kept. Moving
        to another broker or vhost releases the claim on the one left (new credentials for the same one keep it)."""
        brokers = self.context.brokers
        try:
            settings = await brokers.settings(self.namespace, understood.spec)
            self.settings = settings
            if self.broker is not None and self.broker.key == settings.key:
                return self.broker, None, None
            broker = brokers.acquire(settings)  # its TLS material is checked here
        except KubeUnavailableError as exc:
            # The API's fault, not the Secret's: the broker and the events consumer stay as they are.
            if self.broker is not None:
                return self.broker, None, str(exc)
            return None, exc, None
        except OperatorError as exc:
            await self.let_go()
            return None, exc, None
        self._declared.clean = None
        if self.broker is not None:
            self._logger.info("broker settings of %s changed: moving to %s", self.name, broker.display)
            if owner and broker.display != self.broker.display:
                await self._release_claim(self.broker, understood.service, claimant)
        await self.let_go()
        self.broker = broker
        return broker, None, None

    async def _release_claim(self, broker: ServiceBroker, service: str, claimant: Claimant) -> None:
        released = await steps.release(broker, service, claimant)
        if isinstance(released, OperatorError):
            self._logger.warning("the claim of %r on %s stays: %s", service, broker.display, released)

    def follow_events(self, understood: Understood, broker: ServiceBroker | None) -> None:
        """Consume the service's Celery events from its broker while monitoring is on."""
        service = understood.service
        if broker is None or not understood.spec.monitoring.enabled:
            if self.subscription is not None and self.broker is not None:
                self.broker.events.unsubscribe(self.subscription)
                self.subscription = None
                self.context.metrics.remove(self.namespace, service)
            return
        monitoring = understood.spec.monitoring
        metrics = self.context.metrics.service(
            self.namespace, service, monitoring.per_pod_task_series, monitoring.max_task_names
        )
        # queue_name of the handlers' task events (none of which says the queue it was consumed from)
        metrics.handler_queues = {h.name: handler_queue_name(service, h.name) for h in understood.spec.events.handlers}
        queue = monitor_queue_name(service)
        if self.subscription is not None and self.subscription.queue == queue:
            return
        if self.subscription is not None:
            broker.events.unsubscribe(self.subscription)
        self.subscription = broker.events.subscribe(
            f"{self.namespace}/{service}", queue, event_exchange_name(service), metrics
        )

    def stop_events(self, service: str) -> None:
        """No events consumer and no series for a service this resource does not own."""
        self._unsubscribe()
        self.context.metrics.remove(self.namespace, service)

    async def let_go(self) -> None:
        """The events consumer stopped and the broker released (closed when no other service uses it)."""
        self._unsubscribe()
        if self.broker is not None:
            broker, self.broker = self.broker, None
            await self.context.brokers.release(broker.key)

    def _unsubscribe(self) -> None:
        if self.subscription is not None and self.broker is not None:
            self.broker.events.unsubscribe(self.subscription)
        self.subscription = None
