"""One owner per (broker, vhost, serviceName): two resources of one service name — in two namespaces, under two
operator installations, or both already served by the version before claims — never share a topology. The real
operator on the emulated API, a real RabbitMQ (the claim is an exchange on it)."""

from __future__ import annotations

import base64
import pathlib
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.topology import apply
from celery_event_operator.core.api.metadata import FINALIZER
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.naming import owner_exchange_name
from celery_event_operator.core.topology import plan
from tests.conftest import billing_sample, create_broker_secret
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, condition, gone
from tests.support.kube import events as events_of
from tests.support.kube import eventually as eventually_within
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import once_quiet, stays

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

RESYNC = 1.0
OWNER, SECOND = "shop", "shop2"
CREATED, CANCELLED = "billing.orders.order.created", "billing.orders.order.cancelled"
ARCHIVE_MESSAGES, HANDLER_MESSAGES = 3, 5
OLD = "as the version before claims said"
WAIT = 30.0


def eventually(probe: Any, timeout: float = WAIT, **more: Any) -> Any:
    """Waits of this file: long enough for two test processes on two cores, each with operators of its own."""
    return eventually_within(probe, timeout=max(timeout, WAIT), **more)


def ces_path(namespace: str, name: str = "billing") -> str:
    return f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices/{name}"


def owner_body(**spec: Any) -> dict[str, Any]:
    body = billing_sample()
    body["spec"] |= spec
    return body


def second_body() -> dict[str, Any]:
    """The same serviceName with a topology of its own shape: anything it declared would show on the broker."""
    return owner_body(
        events={"exchange": "events", "handlers": [{"name": "orders.order.refunded"}]},
        retry={"maxRetries": 3},
        deletionPolicy="delete",
    )


def create(api: EmulatedApi, namespace: str, body: dict[str, Any]) -> None:
    api.client.create(ces_path(namespace).rsplit("/", 1)[0], body)


def ready(api: EmulatedApi, namespace: str) -> dict[str, Any]:
    return condition(api, "Ready", namespace=namespace)


def refused_naming(api: EmulatedApi, namespace: str, owner: str) -> bool:
    found = ready(api, namespace)
    return found.get("reason") == "ServiceNameConflict" and f"belongs to {owner}" in found.get("message", "")


def held(management: rabbitmq.Management, vhost: str) -> dict[str, Any]:
    """The vhost's entities and the messages each queue holds."""
    found = rabbitmq.snapshot(management, vhost)
    path = management.vhost_path(vhost)
    found["messages"] = {
        q["name"]: q.get("messages", 0) for q in management.request("GET", f"/queues/{path}?columns=name,messages")
    }
    return found


def settled(management: rabbitmq.Management, vhost: str) -> dict[str, Any]:
    """What the vhost holds once the management API's message counts have caught up (they lag by seconds)."""
    last: dict[str, Any] = {}

    def same_twice() -> dict[str, Any]:
        nonlocal last
        now = held(management, vhost)
        stable, last = now == last, now
        assert stable
        return now

    return eventually(same_twice, timeout=20, interval=2.5, message="the vhost never settled")


def filled(management: rabbitmq.Management, vhost: str) -> dict[str, Any]:
    """What the vhost holds once the management API counts the messages `fill` published."""

    def counted() -> dict[str, Any]:
        found = held(management, vhost)
        assert found["messages"]["billing:archived"] == ARCHIVE_MESSAGES
        assert found["messages"][CREATED] == HANDLER_MESSAGES
        return found

    eventually(counted, timeout=20, interval=1, message="the messages were never counted")
    return settled(management, vhost)


def fill(url: str) -> None:
    """Messages in the archive and a handler queue; the other handler queue and the retry levels stay empty."""
    with Connection(url, connect_timeout=5) as connection:
        producer = connection.Producer()
        for number in range(ARCHIVE_MESSAGES):
            producer.publish({"n": number}, exchange="", routing_key="billing:archived")
        for number in range(HANDLER_MESSAGES):
            producer.publish({"n": number}, exchange="events", routing_key="orders.order.created")


def condition_of(body: dict[str, Any], type: str) -> dict[str, Any]:
    return next((c for c in (body.get("status") or {}).get("conditions", []) if c["type"] == type), {})


def consumers_of(management: rabbitmq.Management, vhost: str, queue: str) -> int:
    path = management.vhost_path(vhost)
    return int(management.request("GET", f"/queues/{path}/{queue}").get("consumers", 0))


@pytest.fixture
def secrets(kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str) -> str:
    for namespace in (OWNER, SECOND):
        create_broker_secret(kube_api, test_vhost_url, namespace=namespace)
    return test_vhost_url


@pytest.fixture
def running(kube_api: EmulatedApi, secrets: str, tmp_path: pathlib.Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC).start()
    yield process
    process.stop()


def test_a_second_resource_is_refused_and_its_deletion_touches_nothing_of_the_owners(
    kube_api: EmulatedApi,
    running: OperatorProcess,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
) -> None:
    create(kube_api, OWNER, owner_body())
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True", message="the owner never became Ready")
    fill(secrets)
    eventually(lambda: consumers_of(rabbitmq_management, test_vhost, "billing.celeryev") == 1)
    before = filled(rabbitmq_management, test_vhost)
    assert before["messages"][CANCELLED] == before["messages"]["billing:retry"] == 0

    create(kube_api, SECOND, second_body())
    eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"), message="the second was not refused")
    stays(  # resyncs of both
        lambda: settled(rabbitmq_management, test_vhost) == before, 4 * RESYNC, 0.5, "the second declared something"
    )
    status = kube_api.client.get(ces_path(SECOND))["status"]
    assert {c["type"] for c in status["conditions"]} == {"Ready", "BrokerReachable"}
    assert "queueLength" not in status, "no queue lengths of a service it does not keep"
    assert len(events_of(kube_api, "ServiceNameConflict", SECOND)) == 1, "one Event, not one per resync"
    assert consumers_of(rabbitmq_management, test_vhost, "billing.celeryev") == 1, "only the owner's consumer"
    assert 'namespace="shop2"' not in running.scrape(), "no series of a service it does not keep"
    assert ready(kube_api, OWNER)["status"] == "True"

    # A replay of the second's service waits as for any service that is not Ready, naming the owner.
    replays = f"/apis/celeryevents.io/v1alpha1/namespaces/{SECOND}/celeryeventreplays"
    replay = {"apiVersion": "celeryevents.io/v1alpha1", "kind": "CeleryEventReplay", "metadata": {"name": "again"}}
    kube_api.client.create(replays, replay | {"spec": {"serviceRef": {"name": "billing"}, "action": "replay"}})

    def held() -> dict[str, Any]:
        found = condition_of(kube_api.client.get(f"{replays}/again"), "Succeeded")
        assert found.get("reason") == "ServiceNotReady"
        return found

    waiting = eventually(held, timeout=20, message="the replay was not held")
    assert "ServiceNameConflict" in waiting["message"]
    assert "belongs to shop/billing" in waiting["message"]

    kube_api.client.delete(ces_path(SECOND))
    eventually(lambda: gone(kube_api.client, ces_path(SECOND)), timeout=20, message="the second was never deleted")
    stays(
        lambda: settled(rabbitmq_management, test_vhost) == before,
        2 * RESYNC,
        0.5,
        "deleting the second removed something of the owner's",
    )
    told = eventually(
        lambda: [e for e in events_of(kube_api, "ServiceNameConflict", SECOND) if e["message"].startswith("nothing")]
    )
    assert told[0]["message"] == "nothing removed: serviceName 'billing' belongs to shop/billing"
    assert ready(kube_api, OWNER)["status"] == "True"


def test_deleting_the_owner_lets_the_second_take_over(
    kube_api: EmulatedApi,
    running: OperatorProcess,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
) -> None:
    create(kube_api, OWNER, owner_body())
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
    create(kube_api, SECOND, second_body())
    eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"))

    kube_api.client.delete(ces_path(OWNER))  # deletionPolicy retain: its queues stay, its claim goes
    eventually(lambda: gone(kube_api.client, ces_path(OWNER)), timeout=20)
    eventually(lambda: ready(kube_api, SECOND).get("status") == "True", timeout=15, message="never taken over")
    queues = set(rabbitmq.snapshot(rabbitmq_management, test_vhost)["queues"])
    assert "billing.orders.order.refunded" in queues, "the new owner declared its topology"
    assert {CREATED, CANCELLED} <= queues, "the queues the old owner retained are still there"
    eventually(lambda: events_of(kube_api, "ServiceNameClaimed", SECOND), message="the take-over was not announced")
    exchange = rabbitmq_management.request(
        "GET", f"/exchanges/{rabbitmq_management.vhost_path(test_vhost)}/{owner_exchange_name('billing')}"
    )
    assert exchange["arguments"]["x-owner-namespace"] == SECOND


def test_two_installations_on_one_broker_settle_on_one_owner_and_a_restart_changes_nothing(
    kube_api: EmulatedApi,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    tmp_path: pathlib.Path,
) -> None:
    """Each installation serves its own namespace and cannot see the other's resources: the broker decides."""

    def installation(name: str, namespace: str) -> OperatorProcess:
        log = tmp_path / f"operator-{name}.log"
        args = ("--installation-id", name, "--namespace", namespace)
        return OperatorProcess(kube_api.kubeconfig, log, *args, resync_seconds=RESYNC, webhook=False).start()

    first = installation("team-a", OWNER)
    second = installation("team-b", SECOND)
    try:
        create(kube_api, OWNER, owner_body())
        eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
        create(kube_api, SECOND, second_body())
        owner = "shop/billing of operator installation 'team-a'"
        eventually(lambda: refused_naming(kube_api, SECOND, owner), message="the other installation was not refused")
        before = settled(rabbitmq_management, test_vhost)
        assert "billing.orders.order.refunded" not in before["queues"]

        first.stop()
        second.stop()
        first, second = installation("team-a", OWNER), installation("team-b", SECOND)
        stays(
            lambda: (
                ready(kube_api, OWNER)["status"] == "True"
                and refused_naming(kube_api, SECOND, owner)
                and settled(rabbitmq_management, test_vhost) == before
            ),
            4 * RESYNC,
            0.5,
            "a restart changed the owner or the topology",
        )
        assert len(events_of(kube_api, "ServiceNameConflict", SECOND)) == 1, "a restart announced nothing again"
    finally:
        first.stop()
        second.stop()


def test_an_upgrade_with_two_resources_on_one_topology_settles_on_one_owner_and_deletes_nothing(
    kube_api: EmulatedApi,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    tmp_path: pathlib.Path,
) -> None:
    """Before claims, both resources were Ready on the one topology (declared, holding messages, no claim)."""
    with Connection(secrets, connect_timeout=5) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(owner_body()["spec"])))
    fill(secrets)
    before = filled(rabbitmq_management, test_vhost)
    for namespace in (OWNER, SECOND):
        create(kube_api, namespace, owner_body(deletionPolicy="delete"))
        kube_api.client.merge_patch(
            ces_path(namespace) + "/status",
            {"status": {"queueLength": 5, "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled",
             "message": OLD, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        )  # fmt: skip

    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC).start()
    try:

        def one_owner() -> tuple[str, str]:
            states = {namespace: ready(kube_api, namespace) for namespace in (OWNER, SECOND)}
            owners = [ns for ns, found in states.items() if found.get("status") == "True" and found["message"] != OLD]
            refused = [ns for ns, found in states.items() if found.get("reason") == "ServiceNameConflict"]
            assert len(owners) == 1
            assert len(refused) == 1
            return owners[0], refused[0]

        owner, refused = eventually(one_owner, timeout=20, message="no single owner")
        assert refused_naming(kube_api, refused, f"{owner}/billing")
        assert "queueLength" not in kube_api.client.get(ces_path(refused))["status"]

        def kept() -> bool:
            after = settled(rabbitmq_management, test_vhost)
            lost = {name: after["messages"][name] for name in before["messages"]} != before["messages"]
            return not lost and set(after["queues"]) == set(before["queues"])

        stays(kept, 3 * RESYNC, 0.5, "a message was lost or a queue deleted")

        kube_api.client.delete(ces_path(refused))  # deletionPolicy delete, but not its own: nothing goes
        eventually(lambda: gone(kube_api.client, ces_path(refused)), timeout=20)
        assert set(settled(rabbitmq_management, test_vhost)["queues"]) == set(before["queues"])
        assert ready(kube_api, owner)["status"] == "True"
    finally:
        process.stop()


def test_an_owner_moving_to_another_vhost_leaves_the_name_to_the_next_claimant(
    kube_api: EmulatedApi,
    running: OperatorProcess,
    rabbitmq_management: rabbitmq.Management,
    amqp_url: str,
    test_vhost: str,
) -> None:
    create(kube_api, OWNER, owner_body())
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
    create(kube_api, SECOND, second_body())
    eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"))

    elsewhere = rabbitmq.create_vhost(rabbitmq_management)
    try:
        url = rabbitmq.url_with_vhost(amqp_url, elsewhere)
        kube_api.client.merge_patch(
            f"/api/v1/namespaces/{OWNER}/secrets/rabbitmq", {"data": {"url": base64.b64encode(url.encode()).decode()}}
        )

        def owner_there() -> bool:
            queues = set(rabbitmq.snapshot(rabbitmq_management, elsewhere)["queues"])
            return CREATED in queues

        eventually(owner_there, timeout=40, message="the owner never moved")
        eventually(lambda: ready(kube_api, SECOND).get("status") == "True", timeout=15, message="never taken over")
        claim = f"/exchanges/{rabbitmq_management.vhost_path(test_vhost)}/{owner_exchange_name('billing')}"
        assert rabbitmq_management.request("GET", claim)["arguments"]["x-owner-namespace"] == SECOND
        assert ready(kube_api, OWNER)["status"] == "True"
    finally:
        rabbitmq.delete_vhost(rabbitmq_management, elsewhere)


def test_an_owner_deleted_with_its_namespace_releases_the_name_though_its_secret_went_first(
    kube_api: EmulatedApi, running: OperatorProcess
) -> None:
    """`kubectl delete namespace` removes the Secret at once while the resource waits for its finalizer."""
    create(kube_api, OWNER, owner_body())
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
    create(kube_api, SECOND, second_body())
    eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"))

    kube_api.client.delete(f"/api/v1/namespaces/{OWNER}/secrets/rabbitmq")
    # Once the operator saw it gone (past its cache of a Secret's settings), the deletion cannot read it either.
    eventually(lambda: ready(kube_api, OWNER).get("reason") == "BrokerSecretInvalid", timeout=30)
    kube_api.client.delete(ces_path(OWNER))
    eventually(lambda: gone(kube_api.client, ces_path(OWNER)), timeout=20)
    eventually(lambda: ready(kube_api, SECOND).get("status") == "True", timeout=15, message="never taken over")


def test_a_changed_installation_id_keeps_each_resource_its_own_name(
    kube_api: EmulatedApi,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    tmp_path: pathlib.Path,
) -> None:
    """The claim names the resource by its uid too: the same resource under a new --installation-id is the owner."""

    def operator(installation: str) -> OperatorProcess:
        log = tmp_path / f"operator-{installation}.log"
        args = ("--installation-id", installation)
        return OperatorProcess(kube_api.kubeconfig, log, *args, resync_seconds=RESYNC, webhook=False).start()

    claim = f"/exchanges/{rabbitmq_management.vhost_path(test_vhost)}/{owner_exchange_name('billing')}"
    process = operator("first-name")
    try:
        create(kube_api, OWNER, owner_body())
        eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
        create(kube_api, SECOND, second_body())
        eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"))
    finally:
        process.stop()
    process = operator("second-name")
    try:

        def renamed() -> dict[str, Any]:
            try:
                found: dict[str, Any] = rabbitmq_management.request("GET", claim)["arguments"]
            except urllib.error.HTTPError as exc:  # a take-over releases the claim, then claims it: gone a moment
                raise AssertionError("no claim at this moment") from exc
            assert found["x-owner-installation"] == "second-name"
            return found

        arguments = eventually(renamed, timeout=15, message="the claim was never taken over under the new id")
        assert arguments["x-owner-namespace"] == OWNER
        stays(
            lambda: (
                ready(kube_api, OWNER)["status"] == "True"
                and refused_naming(kube_api, SECOND, "shop/billing")
                and rabbitmq_management.request("GET", claim)["arguments"]["x-owner-namespace"] == OWNER
            ),
            2 * RESYNC,
            0.5,
            "the owner changed",
        )
        assert events_of(kube_api, "ServiceNameConflict", OWNER) == []
    finally:
        process.stop()


def test_a_resource_deleted_across_the_upgrade_removes_nothing_its_sibling_uses(
    kube_api: EmulatedApi,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    tmp_path: pathlib.Path,
) -> None:
    """Marked for deletion (`deletionPolicy: delete`) while no operator ran, beside a sibling of the same name: when
    the operator with claims starts, whichever claims first, the deleted one removes nothing."""
    with Connection(secrets, connect_timeout=5) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(owner_body()["spec"])))
    for namespace in (OWNER, SECOND):
        body = owner_body(deletionPolicy="delete")
        body["metadata"]["finalizers"] = ["celeryevents.io/finalizer"]  # as the version before put it
        create(kube_api, namespace, body)
    kube_api.client.delete(ces_path(SECOND))
    before = set(rabbitmq.snapshot(rabbitmq_management, test_vhost)["queues"])

    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC).start()
    try:
        eventually(lambda: gone(kube_api.client, ces_path(SECOND)), message="the deleted one was never let go")
        eventually(lambda: ready(kube_api, OWNER).get("status") == "True")
        stays(
            lambda: set(rabbitmq.snapshot(rabbitmq_management, test_vhost)["queues"]) == before,
            2 * RESYNC,
            0.5,
            "something was removed",
        )
        told = {event["reason"] for event in events_of(kube_api, "ServiceNameUnclaimed", SECOND)}
        told |= {event["reason"] for event in events_of(kube_api, "ServiceNameConflict", SECOND)}
        assert told, "the deletion said why it removed nothing"
    finally:
        process.stop()


def start_two_shards(api: EmulatedApi, logs: pathlib.Path) -> list[OperatorProcess]:
    """shop/billing hashes to shard 1, shop2/billing to shard 0: each shard keeps one of the two resources."""
    return [
        OperatorProcess(
            api.kubeconfig,
            logs / f"shard-{index}.log",
            *("--shard-count", "2", "--shard-index", str(index)),
            resync_seconds=RESYNC,
            webhook=False,
        ).start()
        for index in range(2)
    ]


@pytest.fixture
def two_shards(kube_api: EmulatedApi, secrets: str, tmp_path: pathlib.Path) -> Iterator[list[OperatorProcess]]:
    shards = start_two_shards(kube_api, tmp_path)
    yield shards
    for shard in shards:
        shard.stop()


def test_two_shards_leave_each_others_resources_alone_and_each_deletion_releases_its_claim(
    kube_api: EmulatedApi,
    two_shards: list[OperatorProcess],
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
) -> None:
    create(kube_api, OWNER, owner_body())
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True", message="the owner never became Ready")
    create(kube_api, SECOND, second_body())
    eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"), message="the second was not refused")

    def versions() -> list[str]:
        return [kube_api.client.get(ces_path(ns))["metadata"]["resourceVersion"] for ns in (OWNER, SECOND)]

    at_rest = once_quiet(versions, 2 * RESYNC)  # the last handlers' own patches
    stays(lambda: versions() == at_rest, 10, 0.5, "a shard wrote to a resource at rest")

    kube_api.client.delete(ces_path(OWNER))  # shard 1's deletion handler releases the claim
    eventually(lambda: gone(kube_api.client, ces_path(OWNER)), message="the owner was never deleted")
    eventually(lambda: ready(kube_api, SECOND).get("status") == "True", message="shard 1 never released")

    # The owner again, refused now, carrying the one finalizer the operator used before it had one per shard.
    create(kube_api, OWNER, owner_body() | {"metadata": {"name": "billing", "finalizers": [FINALIZER]}})
    eventually(lambda: refused_naming(kube_api, OWNER, "shop2/billing"), message="the old owner was not refused")
    kube_api.client.delete(ces_path(SECOND))  # shard 0's deletion handler releases the claim
    eventually(lambda: gone(kube_api.client, ces_path(SECOND)), message="the second was never deleted")
    eventually(lambda: ready(kube_api, OWNER).get("status") == "True", message="shard 0 never released")

    kube_api.client.delete(ces_path(OWNER))
    eventually(lambda: gone(kube_api.client, ces_path(OWNER)), message="the old finalizer held the deletion")
    exchanges = rabbitmq.snapshot(rabbitmq_management, test_vhost)["exchanges"]
    assert owner_exchange_name("billing") not in exchanges, "its deletion ran before the old finalizer went"


def replay_path(namespace: str, name: str = "") -> str:
    return f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventreplays" + (f"/{name}" if name else "")


def test_two_shards_leave_each_others_replays_alone_and_an_ended_one_with_the_old_finalizer_goes(
    kube_api: EmulatedApi, secrets: str, tmp_path: pathlib.Path
) -> None:
    replay = {"apiVersion": "celeryevents.io/v1alpha1", "kind": "CeleryEventReplay"}
    spec = {"spec": {"serviceRef": {"name": "billing"}, "action": "replay"}}
    # Ended before the shards start, under the finalizer of the operator before it had one per shard.
    kube_api.client.create(
        replay_path(OWNER), replay | spec | {"metadata": {"name": "ended", "finalizers": [FINALIZER]}}
    )
    ended = {"type": "Succeeded", "status": "False", "reason": "Failed", "message": "ended before the upgrade"}
    kube_api.client.merge_patch(replay_path(OWNER, "ended") + "/status", {"status": {"conditions": [ended]}})
    shards = start_two_shards(kube_api, tmp_path)
    try:
        # Waits for its service (none in shop2), its daemon running on shard 0 under shard 0's finalizer.
        kube_api.client.create(replay_path(SECOND), replay | spec | {"metadata": {"name": "waiting"}})
        eventually(
            lambda: (
                condition_of(kube_api.client.get(replay_path(SECOND, "waiting")), "Succeeded").get("reason")
                == "ServiceNotFound"
            ),
            message="the replay never waited",
        )

        def replay_metadata() -> dict[str, Any]:
            found: dict[str, Any] = kube_api.client.get(replay_path(SECOND, "waiting"))["metadata"]
            return found

        at_rest = once_quiet(replay_metadata, 2 * RESYNC)
        assert at_rest["finalizers"] == ["celeryevents.io/finalizer-shard-0-of-2"]
        stays(
            lambda: replay_metadata()["resourceVersion"] == at_rest["resourceVersion"],
            10,
            0.5,
            "a shard wrote to a waiting replay at rest",
        )

        kube_api.client.delete(replay_path(SECOND, "waiting"))
        eventually(lambda: gone(kube_api.client, replay_path(SECOND, "waiting")), message="never deleted")
        kube_api.client.delete(replay_path(OWNER, "ended"))
        eventually(lambda: gone(kube_api.client, replay_path(OWNER, "ended")), message="the old finalizer held it")
    finally:
        for shard in shards:
            shard.stop()


def test_an_owner_deleted_while_sharding_was_turned_on_still_releases_its_claim(
    kube_api: EmulatedApi,
    secrets: str,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    tmp_path: pathlib.Path,
) -> None:
    unsharded = OperatorProcess(kube_api.kubeconfig, tmp_path / "unsharded.log", resync_seconds=RESYNC, webhook=False)
    unsharded.start()
    try:
        create(kube_api, OWNER, owner_body())
        eventually(lambda: ready(kube_api, OWNER).get("status") == "True", message="the owner never became Ready")
        create(kube_api, SECOND, second_body())
        eventually(lambda: refused_naming(kube_api, SECOND, "shop/billing"), message="the second was not refused")
    finally:
        unsharded.stop()
    assert kube_api.client.get(ces_path(OWNER))["metadata"]["finalizers"] == [FINALIZER]
    kube_api.client.delete(ces_path(OWNER))  # while no operator runs: held by the finalizer of one shard

    shards = start_two_shards(kube_api, tmp_path)
    try:
        eventually(lambda: gone(kube_api.client, ces_path(OWNER)), message="the old finalizer held the deletion")
        eventually(lambda: ready(kube_api, SECOND).get("status") == "True", message="the claim was never released")
    finally:
        for shard in shards:
            shard.stop()
