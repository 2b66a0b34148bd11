"""One service's topology against its broker: credentials from the Secret, the shared connection,
the applier (I/O). Whatever fails is turned into an outcome the status can show, never an exception
that would make kopf retry in a tight loop."""

from __future__ import annotations

import dataclasses
from typing import Literal

import amqp

from celery_event_operator.api.models import CeleryEventServiceSpec
from celery_event_operator.broker import urls
from celery_event_operator.broker.connections import BrokerRegistry, BrokerUnavailableError
from celery_event_operator.kubeapi import KubeApi, SecretError
from celery_event_operator.topology import apply, plan

# BrokerSecretInvalid and BrokerUnreachable: no connection. BrokerRefused: connected, but the broker
# refused an operation (e.g. the user lacks the permission to declare in the vhost).
FailureReason = Literal["BrokerSecretInvalid", "BrokerUnreachable", "BrokerRefused"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    topology: plan.Topology
    broker: str | None = None  # host:port and vhost, for messages
    failure: FailureReason | None = None
    failure_message: str = ""
    report: apply.Report | None = None


def broker_address(kube: KubeApi, namespace: str, spec: CeleryEventServiceSpec) -> urls.BrokerAddress:
    """The service's broker, from the Secret it names; SecretError (naming no credentials) otherwise."""
    ref = spec.broker.secret_ref
    raw = kube.read_secret_key(namespace, ref.name, ref.key)
    try:
        return urls.parse(raw, failover_strategy=spec.broker.failover_strategy, vhost_override=spec.broker.vhost)
    except urls.BrokerUrlError as exc:
        raise SecretError(f"Secret {namespace}/{ref.name} key {ref.key!r}: {exc}") from None


def sync(kube: KubeApi, brokers: BrokerRegistry, *, namespace: str, service: str, spec: CeleryEventServiceSpec,
         previous: frozenset[str], remove: bool = False) -> Outcome:
    """Apply the service's plan (or, with `remove`, delete its empty entities)."""
    topology = plan.plan(service, spec)
    try:
        address = broker_address(kube, namespace, spec)
    except SecretError as exc:
        return Outcome(topology, failure="BrokerSecretInvalid", failure_message=str(exc))
    operation = apply.delete if remove else apply.apply
    try:
        report = brokers.get(address).run(lambda connection: operation(connection, topology, previous))
    except BrokerUnavailableError as exc:
        return Outcome(topology, address.display, "BrokerUnreachable", str(exc))
    except amqp.exceptions.AMQPError as exc:
        return Outcome(topology, address.display, "BrokerRefused",
                       urls.redact(f"the broker refused an operation: {exc}", address))
    return Outcome(topology, address.display, report=report)
