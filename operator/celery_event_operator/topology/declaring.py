"""One service's topology on its broker: the applier run on the broker's control connection (I/O).

Whatever fails is turned into an outcome the status can show, never an exception that would make kopf
retry in a tight loop.
"""

from __future__ import annotations

import amqp

from celery_event_operator.broker.brokers import Broker
from celery_event_operator.errors import BrokerUnavailableError, UnsupportedOperationError
from celery_event_operator.topology import apply, plan
from celery_event_operator.topology.declared import Declared
from celery_event_operator.topology.outcome import Outcome


async def declare(broker: Broker, topology: plan.Topology, previous: Declared, *, remove: bool = False) -> Outcome:
    """Apply the service's plan (or, with `remove`, delete its empty entities) on its broker."""
    address = broker.settings.address
    operation = apply.delete if remove else apply.apply
    try:
        report = await broker.control.run_async(lambda connection: operation(connection, topology, previous))
    except BrokerUnavailableError as exc:
        return Outcome(topology, address.display, "BrokerUnreachable", str(exc))
    except UnsupportedOperationError as exc:
        return Outcome(topology, address.display, "UnsupportedOperation", str(exc))
    except amqp.exceptions.AMQPError as exc:
        return Outcome(
            topology, address.display, "BrokerRefused", address.redact(f"the broker refused an operation: {exc}")
        )
    return Outcome(topology, address.display, report=report)
