"""CeleryEventReplay run by the real operator (on the emulated API) against a real RabbitMQ, its replayed events
handled by real Celery workers configured by the operator's webhook (tests/support/workers.py: the kubelet is the
one stand-in)."""

from __future__ import annotations

import base64
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection

from celery_event_devcluster import jsonpatch
from celery_event_operator.adapters.archive import operations
from tests.conftest import create_broker_secret
from tests.integration.archive.test_archive_tools import archive_task, depth, drain
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, admission_review, worker_pod
from tests.support.waiting import eventually_equal, stays
from tests.support.workers import Worker, as_kubelet_would

APPS = pathlib.Path(__file__).resolve().parent / "apps"
CREATED, CANCELLED, SHIPPED = "orders.order.created", "orders.order.cancelled", "orders.order.shipped"
SERVICES = "/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices"
REPLAYS = "/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventreplays"


def service(name: str = "billing", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "retry": {"maxRetries": 2},
            "events": {"handlers": [{"name": CREATED}, {"name": CANCELLED}, {"name": SHIPPED}]},
            **spec,
        },
    }


def create_service(api: EmulatedApi, namespace: str = "default", **spec: Any) -> None:
    api.client.create(SERVICES.format(namespace=namespace), service(**spec))


def ready(api: EmulatedApi, namespace: str = "default") -> None:
    eventually(
        lambda: condition(api, "Ready", namespace=namespace).get("status") == "True",
        timeout=30,
        message="the service never became Ready",
    )


def create_replay(api: EmulatedApi, name: str, namespace: str = "default", **spec: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventReplay",
        "metadata": {"name": name},
        # action as an API server defaults it (the emulated API applies no schema defaults)
        "spec": {"serviceRef": {"name": "billing"}, "action": "replay", **spec},
    }
    created: dict[str, Any] = api.client.create(REPLAYS.format(namespace=namespace), body)
    return created


def replay_status(api: EmulatedApi, name: str, namespace: str = "default") -> dict[str, Any]:
    found: dict[str, Any] = api.client.get(f"{REPLAYS.format(namespace=namespace)}/{name}").get("status") or {}
    return found


def succeeded(api: EmulatedApi, name: str, namespace: str = "default") -> dict[str, Any]:
    return succeeded_in(replay_status(api, name, namespace))


def ended(api: EmulatedApi, name: str, timeout: float = 60, namespace: str = "default") -> dict[str, Any]:
    """The status once the replay ended. It fails when the status stood still for `timeout` seconds, or after ten
    times that in all: a replay that moves slowly on a loaded machine (its counters change every few seconds) is not
    stuck, one whose status stands still is."""
    deadline = time.monotonic() + 10 * timeout
    last, still_since = None, time.monotonic()
    while True:
        status = replay_status(api, name, namespace)
        if succeeded_in(status).get("status") in ("True", "False"):
            return status
        now = time.monotonic()
        if status != last:
            last, still_since = status, now
        if now - still_since > timeout or now > deadline:
            stood = f"stood still for {now - still_since:.0f}s" if now - still_since > timeout else "kept changing"
            raise AssertionError(f"replay {name} never ended: its status {stood}; last: {status}")
        time.sleep(0.5)


def succeeded_in(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions", []) if c["type"] == "Succeeded"), {})


def events_of(api: EmulatedApi, name: str, namespace: str = "default") -> list[dict[str, Any]]:
    items = api.client.get(f"/api/v1/namespaces/{namespace}/events").get("items") or []
    return [
        item
        for item in items
        if item["involvedObject"].get("kind") == "CeleryEventReplay" and item["involvedObject"].get("name") == name
    ]


def archive(url: str, kinds: dict[str, int]) -> dict[str, list[str]]:
    """`kinds[event]` archived events of each event, interleaved; their task ids by event, and all in order."""
    ids: dict[str, list[str]] = {event: [] for event in kinds}
    ids["all"] = []
    plan = [event for event, count in kinds.items() for _ in range(count)]
    order = sorted(range(len(plan)), key=lambda index: (index % 7, index))  # interleaved, deterministic
    with Connection(url) as connection:
        channel = connection.channel()
        for order_id, index in enumerate(order):
            event = plan[index]
            task_id = archive_task(channel, order_id, event)
            ids[event].append(task_id)
            ids["all"].append(task_id)
    return ids


def archived_ids(url: str) -> list[str]:
    """The task ids the archive holds, in order (taken without acknowledging: nothing changes)."""
    with Connection(url) as connection:
        channel = connection.channel()
        found = []
        while (message := channel.basic_get("billing:archived", no_ack=False)) is not None:
            found.append(message.headers["id"])
        channel.close()
        return found


@pytest.fixture
def operator_on_billing(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    """The operator, the broker Secret and the Ready service `billing` with its three handler queues."""
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    create_service(kube_api)
    ready(kube_api)
    yield operator
    operator.stop()


@pytest.fixture
def worker(
    operator_on_billing: OperatorProcess, kube_api: EmulatedApi, tmp_path: pathlib.Path
) -> Iterator[tuple[Worker, pathlib.Path]]:
    """A real Celery worker of `billing`, configured by what the webhook injected into its pod."""
    pod = worker_pod({"celeryevents.io/service": "billing"})
    response = operator_on_billing.admit(admission_review(pod))["response"]
    pod = jsonpatch.apply(pod, json.loads(base64.b64decode(response["patch"])))
    env = as_kubelet_would(pod, kube_api.client, tmp_path / "mounted-settings")
    log = tmp_path / "handled.jsonl"
    started = Worker(APPS, "shop_app", {**env, "HANDLER_LOG": str(log)}, tmp_path / "worker.log", "--pool=solo")
    yield started.start(), log
    started.stop()


def handled(log: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_filtered_rate_limited_replay_sends_exactly_its_events_to_the_workers(
    kube_api: EmulatedApi, worker: tuple[Worker, pathlib.Path], test_vhost_url: str
) -> None:
    _, log = worker
    ids = archive(test_vhost_url, {CREATED: 300, CANCELLED: 300, SHIPPED: 400})
    assert depth(test_vhost_url, "billing:archived") == 1000

    create_replay(kube_api, "retry-created", filter={"events": [CREATED]}, ratePerSecond=100)
    status = ended(kube_api, "retry-created")

    assert succeeded(kube_api, "retry-created")["reason"] == "Replayed", status
    assert {
        key: status.get(key) for key in ("serviceName", "archived", "matched", "replayed", "skipped", "remaining")
    } == {
        "serviceName": "billing",
        "archived": 1000,
        "matched": 300,
        "replayed": 300,
        "skipped": 0,
        "remaining": 0,
    }
    assert status["firstMessage"]["taskId"] == ids[CREATED][0]
    assert status["lastMessage"]["taskId"] == ids[CREATED][-1]
    assert status["firstMessage"]["event"] == CREATED
    assert status["firstMessage"]["exception"] == "ValueError", "the class, never the message (it may echo data)"
    took = _seconds(status["completionTime"]) - _seconds(status["startTime"])
    assert took >= 2, f"300 events at 100/s took {took} s"

    def all_handled() -> bool:
        return len(handled(log)) >= 300

    eventually(all_handled, timeout=60, interval=0.5, message="the workers did not handle the replayed events")
    stays(lambda: len(handled(log)) == 300, 2, message="more than the replayed events were handled")
    counted = Counter(record["task_id"] for record in handled(log))
    assert set(counted) == set(ids[CREATED]), "exactly the selected events"
    assert set(counted.values()) == {1}, "each once"
    assert {record["event"] for record in handled(log)} == {CREATED}
    remaining = [task_id for task_id in ids["all"] if task_id not in set(ids[CREATED])]
    assert archived_ids(test_vhost_url) == remaining, "the others stay archived, in order"

    eventually_equal(
        lambda: sorted(event["reason"] for event in events_of(kube_api, "retry-created")),
        ["Replayed", "Started"],
        message="one Event at start, one at the end",
    )
    listing = kube_api.kubectl("get", "cer").stdout.splitlines()
    assert listing[0].split() == [
        "NAME",
        "SERVICE",
        "ACTION",
        "SUCCEEDED",
        "REASON",
        "MATCHED",
        "REPLAYED",
        "REMAINING",
        "AGE",
    ]
    assert listing[1].split()[:8] == ["retry-created", "billing", "replay", "True", "Replayed", "300", "300", "0"]


def _seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_an_operator_killed_twice_during_a_replay_loses_nothing(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """SIGKILL twice mid-way through 5,000 events: each restart resumes where the replay was (a recount, not from
    the start); every event is replayed, at most one twice per kill, and the counts are exact."""
    create_broker_secret(kube_api, test_vhost_url)
    operator = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-0.log").start()
    try:
        create_service(kube_api)
        ready(kube_api)
        ids = archive(test_vhost_url, {CREATED: 5000})
        create_replay(kube_api, "everything", ratePerSecond=250)
        for kill, threshold in enumerate((1500, 3000), start=1):
            eventually(
                lambda threshold=threshold: (replay_status(kube_api, "everything").get("replayed") or 0) >= threshold,
                timeout=90,
                interval=0.2,
                message=f"the replay did not reach {threshold}",
            )
            assert succeeded(kube_api, "everything")["status"] == "Unknown", "killed mid-way, not after the end"
            assert operator.process is not None
            operator.process.kill()  # SIGKILL
            operator.process.wait(10)
            operator.stop()
            operator = OperatorProcess(kube_api.kubeconfig, tmp_path / f"operator-{kill}.log").start()
        status = ended(kube_api, "everything", timeout=120)
        resumed = operator.log()
    finally:
        operator.stop()

    assert succeeded(kube_api, "everything")["reason"] == "Replayed", status
    copies = Counter(message.headers["id"] for message in drain(test_vhost_url, f"billing.{CREATED}"))
    assert set(copies) == set(ids[CREATED]), "0 lost"
    # A kill between a batch's confirm and its acknowledgements leaves that batch both archived and replayed. The
    # batch is CONFIRM_BATCH at most: its age bound (CONFIRM_SECONDS) holds as many as the walk took meanwhile, which
    # a loaded machine makes more than the rate's share (a CI run: 17 a kill at 250/s, beside 12.5 in 50 ms).
    assert sum(count - 1 for count in copies.values()) <= 2 * operations.CONFIRM_BATCH, "at most a batch per kill"
    assert depth(test_vhost_url, "billing:archived") == 0
    assert (status["matched"], status["replayed"], status["remaining"], status["skipped"]) == (5000, 5000, 0, 0)
    assert "replay everything resumes: " in resumed
    eventually_equal(
        lambda: Counter(event["reason"] for event in events_of(kube_api, "everything")),
        Counter({"Started": 1, "Replayed": 1}),
        message="a resumed replay does not announce a second start",
    )


def test_refused_and_held_replays_touch_nothing(
    kube_api: EmulatedApi, operator_on_billing: OperatorProcess, test_vhost_url: str
) -> None:
    ids = archive(test_vhost_url, {CREATED: 200, CANCELLED: 100})
    kube_api.client.create(
        SERVICES.format(namespace="default"),
        {
            **service("broken"),
            "spec": {**service()["spec"], "serviceName": "broken", "broker": {"secretRef": {"name": "missing"}}},
        },
    )
    create_replay(kube_api, "slow", filter={"events": [CREATED]}, ratePerSecond=2)  # 100 s: still running at the end
    eventually(lambda: succeeded(kube_api, "slow").get("reason") == "Running", timeout=30, message="slow not running")
    create_replay(kube_api, "second", filter={"events": [CANCELLED]})
    create_replay(kube_api, "elsewhere", namespace="shop")
    create_replay(kube_api, "named-namespace", serviceRef={"name": "billing", "namespace": "default"})
    create_replay(kube_api, "unconfirmed", action="purge")
    create_replay(kube_api, "malformed", filter={"events": ["orders.*"], "olderThanSeconds": "1h"})
    create_replay(kube_api, "not-ready", serviceRef={"name": "broken"})

    held = {
        "second": ("default", "WaitingForReplay", "replay default/slow of the same archive (billing:archived at"),
        "elsewhere": ("shop", "ServiceNotFound", "no CeleryEventService billing in namespace shop"),
        "not-ready": ("default", "ServiceNotReady", "service broken is not Ready (BrokerSecretInvalid"),
    }
    refused = {
        "named-namespace": "a replay acts on a service of its own namespace",
        "unconfirmed": "a purge deletes archived events for good: set confirm: true",
        "malformed": "filter.events.0: String should match pattern",
    }
    for name, (namespace, reason, text) in held.items():
        eventually(
            lambda name=name, namespace=namespace, reason=reason: (
                succeeded(kube_api, name, namespace).get("reason") == reason
            ),
            timeout=30,
            message=f"{name} not held",
        )
        found = succeeded(kube_api, name, namespace)
        assert found["status"] == "Unknown"
        assert text in found["message"], found
    for name, text in refused.items():
        found = ended(kube_api, name)
        condition_ = succeeded(kube_api, name)
        assert (condition_["status"], condition_["reason"]) == ("False", "InvalidSpec")
        assert text in condition_["message"], condition_
        assert "startTime" not in found, "nothing started"
        eventually_equal(
            lambda: [(e["type"], e["reason"]) for e in events_of(kube_api, name)],  # noqa: B023 (polled at once)
            [("Warning", "InvalidSpec")],
        )

    stays(
        lambda: (
            all("startTime" not in replay_status(kube_api, name, namespace) for name, (namespace, *_) in held.items())
            and succeeded(kube_api, "slow")["status"] == "Unknown"
        ),
        3,
        message="a held replay started",
    )
    # The slow one deleted mid-way stops between two events; the one that waited goes next.
    kube_api.client.delete(f"{REPLAYS.format(namespace='default')}/slow")
    eventually(
        lambda: (
            "slow"
            not in [i["metadata"]["name"] for i in kube_api.client.get(REPLAYS.format(namespace="default"))["items"]]
        ),
        timeout=30,
        message="the running replay was not let go",
    )
    status = ended(kube_api, "second")
    assert (status["matched"], status["replayed"]) == (100, 100)
    left = archived_ids(test_vhost_url)
    created_replayed = [m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")]
    assert 0 < len(created_replayed) < 200, "the slow replay was stopped half-way"
    assert sorted(left + created_replayed) == sorted(ids[CREATED]), "each created event archived or replayed, once"
    assert Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CANCELLED}")) == Counter(ids[CANCELLED])
    assert operator_on_billing.alive()
    assert "Traceback" not in operator_on_billing.log()


def cli(kube_api: EmulatedApi, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_event_operator.cli", "archive", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "KUBECONFIG": str(kube_api.kubeconfig)},
    )


def test_the_command_line_goes_through_the_cluster(
    kube_api: EmulatedApi, operator_on_billing: OperatorProcess, test_vhost_url: str
) -> None:
    """`--via-cluster`: a resource the user's RBAC governs and the cluster keeps; no broker credentials needed."""
    ids = archive(test_vhost_url, {CREATED: 50, CANCELLED: 30, SHIPPED: 20})
    dry = cli(kube_api, "replay", "billing", "--via-cluster", "--event", SHIPPED, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would replay 20 of 20 selected archived events of billing; nothing was changed" in dry.stdout
    assert len([line for line in dry.stdout.splitlines() if SHIPPED in line]) == 20, "the preview"

    done = cli(kube_api, "replay", "billing", "--via-cluster", "--event", CREATED, "--rate", "100", "--limit", "40")
    assert done.returncode == 0, done.stderr
    assert "40 of 50 selected archived events of billing sent back to its handler queues; 10 skipped" in done.stdout
    assert "created CeleryEventReplay billing-replay-" in done.stderr
    assert "waiting:" not in done.stderr, "running, before it was counted too: not waiting"
    assert "guest" not in done.stdout + done.stderr
    assert [m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")] == ids[CREATED][:40]

    unconfirmed = cli(kube_api, "purge", "billing", "--via-cluster", "--event", CANCELLED)
    assert unconfirmed.returncode == 2
    purged = cli(kube_api, "purge", "billing", "--via-cluster", "--event", CANCELLED, "--yes")
    assert purged.returncode == 0, purged.stderr
    assert "30 of 30 selected archived events of billing purged from the archive" in purged.stdout
    assert archived_ids(test_vhost_url) == [i for i in ids["all"] if i in set(ids[CREATED][40:] + ids[SHIPPED])]

    bad = cli(kube_api, "replay", "billing", "--via-cluster", "--event", "orders.*")
    assert bad.returncode == 2
    assert "filter.events.0" in bad.stderr
    kept = kube_api.client.get(REPLAYS.format(namespace="default"))["items"]
    assert len(kept) == 3, "each run is kept as a record, the refused one was never created"
