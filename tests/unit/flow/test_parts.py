"""The keeper's parts on their own (flow/hold.py, flow/workers.py, flow/deletion.py), on the fakes of the ports;
test_keeper.py runs them together through the keeper's passes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.settings import BrokerSettings, TlsMaterial
from celery_event_operator.core.errors import BrokerSecretError, KubeUnavailableError
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.ownership import Claimant
from celery_event_operator.core.topology.declared import Declared
from celery_event_operator.flow import deletion, steps
from celery_event_operator.flow.hold import BrokerHold
from celery_event_operator.flow.workers import WORKERS_CHECK_SECONDS, Workers
from tests.unit.flow.fakes import SETTINGS, FakeBroker, FakeBrokers, FakeCluster, FakeContext, RecordingLogger, resource

CLAIMANT = Claimant("default", "shop", "billing", "u1")


def settings_of(url: str) -> BrokerSettings:
    address = broker_address.parse(url)
    return BrokerSettings(address, TlsMaterial(), address.management_url())


class SwitchingBrokers(FakeBrokers):
    """The Secret's settings as `current` says; a broker per settings, made when first acquired."""

    def __init__(self) -> None:
        super().__init__(FakeBroker())
        self.current = SETTINGS
        self.made: dict[str, FakeBroker] = {}

    async def settings(self, namespace: str, spec: Any) -> BrokerSettings:
        if self.secret_failure is not None:
            raise self.secret_failure
        return self.current

    def acquire(self, settings: BrokerSettings) -> FakeBroker:
        self.users += 1
        return self.made.setdefault(settings.key, FakeBroker(settings))

    async def release(self, key: str) -> None:
        self.users -= 1


def hold_on(brokers: FakeBrokers) -> BrokerHold:
    context = FakeContext(FakeCluster(resource()), brokers)
    return BrokerHold(context, "shop", "billing", steps.DeclareMemory(), RecordingLogger())


def understood(**spec: Any) -> specs.Understood:
    found = specs.understand(resource(**spec))
    assert isinstance(found, specs.Understood)
    return found


async def test_the_hold_releases_the_claim_on_a_broker_it_leaves_but_not_for_new_credentials() -> None:
    brokers = SwitchingBrokers()
    hold = BrokerHold(
        FakeContext(FakeCluster(resource()), brokers), "shop", "billing", steps.DeclareMemory(), RecordingLogger()
    )
    first, _, _ = await hold.broker_for(understood(), CLAIMANT, owner=True)
    assert isinstance(first, FakeBroker)
    first.claims["billing"] = CLAIMANT
    brokers.current = settings_of("amqp://user:rotated@broker.example:5672/shop")  # the same vhost, new password
    renewed, _, _ = await hold.broker_for(understood(), CLAIMANT, owner=True)
    assert renewed is not first
    assert first.claims == {"billing": CLAIMANT}, "the same broker and vhost: claim kept"
    assert isinstance(renewed, FakeBroker)
    renewed.claims["billing"] = CLAIMANT
    brokers.current = settings_of("amqp://user:rotated@broker.example:5672/other")
    moved, _, _ = await hold.broker_for(understood(), CLAIMANT, owner=True)
    assert moved is not renewed
    assert renewed.claims == {}, "the vhost left: its claim released"
    assert brokers.users == 1, "each broker left was let go"


async def test_the_hold_keeps_its_broker_while_the_api_does_not_answer_and_lets_go_when_the_secret_is_bad() -> None:
    brokers = SwitchingBrokers()
    hold = BrokerHold(
        FakeContext(FakeCluster(resource()), brokers), "shop", "billing", steps.DeclareMemory(), RecordingLogger()
    )
    broker, _, _ = await hold.broker_for(understood(), CLAIMANT, owner=True)
    brokers.secret_failure = KubeUnavailableError("cannot read Secret shop/rabbitmq: does not answer")
    kept, unusable, why = await hold.broker_for(understood(), CLAIMANT, owner=True)
    assert (kept, unusable, why) == (broker, None, "cannot read Secret shop/rabbitmq: does not answer")
    brokers.secret_failure = BrokerSecretError("Secret shop/rabbitmq does not exist")
    gone, unusable, _ = await hold.broker_for(understood(), CLAIMANT, owner=True)
    assert gone is None
    assert isinstance(unusable, BrokerSecretError)
    assert brokers.users == 0, "let go"
    assert hold.settings == SETTINGS, "the settings last read are remembered (a deletion uses them)"


async def test_a_deletion_whose_secret_went_first_removes_through_the_broker_last_used() -> None:
    brokers = SwitchingBrokers()
    brokers.secret_failure = BrokerSecretError("Secret shop/rabbitmq does not exist")
    found, posted = understood(), []
    outcome, holder = await deletion.remove(
        brokers, "shop", found, Declared(), CLAIMANT, remove_entities=True, last_settings=SETTINGS, post=posted.extend
    )
    broker = brokers.made[SETTINGS.key]
    assert (outcome.failure, holder) == (None, None)
    assert [note.reason for note in posted] == ["ServiceNameUnclaimed"], "never claimed: nothing removed"
    assert broker.declares == []
    assert broker.claims == {}
    assert brokers.users == 0
    outcome, _ = await deletion.remove(
        brokers, "shop", found, Declared(), CLAIMANT, remove_entities=True, last_settings=None, post=posted.extend
    )
    assert isinstance(outcome.failure, BrokerSecretError), "no broker known: the Secret's failure, tried again"


async def test_a_deletion_of_a_service_another_resource_owns_touches_nothing() -> None:
    brokers = SwitchingBrokers()
    broker = brokers.acquire(SETTINGS)
    brokers.users = 0
    other = Claimant("default", "shop2", "billing", "u2")
    broker.claims["billing"] = other
    posted: list[Any] = []
    _, holder = await deletion.remove(
        brokers,
        "shop",
        understood(),
        Declared(),
        CLAIMANT,
        remove_entities=True,
        last_settings=None,
        post=posted.extend,
    )
    assert holder is not None
    assert (holder.namespace, holder.name) == ("shop2", "billing")
    assert broker.declares == []
    assert broker.claims == {"billing": other}
    assert posted == [], "the keeper says whose it is (conclude_deletion)"


async def test_the_workers_settings_are_checked_once_per_generation_and_again_after_a_failure() -> None:
    cluster = FakeCluster(resource())
    workers = Workers(FakeContext(cluster, FakeBrokers(FakeBroker())), "shop", RecordingLogger())
    body, found = resource(), understood()
    await workers.outcome(body, 1, found, lambda _: [])
    await workers.outcome(body, 1, found, lambda _: [])
    assert len(cluster.made("sync_workers")) == 1, "the same generation within WORKERS_CHECK_SECONDS: not again"
    await workers.outcome(body, 2, found, lambda _: [])
    assert len(cluster.made("sync_workers")) == 2, "a new generation: checked at once"
    assert workers.config_hash == "h1"
    assert workers.checked is not None
    workers.checked = (2, time.monotonic() - WORKERS_CHECK_SECONDS, workers.checked[2])
    await workers.outcome(body, 2, found, lambda _: [])
    assert len(cluster.made("sync_workers")) == 3, "and at least every WORKERS_CHECK_SECONDS"
    cluster.workers_unavailable = "cannot read ConfigMap shop/billing-celery-events: HTTP 500"
    await workers.outcome(body, 3, found, lambda _: [])
    assert workers.checked is None, "the previous generation's hash must not judge this one's pods"


async def test_without_the_webhook_the_workers_are_said_to_mount_the_settings_themselves_and_are_not_healed() -> None:
    found = understood(workers={"scaleTargetRef": {"kind": "Deployment", "name": "w"}, "healAfterSeconds": 5})
    for webhook, mounted_from, heal_after in [(True, None, 5), (False, "billing-celery-events", None)]:
        context = FakeContext(FakeCluster(resource()), FakeBrokers(FakeBroker()))
        if not webhook:
            context.options = dataclasses.replace(context.options, webhook=None)  # --webhook-port 0
        workers = Workers(context, "shop", RecordingLogger())
        for _ in range(2):  # checked, then counted from what was checked
            outcome = await workers.outcome(resource(), 1, found, lambda _: [])
            assert (outcome.mounted_from, outcome.heal_after_seconds) == (mounted_from, heal_after)
