"""The keeper sequences a service's passes: observe through the ports, conclude, write only what changed.
Fakes stand in for the broker and the Kubernetes API (tests/unit/flow/fakes.py); the integration suites run the
same passes against a real RabbitMQ and the real operator process."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from celery_event_operator.core.api.metadata import ACCEPTED_IMMUTABLE_ANNOTATION, DECLARED_ANNOTATION
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.broker.alarms import Alarm
from celery_event_operator.core.errors import (
    BrokerRefusedError,
    BrokerSecretError,
    BrokerUnavailableError,
    KubeUnavailableError,
    ManagementUnavailableError,
)
from celery_event_operator.core.options import DEFAULT_INSTALLATION_ID
from celery_event_operator.core.scaling.depths import QueueDepth
from celery_event_operator.core.service import conclusion
from celery_event_operator.core.service.conclusion import EventNote
from celery_event_operator.core.service.ownership import Claimant
from celery_event_operator.core.service.pods import WorkerPod
from celery_event_operator.core.topology import plan
from celery_event_operator.core.topology.listed import ListedEntities, entities_of
from celery_event_operator.flow.services import ServiceKeeper
from tests.unit.flow.fakes import (
    FakeBroker,
    FakeBrokers,
    FakeCluster,
    FakeContext,
    RecordingLogger,
    listing_of,
    resource,
)

DEPTHS = (QueueDepth("billing.order", "events", 60, 1),)


class Harness:
    def __init__(self, body: dict[str, Any], broker: FakeBroker | None = None) -> None:
        self.body = body
        self.broker = broker or FakeBroker()
        self.brokers = FakeBrokers(self.broker)
        self.cluster = FakeCluster(body)
        self.context = FakeContext(self.cluster, self.brokers)
        self.events: list[EventNote] = []
        meta = body["metadata"]
        self.keeper = ServiceKeeper(
            self.context, meta["namespace"], meta["name"], self.events.extend, RecordingLogger()
        )
        self.pods = [WorkerPod("billing-worker-1", "h1")]

    async def reconcile(self) -> None:
        # Annotations ride on kopf's own patch of the resource in a change handler.
        await self.keeper.reconcile(self.body, lambda _: self.pods, self.body["metadata"]["annotations"].update)

    async def resync(self) -> None:
        await self.keeper.reconcile(self.body, lambda _: self.pods, resync=True)

    async def status_pass(self) -> None:
        await self.keeper.status_pass(self.body, lambda _: self.pods)

    def reasons(self) -> list[str]:
        found = [note.reason for note in self.events]
        self.events.clear()
        return found

    def condition(self, type: str) -> tuple[str, str]:
        found = next(c for c in self.body["status"]["conditions"] if c["type"] == type)
        return found["status"], found["reason"]


async def test_a_reconcile_declares_configures_subscribes_and_writes_once() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    assert harness.broker.declares == [("billing", False)]
    assert harness.cluster.made("sync_workers") == [("sync_workers", "billing")]
    assert [s.queue for s in harness.broker.events.subscriptions] == ["billing.celeryev"]
    assert harness.condition("Ready") == ("True", "Reconciled")
    assert harness.condition("WorkersConfigured") == ("True", "SettingsCurrent")
    assert harness.body["status"]["queueLength"] == 0, "the first reconcile brings the counters"
    assert harness.body["status"]["observedGeneration"] == 1
    assert {DECLARED_ANNOTATION, ACCEPTED_IMMUTABLE_ANNOTATION} <= set(harness.body["metadata"]["annotations"])
    assert harness.cluster.made("annotate") == [], "annotations went with the handler's own patch"
    assert len(harness.cluster.made("patch_status")) == 1
    assert harness.reasons() == []

    await harness.status_pass()
    assert harness.condition("WorkersHealthy") == ("Unknown", "NotChecked"), "the events are not consumed yet"
    assert len(harness.cluster.made("patch_status")) == 2
    await harness.reconcile()
    await harness.status_pass()
    assert len(harness.cluster.made("patch_status")) == 2, "at rest: nothing written"
    assert harness.cluster.made("sync_workers") == [("sync_workers", "billing")], "checked once per generation"
    assert len(harness.broker.declares) == 2, "a resync declares again (a hand-deleted queue comes back)"
    assert harness.brokers.users == 1
    assert len(harness.broker.events.subscriptions) == 1


async def test_passes_at_rest_reuse_the_settled_conclusion_and_a_change_concludes_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    concluded: list[object] = []

    def counting(*args: Any) -> Any:
        concluded.append(args[1])
        return conclusion.conclude(*args)

    monkeypatch.setattr("celery_event_operator.flow.services.conclude", counting)
    harness = Harness(resource())
    await harness.reconcile()
    for _ in range(3):
        await harness.status_pass()
    await harness.resync()
    await harness.resync()
    settled_at = len(concluded)
    for _ in range(3):  # a reconcile's observations and a status pass's, alternating
        await harness.status_pass()
        await harness.resync()
    assert len(concluded) == settled_at, "the same observations at rest: the last conclusions serve"
    harness.broker.depth_answer = (DEPTHS, "ready + unacknowledged")
    await harness.status_pass()
    assert len(concluded) == settled_at + 1
    assert harness.body["status"]["queueLength"] == 60, "a changed count is concluded and written"
    writes = len(harness.cluster.made("patch_status"))
    await harness.status_pass()
    await harness.status_pass()
    assert len(harness.cluster.made("patch_status")) == writes


def listed(harness: Harness, claimant: Claimant | None = None, **changes: Any) -> ListedEntities:
    """The broker's listing of the service's plan as declared (and its claim), with `changes` to its JSON."""
    topology = plan.plan("billing", parse_spec(harness.body["spec"]))
    listing = listing_of(topology, claimant) | changes
    return entities_of(listing["queues"], listing["exchanges"], listing["bindings"])


OURS = Claimant(DEFAULT_INSTALLATION_ID, "shop", "billing", "u1")


async def test_a_resync_asks_nothing_when_the_brokers_listing_shows_claim_and_plan_as_declared() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    assert (harness.broker.declares, harness.broker.claims_asked) == ([("billing", False)], 1)
    harness.broker.listed_answer = listed(harness, OURS)
    await harness.resync()
    assert (harness.broker.declares, harness.broker.claims_asked) == ([("billing", False)], 1), "nothing asked"
    assert harness.condition("Ready") == ("True", "Reconciled")
    assert harness.condition("TopologyReady") == ("True", "Declared")

    # Anything else: claimed and declared, both (a claim confirmed only by a listing never precedes a declare).
    other = Claimant(DEFAULT_INSTALLATION_ID, "shop2", "billing", "u2")
    for answer, connected, why in [
        (listed(harness, other), True, "the claim listed as another's"),
        (listed(harness, OURS, bindings=[]), True, "a binding missing"),
        (None, True, "no listing at hand"),
        (listed(harness, OURS), False, "no AMQP connection open: BrokerReachable must be asked"),
    ]:
        harness.broker.listed_answer, harness.broker.events.connected = answer, connected
        before = (len(harness.broker.declares), harness.broker.claims_asked)
        await harness.resync()
        assert (len(harness.broker.declares), harness.broker.claims_asked) == (before[0] + 1, before[1] + 1), why


async def test_a_service_whose_claim_was_lost_is_declared_when_it_is_regained_whatever_the_listing_shows() -> None:
    """The claim taken by another resource (its exchange deleted by hand first), which is deleted later with its
    entities: the listing may still show them as planned, but only a declare puts them back."""
    harness = Harness(resource())
    await harness.reconcile()
    other = Claimant(DEFAULT_INSTALLATION_ID, "shop2", "billing", "u2")
    harness.broker.claims["billing"] = other
    harness.broker.listed_answer = listed(harness, other)
    await harness.resync()
    assert harness.condition("Ready")[1] == "ServiceNameConflict"
    del harness.broker.claims["billing"]  # the other resource deleted, its entities removed
    harness.broker.listed_answer = listed(harness, OURS)  # a listing from before they went
    declares = len(harness.broker.declares)
    await harness.resync()
    assert len(harness.broker.declares) == declares + 1
    assert harness.condition("Ready") == ("True", "Reconciled")


async def test_a_resync_after_a_declare_that_was_refused_declares_whatever_the_listing_shows() -> None:
    """The user may lack the right to declare what someone else made as planned: only a declare tells."""
    harness = Harness(resource())
    harness.broker.declare_failure = BrokerRefusedError("the broker refused an operation: ACCESS_REFUSED")
    await harness.reconcile()
    assert harness.condition("TopologyReady")[0] == "False"
    harness.broker.listed_answer = listed(harness, OURS)
    await harness.resync()
    assert len(harness.broker.declares) == 2
    assert "listed" not in harness.broker.calls, "not even listed"
    assert harness.condition("TopologyReady")[0] == "False"
    harness.broker.declare_failure = None
    await harness.resync()
    await harness.resync()
    assert len(harness.broker.declares) == 3, "declared clean once, then found intact"
    assert harness.condition("TopologyReady") == ("True", "Declared")


class Stopped:
    """kopf's daemon flag as the keeper uses it: false until set; awaitable until set."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def __bool__(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.event.wait()


async def test_the_daemon_resyncs_when_asked_and_ends_as_soon_as_it_is_stopped() -> None:
    harness = Harness(resource(statusIntervalSeconds=3600))
    await harness.reconcile()
    stopped = Stopped()
    running = asyncio.ensure_future(harness.keeper.run(harness.body, lambda _: harness.pods, stopped))
    await asyncio.sleep(0.1)
    declares = len(harness.broker.declares)
    for _ in range(3):  # each request wakes it once, at once (the resync period is 30 s)
        harness.keeper.resync_requested.set()
        await asyncio.sleep(0.05)
    assert len(harness.broker.declares) == declares + 3
    stopped.event.set()
    async with asyncio.timeout(1):
        await running
    assert harness.brokers.users == 0, "closed: the broker let go"


async def test_a_spec_change_during_a_resync_is_rolled_out_by_its_change_handler() -> None:
    """kopf's body is live: the watch swaps in the changed resource while a resync waits on the broker. The resync
    acts on the spec it read; the change handler that waits for it must not find its own generation done (a CI run
    saw no rollout for 90 s: the resync had checked the workers for the new generation with the old spec)."""
    harness = Harness(resource(retry={"maxRetries": 3}))
    await harness.reconcile()
    harness.broker.claim_gate = asyncio.Event()
    resync = asyncio.ensure_future(harness.keeper.reconcile(harness.body, lambda _: harness.pods))
    await asyncio.sleep(0)  # the resync waits on the claim
    harness.body["spec"]["retry"]["maxRetries"] = 5
    harness.body["metadata"]["generation"] = 2
    change = asyncio.ensure_future(harness.reconcile())
    harness.broker.claim_gate.set()
    await asyncio.gather(resync, change)
    assert [spec.retry.max_retries for spec in harness.cluster.synced] == [3, 5], "the ConfigMap of the new spec"
    assert harness.body["status"]["observedGeneration"] == 2


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param({"spec": {"retry": {"maxRetries": 99}}}, "InvalidSpec", id="invalid"),
        pytest.param({"spec": {"queueType": "quorum"}}, "ImmutableFieldChanged", id="immutable"),
    ],
)
async def test_a_spec_that_cannot_be_acted_on_lets_go_and_warns_once(change: dict[str, Any], reason: str) -> None:
    harness = Harness(resource())
    await harness.reconcile()
    harness.body["spec"] |= change["spec"]
    harness.body["metadata"]["generation"] = 2
    await harness.reconcile()
    await harness.reconcile()
    assert harness.condition("Ready") == ("False", reason)
    assert harness.reasons() == [reason], "one Warning, not one per resync"
    assert harness.brokers.users == 0, "the broker is let go"
    assert harness.broker.events.subscriptions == []
    assert harness.broker.declares == [("billing", False)], "nothing touched"
    await harness.status_pass()
    assert harness.reasons() == []


async def test_an_unusable_secret_acquires_no_broker_and_names_the_reason() -> None:
    harness = Harness(resource())
    harness.brokers.secret_failure = BrokerSecretError("Secret shop/rabbitmq does not exist")
    await harness.reconcile()
    assert harness.condition("BrokerReachable") == ("False", "BrokerSecretInvalid")
    assert harness.condition("Ready") == ("False", "BrokerSecretInvalid")
    assert harness.reasons() == ["BrokerSecretInvalid"]
    assert harness.broker.declares == []
    assert harness.brokers.users == 0
    await harness.status_pass()
    assert harness.cluster.made("read_scale") == [], "no status pass without a broker"


async def test_the_api_not_answering_keeps_the_broker_the_consumer_and_the_conditions() -> None:
    """The Kubernetes API's passing fault is not the Secret's: nothing is let go, nothing flaps, the reconcile
    is made again soon; when the Secret stays unreadable for long that is said once, the broker still kept."""
    harness = Harness(resource())
    await harness.reconcile()
    harness.reasons()
    before = harness.body["status"]["conditions"]
    consumer = harness.broker.events.subscriptions[0]
    harness.brokers.secret_failure = KubeUnavailableError(
        "cannot read Secret shop/rabbitmq: does not answer (for 60 s)"
    )
    harness.cluster.workers_unavailable = "cannot read ConfigMap shop/billing-celery-events: HTTP 500"
    harness.keeper.workers.checked = None  # due for its check
    await harness.reconcile()
    assert harness.brokers.users == 1
    assert harness.broker.events.subscriptions == [consumer]
    assert harness.broker.declares == [("billing", False)] * 2, "declared on the settings last read"
    assert harness.body["status"]["conditions"] == before
    assert harness.reasons() == ["KubernetesAPIUnavailable"]
    assert harness.keeper._api_retry
    harness.brokers.secret_failure = None
    harness.cluster.workers_unavailable = None
    await harness.reconcile()
    assert harness.reasons() == []
    assert not harness.keeper._api_retry


async def test_a_secret_gone_lets_go_of_broker_and_consumer() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    harness.brokers.secret_failure = BrokerSecretError("Secret shop/rabbitmq does not exist")
    await harness.reconcile()
    assert harness.brokers.users == 0
    assert harness.broker.events.subscriptions == []
    assert harness.condition("BrokerReachable") == ("False", "BrokerSecretInvalid")


async def test_a_broker_alarm_is_shown_counted_and_its_end_reconciled() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    metrics = harness.context.metrics.find("shop", "billing")
    assert metrics is not None
    assert metrics.broker_alarms == 0
    harness.broker.alarm_answer = (Alarm("memory", "rabbit@a"),)
    await harness.status_pass()
    assert harness.condition("Ready") == ("False", "BrokerAlarm")
    assert harness.reasons() == ["BrokerAlarm"]
    assert metrics.broker_alarms == 1
    assert harness.broker.events.subscriptions, "the events consumer goes on (consumers are not blocked)"
    harness.broker.alarm_answer = ()
    await harness.status_pass()
    assert harness.keeper.resync_requested.is_set()
    await harness.reconcile()
    assert harness.condition("Ready") == ("True", "Reconciled")
    assert harness.reasons() == ["Connected"]
    harness.broker.alarm_answer = ManagementUnavailableError("management API at http://h:15672: HTTP 404")
    await harness.status_pass()
    assert metrics.broker_alarms is None, "not seen without a management API"
    assert harness.condition("Ready") == ("True", "Reconciled")


async def test_a_status_pass_autoscales_and_says_so() -> None:
    harness = Harness(resource(autoscaling={"enabled": True, "maxReplicas": 5}))
    await harness.reconcile()
    harness.reasons()
    harness.broker.depth_answer = (DEPTHS, "ready + unacknowledged")
    await harness.status_pass()
    assert harness.cluster.made("set_scale") == [("set_scale", "billing-worker", 3)]
    assert harness.reasons() == ["Scaled"]
    status = harness.body["status"]
    assert (status["queueLength"], status["desiredReplicas"], status["replicas"]) == (60, 3, 1)
    assert "lastScaleTime" in status
    metrics = harness.context.metrics.find("shop", "billing")
    assert metrics is not None
    assert (metrics.replicas, metrics.desired_replicas) == (1, 3)


async def test_queue_lengths_unknown_leave_replicas_and_counters_as_they_are() -> None:
    harness = Harness(resource(autoscaling={"enabled": True}))
    harness.broker.depth_answer = (DEPTHS, "ready + unacknowledged")
    await harness.reconcile()
    harness.reasons()
    harness.broker.depth_answer = BrokerUnavailableError("management API down")
    await harness.status_pass()
    await harness.status_pass()
    assert harness.reasons() == ["ScalingPaused"]
    assert harness.body["status"]["queueLength"] == 60
    assert len(harness.cluster.made("set_scale")) == 1, "only the first pass, with known depths, scaled"


async def test_a_rotated_secret_is_read_again_after_a_refused_login() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    harness.broker.events.login_refused = True
    await harness.status_pass()
    assert harness.keeper.resync_requested.is_set()


async def test_deleting_removes_the_services_entities_and_releases_the_broker() -> None:
    harness = Harness(resource(deletionPolicy="delete"))
    await harness.reconcile()
    harness.reasons()
    assert await harness.keeper.delete_entities(harness.body, remove=True, last_try=False) is None, "done"
    assert harness.broker.declares == [("billing", False), ("billing", True)]
    await harness.reconcile()
    await harness.status_pass()
    assert harness.broker.declares == [("billing", False), ("billing", True)], "no resync declares them again"
    harness.broker.claims["billing"] = Claimant(DEFAULT_INSTALLATION_ID, "shop", "billing", "u1")  # a deletion again
    harness.broker.declare_failure = BrokerUnavailableError("down")
    assert await harness.keeper.delete_entities(harness.body, remove=True, last_try=False) == "down", (
        "tried again later"
    )
    assert harness.reasons() == [], "no Event while it is tried again"
    assert harness.brokers.users == 1, "what a deletion acquires it releases (the keeper's own goes at close)"
    assert await harness.keeper.delete_entities(harness.body, remove=True, last_try=True) is None
    assert harness.reasons() == ["BrokerUnreachable"], "the last try tells why the queues stay"
    await harness.keeper.close()
    assert harness.brokers.users == 0


def in_namespace(namespace: str, uid: str, **spec: Any) -> dict[str, Any]:
    body = resource(**spec)
    body["metadata"] |= {"namespace": namespace, "uid": uid}
    return body


async def test_a_second_resource_of_one_service_name_declares_consumes_and_deletes_nothing() -> None:
    broker = FakeBroker()
    owner, second = Harness(resource()), Harness(in_namespace("shop2", "u2", deletionPolicy="delete"), broker)
    owner.broker = owner.brokers.broker = broker
    await owner.reconcile()
    await second.reconcile()
    await second.status_pass()
    await second.reconcile()
    assert broker.declares == [("billing", False)], "only the owner declared"
    assert second.condition("Ready") == ("False", "ServiceNameConflict")
    assert "belongs to shop/billing" in next(c for c in second.body["status"]["conditions"])["message"]
    assert "queueLength" not in second.body["status"]
    assert second.cluster.made("sync_workers") == [], "the workers of a service it does not own are not configured"
    assert len(broker.events.subscriptions) == 1, "only the owner's events are consumed"
    assert second.context.metrics.find("shop2", "billing") is None
    assert second.reasons() == ["ServiceNameConflict"], "one Event, not one per resync"

    assert await second.keeper.delete_entities(second.body, remove=True, last_try=False) is None
    assert broker.declares == [("billing", False)], "the second's deletion removed nothing"
    assert second.reasons() == ["ServiceNameConflict"]
    assert broker.claims["billing"].namespace == "shop", "the owner's claim stays"


async def test_the_second_resource_takes_over_once_the_owner_is_deleted() -> None:
    broker = FakeBroker()
    owner, second = Harness(resource(), broker), Harness(in_namespace("shop2", "u2"), broker)
    await owner.reconcile()
    await second.reconcile()
    second.reasons()
    assert await owner.keeper.delete_entities(owner.body, remove=False, last_try=False) is None
    assert owner.reasons() == [], "deletionPolicy retain: nothing removed, the claim released quietly"
    assert "billing" not in broker.claims
    await second.reconcile()
    assert second.condition("Ready") == ("True", "Reconciled")
    assert second.reasons() == ["ServiceNameClaimed"]
    assert broker.declares == [("billing", False), ("billing", False)]
    assert broker.claims["billing"].namespace == "shop2"


async def test_a_claim_that_cannot_be_made_is_a_broker_failure_and_nothing_is_declared() -> None:
    harness = Harness(resource())
    harness.broker.claim_failure = BrokerUnavailableError("down")
    await harness.reconcile()
    assert harness.broker.declares == []
    assert harness.condition("BrokerReachable") == ("False", "BrokerUnreachable")


async def test_an_owner_whose_claim_another_took_lets_go_of_everything_it_kept() -> None:
    """The claim exchange deleted by hand, and another resource's resync claimed the name first."""
    harness = Harness(resource())
    await harness.reconcile()
    await harness.status_pass()
    assert ("shop", "billing") in harness.context.metrics.status_passes
    harness.broker.claims["billing"] = Claimant("operator", "shop2", "billing", "u2")
    await harness.reconcile()
    await harness.status_pass()
    assert harness.condition("Ready") == ("False", "ServiceNameConflict")
    assert harness.broker.events.subscriptions == []
    assert harness.context.metrics.find("shop", "billing") is None
    assert ("shop", "billing") not in harness.context.metrics.status_passes, "no stale status age to alert on"
    assert "queueLength" not in harness.body["status"]
    assert harness.broker.declares == [("billing", False)]


async def test_a_refused_resource_that_cannot_claim_this_time_still_configures_and_consumes_nothing() -> None:
    broker = FakeBroker()
    owner, second = Harness(resource(), broker), Harness(in_namespace("shop2", "u2"), broker)
    await owner.reconcile()
    await second.reconcile()
    broker.claim_failure = BrokerUnavailableError("down")
    await second.reconcile()
    await second.status_pass()
    assert second.cluster.made("sync_workers") == []
    assert len(broker.events.subscriptions) == 1, "only the owner's"
    assert broker.declares == [("billing", False)]
    assert second.condition("BrokerReachable") == ("False", "BrokerUnreachable")


async def test_a_refused_resource_after_a_restart_configures_and_consumes_nothing_while_it_cannot_claim() -> None:
    """The operator restarted while the broker does not answer: the status says whose the service was."""
    broker = FakeBroker()
    owner, second = Harness(resource(), broker), Harness(in_namespace("shop2", "u2"), broker)
    await owner.reconcile()
    await second.reconcile()
    second.reasons()
    restarted = Harness(second.body, broker)
    broker.claim_failure = BrokerUnavailableError("down")
    await restarted.reconcile()
    await restarted.status_pass()
    assert restarted.cluster.made("sync_workers") == [], "the refused resource's workers are not configured"
    assert len(broker.events.subscriptions) == 1, "only the owner's events are consumed"
    assert broker.declares == [("billing", False)]
    broker.claim_failure = None
    await restarted.reconcile()
    assert restarted.condition("Ready") == ("False", "ServiceNameConflict")


async def test_a_deletion_after_a_refused_change_of_service_name_releases_the_name_it_owns() -> None:
    """An API that does not enforce the CRD's immutability rule let spec.serviceName change; the operator refused it."""
    harness = Harness(resource())
    await harness.reconcile()
    assert "billing" in harness.broker.claims
    harness.body["spec"]["serviceName"] = "other"
    harness.body["metadata"]["generation"] = 2
    await harness.reconcile()
    assert harness.condition("Ready")[1] == "ImmutableFieldChanged"
    assert await harness.keeper.delete_entities(harness.body, remove=False, last_try=False) is None
    assert harness.broker.claims == {}, "the claim on 'billing' released: the next claimant can take it"


async def test_deleting_a_resource_that_never_claimed_its_service_removes_nothing() -> None:
    """The version before claims served it, and its sibling of the same name has not been reconciled yet."""
    harness = Harness(resource(deletionPolicy="delete"))
    assert await harness.keeper.delete_entities(harness.body, remove=True, last_try=False) is None
    assert harness.broker.declares == [], "nothing removed"
    assert harness.reasons() == ["ServiceNameUnclaimed"]
    assert harness.broker.claims == {}, "the claim made to check is released"


async def test_closing_lets_go_of_the_consumer_broker_and_series() -> None:
    harness = Harness(resource())
    await harness.reconcile()
    assert harness.context.metrics.find("shop", "billing") is not None
    await harness.keeper.close()
    assert harness.brokers.users == 0
    assert harness.broker.events.subscriptions == []
    assert harness.context.metrics.find("shop", "billing") is None


async def test_unusable_tls_material_found_when_the_broker_is_made_is_the_secrets_fault() -> None:
    harness = Harness(resource())
    failure = BrokerSecretError("the broker Secret's ca.crt is no PEM certificate")

    def refuse(settings: Any) -> FakeBroker:
        raise failure

    harness.brokers.acquire = refuse  # type: ignore[method-assign]
    await harness.reconcile()
    assert harness.condition("BrokerReachable") == ("False", "BrokerSecretInvalid")
    assert harness.reasons() == ["BrokerSecretInvalid"]
