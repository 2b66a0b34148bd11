"""A replay's status says only what happened on the broker (issue 31): a reader holding part of the archive makes it
wait and say so (never `Replayed` while selected events stay archived, not even when it resumes after a SIGKILL);
a replay whose service is deleted stops and says so; two resources on one archive (same serviceName, same vhost)
never replay it at once. Real operator on the emulated API, real RabbitMQ, real archived Celery messages."""

from __future__ import annotations

import contextlib
import pathlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from tests.conftest import create_broker_secret
from tests.integration.archive.test_archive_tools import depth, drain
from tests.integration.replay.test_replay_resource import (
    CANCELLED,
    CREATED,
    SERVICES,
    archive,
    archived_ids,
    create_replay,
    create_service,
    ended,
    events_of,
    ready,
    replay_status,
    succeeded,
)
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import eventually_equal, stays

COUNTS = ("matched", "replayed", "skipped", "remaining")


@contextlib.contextmanager
def reader_holding(url: str, count: int) -> Iterator[list[str]]:
    """What `archive list` does while it reads: the first `count` archived messages taken, not acknowledged, held
    until the block ends (then the broker puts them back where they were). Their task ids."""
    with Connection(url) as connection:
        channel = connection.channel()
        held = []
        for _ in range(count):
            message = channel.basic_get("billing:archived", no_ack=False)
            assert message is not None
            held.append(message.headers["id"])
        try:
            yield held
        finally:
            channel.close()


def counts(status: dict[str, Any]) -> tuple[int, ...]:
    return tuple(status.get(key) for key in COUNTS)


def test_a_replay_waits_while_a_reader_holds_part_of_the_archive(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(test_vhost_url, {CREATED: 1000, CANCELLED: 600})
        with reader_holding(test_vhost_url, 800) as held:
            assert any(task_id in set(ids[CREATED]) for task_id in held)
            create_replay(kube_api, "created", filter={"events": [CREATED]})
            eventually(
                lambda: succeeded(kube_api, "created").get("reason") == "ArchiveInUse",
                timeout=30,
                interval=0.3,
                message="the replay did not say that the archive is in use",
            )
            assert "800" in succeeded(kube_api, "created")["message"], succeeded(kube_api, "created")
            stays(
                lambda: succeeded(kube_api, "created").get("status") == "Unknown",
                4,
                message="the replay ended while a reader held part of the archive",
            )
        status = ended(kube_api, "created", timeout=60)
        log = operator.log()
    finally:
        operator.stop()

    assert succeeded(kube_api, "created")["reason"] == "Replayed", status
    assert counts(status) == (1000, 1000, 0, 0)
    assert Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")) == Counter(ids[CREATED])
    assert archived_ids(test_vhost_url) == [i for i in ids["all"] if i in set(ids[CANCELLED])], "order kept"
    eventually_equal(
        lambda: Counter(event["reason"] for event in events_of(kube_api, "created")),
        Counter({"ArchiveInUse": 1, "Started": 1, "Replayed": 1}),
    )
    assert "Traceback" not in log


def test_a_resumed_replay_counts_only_what_it_moved_while_a_reader_holds_the_archive(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """The issue's case: SIGKILL mid-way, a reader takes part of the archive, the next operator resumes. It must not
    count what the reader holds as replayed; it waits, then finishes with counts that add up on the broker."""
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-0.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(test_vhost_url, {CREATED: 2000})
        # Slow enough that the kill lands before half moved, however late a loaded machine reads the status.
        create_replay(kube_api, "everything", ratePerSecond=100)
        eventually(
            lambda: (replay_status(kube_api, "everything").get("replayed") or 0) >= 400,
            timeout=60,
            interval=0.2,
            message="the replay did not get going",
        )
        assert operator.process is not None
        operator.process.kill()  # SIGKILL
        operator.process.wait(10)
        operator.stop()
        eventually(
            lambda: depth(test_vhost_url, "billing:archived") >= 1000,
            timeout=10,
            message="the killed operator's held messages did not come back",
        )
        with reader_holding(test_vhost_url, 1000):
            operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-1.log").start()
            eventually(
                lambda: succeeded(kube_api, "everything").get("reason") == "ArchiveInUse",
                timeout=30,
                interval=0.3,
                message="the resumed replay did not say that the archive is in use",
            )
            stays(
                lambda: succeeded(kube_api, "everything").get("status") == "Unknown",
                4,
                message="the resumed replay ended while a reader held part of the archive",
            )
        status = ended(kube_api, "everything", timeout=60)
    finally:
        operator.stop()

    assert succeeded(kube_api, "everything")["reason"] == "Replayed", status
    copies = Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}"))
    assert set(copies) == set(ids[CREATED]), "0 lost"
    # A kill between a batch's confirm and its acknowledgements leaves that batch both archived and replayed: at most
    # CONFIRM_BATCH (how many its age bound holds depends on the machine's speed, not on the rate asked).
    assert sum(count - 1 for count in copies.values()) <= operations.CONFIRM_BATCH, "at most a batch twice"
    assert depth(test_vhost_url, "billing:archived") == 0
    assert counts(status) == (2000, 2000, 0, 0)


def test_a_replay_whose_service_is_deleted_stops_and_says_so(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(test_vhost_url, {CREATED: 3000})
        create_replay(kube_api, "everything", ratePerSecond=100)  # 30 s: the deletion comes well before the end
        eventually(
            lambda: (replay_status(kube_api, "everything").get("replayed") or 0) >= 300,
            timeout=60,
            interval=0.2,
            message="the replay did not get going",
        )
        kube_api.client.delete(f"{SERVICES.format(namespace='default')}/billing")  # deletionPolicy: retain
        status = ended(kube_api, "everything", timeout=30)
        log = operator.log()
    finally:
        operator.stop()

    condition = succeeded(kube_api, "everything")
    assert (condition["status"], condition["reason"]) == ("False", "ServiceDeleted"), condition
    left = archived_ids(test_vhost_url)
    moved = [m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")]
    assert sorted(left + moved) == sorted(ids[CREATED]), "each event archived or replayed, once: nothing lost"
    assert 300 <= len(moved) < 3000
    assert status["replayed"] == len(moved), "what it says it moved, it moved"
    assert status["matched"] == 3000
    assert status["replayed"] + status["remaining"] + status["skipped"] == 3000
    assert f"{len(left)} " in condition["message"], condition
    eventually_equal(
        lambda: [(e["type"], e["reason"]) for e in events_of(kube_api, "everything") if e["type"] == "Warning"],
        [("Warning", "ServiceDeleted")],
    )
    assert "Traceback" not in log


def test_two_resources_on_one_archive_never_replay_it_at_once(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """`billing` in namespaces default and shop, Secrets for the same vhost: one archive. The second resource does
    not own the name (ServiceNameConflict), so its replay waits and touches nothing while the owner's runs; once the
    owner is deleted (its topology retained) the second takes the name over and its replay runs — never both at
    once, each one's counts true."""
    for namespace in ("default", "shop"):
        create_broker_secret(kube_api, test_vhost_url, namespace=namespace)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(test_vhost_url, {CREATED: 400, CANCELLED: 400})
        create_replay(kube_api, "created", filter={"events": [CREATED]}, ratePerSecond=200)
        eventually(
            lambda: succeeded(kube_api, "created").get("reason") == "Running",
            timeout=30,
            interval=0.2,
            message="the first replay did not start",
        )
        create_service(kube_api, namespace="shop")
        eventually(
            lambda: condition(kube_api, "Ready", namespace="shop").get("reason") == "ServiceNameConflict",
            timeout=30,
            message="the second resource of one service name was not refused",
        )
        create_replay(kube_api, "cancelled", namespace="shop", filter={"events": [CANCELLED]}, ratePerSecond=200)
        waiting = eventually(
            lambda: (
                succeeded(kube_api, "cancelled", "shop").get("reason") == "ServiceNotReady"
                and succeeded(kube_api, "cancelled", "shop")
            ),
            timeout=30,
            interval=0.2,
            message="the replay of the refused resource did not wait",
        )
        assert "default/billing" in waiting["message"], waiting
        first = ended(kube_api, "created", timeout=60)
        assert succeeded(kube_api, "cancelled", "shop").get("reason") == "ServiceNotReady"
        assert depth(test_vhost_url, "billing:archived") == 400, "the waiting replay moved nothing"
        kube_api.client.delete(SERVICES.format(namespace="default") + "/billing")  # deletionPolicy retain
        ready(kube_api, namespace="shop")
        second = ended(kube_api, "cancelled", timeout=90, namespace="shop")
    finally:
        operator.stop()

    assert counts(first) == (400, 400, 0, 0), first
    assert counts(second) == (400, 400, 0, 0), second
    assert first["completionTime"] <= second["startTime"], "never at once"
    assert Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")) == Counter(ids[CREATED])
    assert Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CANCELLED}")) == Counter(ids[CANCELLED])
    assert depth(test_vhost_url, "billing:archived") == 0
