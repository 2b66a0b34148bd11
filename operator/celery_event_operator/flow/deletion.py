"""A resource's deletion on its broker: its claim confirmed ours before anything is touched, with
`deletionPolicy: delete` its empty queues and exchanges removed, and its claim released last."""

from __future__ import annotations

import dataclasses

from celery_event_operator.core.broker.settings import BrokerSettings
from celery_event_operator.core.errors import OperatorError
from celery_event_operator.core.service.conclusion import PostEvents, conclude_unclaimed_deletion
from celery_event_operator.core.service.ownership import Claimant, Holder
from celery_event_operator.core.service.spec import Understood
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.core.topology.outcome import DeclareOutcome, Report
from celery_event_operator.flow import steps
from celery_event_operator.flow.ports import BrokerSource


async def remove(
    brokers: BrokerSource,
    namespace: str,
    understood: Understood,
    declared: Declared,
    claimant: Claimant,
    *,
    remove_entities: bool,
    last_settings: BrokerSettings | None,
    post: PostEvents,
) -> tuple[DeclareOutcome, Holder | None]:
    """What the deletion did on the broker (its failure, what was removed and kept), and who holds the service
    when it is not this resource's (then nothing is touched)."""
    try:
        try:
            settings = await brokers.settings(namespace, understood.spec)
        except OperatorError:
            if last_settings is None:
                raise
            # The Secret went first (its namespace is being deleted): the broker last used is the one it owns.
            settings = last_settings
        broker = brokers.acquire(settings)
    except OperatorError as exc:
        return DeclareOutcome(understood.topology, failure=exc), None
    try:
        # Confirmed ours before anything is removed: another's entities are never touched, nor those of a name
        # nobody claimed (a resource of the version before claims, its sibling not reconciled yet).
        claimed = await steps.claim_at_deletion(broker, understood.service, claimant)
        if isinstance(claimed, OperatorError):
            return DeclareOutcome(understood.topology, broker.display, claimed), None
        if not claimed.ours:
            return DeclareOutcome(understood.topology, broker.display), claimed.holder
        outcome = DeclareOutcome(understood.topology, broker.display)
        if remove_entities and claimed.fresh:
            post(conclude_unclaimed_deletion(understood.service))
            outcome = DeclareOutcome(understood.topology, broker.display, report=Report())  # nothing removed
        elif remove_entities:
            outcome = await steps.declare(broker, None, understood.topology, declared, remove=True)
        if outcome.failure is None:  # released last: until then no other resource declares anything of it
            released = await steps.release(broker, understood.service, claimant)
            if isinstance(released, OperatorError):
                return dataclasses.replace(outcome, failure=released), None
        return outcome, None
    finally:
        await brokers.release(broker.key)
