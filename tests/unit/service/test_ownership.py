"""One owner per (broker, vhost, serviceName) (pure): the claim's id, who holds it as the broker tells, and the
status and Events a resource that does not own its service concludes — tables of passes."""

from __future__ import annotations

import dataclasses

import pytest

from celery_event_operator.core.errors import BrokerUnavailableError
from celery_event_operator.core.service.conclusion import conclude_deletion, patch_of
from celery_event_operator.core.service.observations import Observations, OwnershipSeen, QueuesSeen
from celery_event_operator.core.service.ownership import ID_MAX_BYTES, Claim, Claimant, Holder, holder_of
from celery_event_operator.core.topology import outcome
from celery_event_operator.core.topology.outcome import DeclareOutcome
from tests.unit.service.test_conclusion import DEPTHS, SPEC, TOPOLOGY, conditions, events, reconciled, run

OURS = Claimant("install-a", "shop2", "billing", "uid-2")
OWNER = Holder("install-a/shop/billing/uid-1", "shop", "billing", "install-a")
OTHER_INSTALLATION = Holder("install-b/shop/billing/uid-9", "shop", "billing", "install-b")


def refused(holder: Holder = OWNER) -> Observations:
    return Observations(3, SPEC, ownership=OwnershipSeen("billing", OURS, Claim(holder), "h:5672 vhost '/'"))


def owned(**seen: object) -> Observations:
    ownership = OwnershipSeen("billing", OURS, Claim(), "h:5672 vhost '/'")
    return reconciled(ownership=ownership, **seen)  # type: ignore[arg-type]


def test_the_claim_id_names_the_resource_and_fits_an_exchange_name() -> None:
    assert OURS.id == "install-a/shop2/billing/uid-2"
    assert OURS.arguments()["alternate-exchange"] == OURS.id
    long = Claimant("i" * 100, "n" * 63, "x" * 253, "0" * 36)
    assert len(long.id.encode()) <= ID_MAX_BYTES
    assert long.id != Claimant("i" * 100, "n" * 63, "x" * 252 + "y", "0" * 36).id  # shortened, still distinct


@pytest.mark.parametrize(
    ("arguments", "refusal", "described"),
    [
        # the management API's arguments of the claim exchange
        (OURS.arguments() | {"alternate-exchange": "x"}, "", "shop2/billing"),
        (Claimant("install-b", "shop", "billing", "u").arguments(), "",
         "shop/billing of operator installation 'install-b'"),
        # no management API: the broker's refusal names the value it holds
        (None, "inequivalent arg 'alternate-exchange' for exchange 'billing:owner' in vhost 'v': received "
         "'install-a/shop2/billing/uid-2' but current is 'install-a/shop/billing/uid-1'", "shop/billing"),
        (None, "... received none but current is the value 'org/team/shop/billing/u' of type 'longstr'",
         "shop/billing of operator installation 'org/team'"),
        (None, "... but current is 'abc~0123'", "'abc~0123'"),
        (None, "... but current is 'install-a/shop/billing/uid-1", "another resource"),  # cut off: not guessed
    ],
)  # fmt: skip
def test_the_holder_is_named_from_what_the_broker_tells(
    arguments: dict[str, str] | None, refusal: str, described: str
) -> None:
    assert holder_of(arguments, refusal).describe(OURS) == described


def test_a_refused_claim_is_ready_false_naming_the_owner_with_one_event() -> None:
    first, again, again2 = run(refused(), refused(), refused())
    assert conditions(first) == {"Ready": ("False", "ServiceNameConflict"), "BrokerReachable": ("True", "Connected")}
    ready = next(c for c in first.status.conditions if c.type == "Ready")
    assert "belongs to shop/billing" in ready.message
    assert events(first) == [("Warning", "ServiceNameConflict")]
    assert events(again) == events(again2) == []  # every resync: no Event, no change
    assert again.status == first.status


def test_a_resource_that_was_ready_before_the_upgrade_shows_nothing_it_does_not_keep() -> None:
    ready = run(owned(queues=QueuesSeen(DEPTHS, "ready + unacknowledged")))[0]
    assert ready.status.queue_length == 7
    conflict = run(refused(), status=ready.status)[0]
    assert set(conditions(conflict)) == {"Ready", "BrokerReachable"}
    assert conflict.status.queue_length is None
    assert conflict.status.archived is None
    patch = conflict.patch
    assert patch["queueLength"] is None
    assert patch["consumers"] is None
    assert "queueLength" not in patch_of(conflict.status)


def test_another_owner_is_announced_and_a_takeover_recovers_with_one_event() -> None:
    _first, moved, taken = run(refused(), refused(OTHER_INSTALLATION), owned())
    assert events(moved) == [("Warning", "ServiceNameConflict")]  # the message changed: the owner is another
    assert conditions(taken)["Ready"] == ("True", "Reconciled")
    assert events(taken) == [("Normal", "ServiceNameClaimed")]
    assert taken.cleared == frozenset()


def test_the_conflict_does_not_touch_the_conclusions_of_an_owner() -> None:
    plain, with_claim = run(reconciled())[0], run(owned())[0]
    assert plain.status == with_claim.status
    assert plain.events == with_claim.events


RETAIN_FAILED = DeclareOutcome(TOPOLOGY, "h", BrokerUnavailableError("down"))


@pytest.mark.parametrize(
    ("deleted", "holder", "removing", "expected"),
    [
        (DeclareOutcome(TOPOLOGY, "h"), OWNER, True, [("Warning", "ServiceNameConflict", "nothing removed: "
         "serviceName 'billing' belongs to shop/billing")]),
        (DeclareOutcome(TOPOLOGY, "h"), OWNER, False, [("Warning", "ServiceNameConflict", "nothing removed: "
         "serviceName 'billing' belongs to shop/billing")]),
        (DeclareOutcome(TOPOLOGY, "h"), None, False, []),  # retain: the claim released quietly
        (DeclareOutcome(TOPOLOGY, "h", report=outcome.Report()), None, True, []),
        (RETAIN_FAILED, None, False, [("Warning", "BrokerUnreachable",
         "the claim on serviceName 'billing' was not released: down")]),
        (dataclasses.replace(RETAIN_FAILED, report=outcome.Report()), None, True, [("Warning", "BrokerUnreachable",
         "the claim on serviceName 'billing' was not released: down")]),
        (RETAIN_FAILED, None, True, [("Warning", "BrokerUnreachable", "the service's queues were not removed: down")]),
    ],
)  # fmt: skip
def test_deletion_events_of_a_resource_that_owns_or_does_not_own_its_service(
    deleted: DeclareOutcome, holder: Holder | None, removing: bool, expected: list[tuple[str, str, str]]
) -> None:
    notes = conclude_deletion(deleted, OURS, holder, removing=removing)
    assert [(note.type, note.reason, note.message) for note in notes] == expected


@pytest.mark.parametrize(
    ("holder", "ours"),
    [
        (holder_of(Claimant("old-id", "shop2", "billing", "uid-2").arguments(), ""), True),  # renamed installation
        (holder_of(None, "... but current is 'old-id/shop2/billing/uid-2'"), True),
        (OWNER, False),
        (holder_of(None, "... but current is 'abc~0123'"), False),  # shortened: its uid cannot be read
        (Holder(None), False),
    ],
)
def test_a_claim_of_the_same_resource_under_another_installation_id_is_its_own(holder: Holder, ours: bool) -> None:
    assert holder.same_resource_as(OURS) is ours
