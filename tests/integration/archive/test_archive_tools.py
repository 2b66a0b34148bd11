"""`celery-event-operator archive list | replay | purge` against a real RabbitMQ."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from amqp import serialization
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.archive.messages import Selection
from celery_event_operator.core.topology import plan
from tests.conftest import create_broker_secret
from tests.support import raw_headers
from tests.support.kube import EmulatedApi, eventually

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

CREATED, CANCELLED = "orders.order.created", "orders.order.cancelled"
SPEC = {
    "broker": {"secretRef": {"name": "rabbitmq"}},
    "retry": {"maxRetries": 2},
    "events": {"handlers": [{"name": CREATED}, {"name": CANCELLED}]},
}


def cli(*args: str, env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_event_operator.cli", "archive", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=check,
        env=env,
    )


def archived_message(event: str, archived_at: float, order_id: int) -> tuple[str, amqp.Message]:
    """An archived Celery task message (its task id, the message) as the worker's archiving writes it."""
    task_id = str(uuid.uuid4())
    headers = {
        "lang": "py",
        "task": event,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "retries": 3,
        naming.EXCEPTION_TYPE_HEADER: "ValueError",
        naming.EXCEPTION_HEADER: f"ValueError: order {order_id}",
        naming.ARCHIVED_AT_HEADER: archived_at,
    }
    body = json.dumps([[order_id], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
    message = amqp.Message(
        body, content_type="application/json", content_encoding="utf-8", application_headers=headers, delivery_mode=2
    )
    return task_id, message


def archive_task(channel: Any, order_id: int, event: str, archived_at: float = 1_700_000_000.0) -> str:
    task_id, message = archived_message(event, archived_at, order_id)
    channel.basic_publish_confirm(message, exchange=naming.archive_name("billing"), routing_key=event)
    return task_id


@pytest.fixture
def archive(test_vhost_url: str) -> Iterator[dict[str, list[str]]]:
    """1,000 archived events: 300 of orders.order.created, 700 of orders.order.cancelled."""
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(SPEC)))
        channel = connection.channel()
        ids: dict[str, list[str]] = {CREATED: [], CANCELLED: [], "all": []}
        for order_id in range(1000):
            event = CREATED if order_id % 10 < 3 else CANCELLED
            task_id = archive_task(channel, order_id, event)
            ids[event].append(task_id)
            ids["all"].append(task_id)
        yield ids


def depth(url: str, queue: str) -> int:
    with Connection(url) as connection:
        count: int = connection.channel().queue_declare(queue, passive=True).message_count
        return count


def drain(url: str, queue: str) -> list[amqp.Message]:
    with Connection(url) as connection:
        channel = connection.channel()
        found = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            found.append(message)
        return found


def listed(url: str, *extra: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(cli("list", "billing", "--broker-url", url, "--json", *extra).stdout)
    return rows


def test_list_twice_shows_the_same_messages_in_the_same_order(
    archive: dict[str, list[str]], test_vhost_url: str
) -> None:
    with Connection(test_vhost_url) as connection:
        channel = connection.channel()
        channel.basic_publish(
            amqp.Message(b"\x00\x01 not json", content_type="application/octet-stream"),
            exchange="billing:archived",
            routing_key=CREATED,
        )
        channel.basic_publish(
            amqp.Message('{"id": "raw-1", "order": 5}', content_type="application/json"),
            exchange="billing:archived",
            routing_key=CANCELLED,
        )
    first, second = listed(test_vhost_url), listed(test_vhost_url)
    assert [row["task_id"] for row in first] == [row["task_id"] for row in second]
    assert len(first) == 1002
    assert depth(test_vhost_url, "billing:archived") == 1002, "listing changed nothing"
    assert [row["task_id"] for row in first[:1000]] == archive["all"], "oldest first, as archived"
    assert (first[0]["kind"], first[0]["attempts"], first[0]["exception"]) == ("celery", 3, "ValueError: order 0")
    assert [row["kind"] for row in first[-2:]] == ["unparseable", "json"]
    assert listed(test_vhost_url, "--event", CREATED)[0]["event"] == CREATED
    assert len(listed(test_vhost_url, "--event", CREATED)) == 301
    table = cli("list", "billing", "--broker-url", test_vhost_url).stdout
    assert "guest" not in table


def test_replay_sends_exactly_the_selected_events_back_once(archive: dict[str, list[str]], test_vhost_url: str) -> None:
    dry = cli("replay", "billing", "--broker-url", test_vhost_url, "--event", CREATED, "--dry-run").stdout
    assert "would replay 300 of 300" in dry
    assert depth(test_vhost_url, "billing.orders.order.created") == 0

    done = cli("replay", "billing", "--broker-url", test_vhost_url, "--event", CREATED).stdout
    assert "replayed 300 of 300 matching (1000 archived) to billing:recover; 700 stay archived" in done
    replayed = drain(test_vhost_url, "billing.orders.order.created")
    assert sorted(m.headers["id"] for m in replayed) == sorted(archive[CREATED])
    assert {m.headers["retries"] for m in replayed} == {0}, "attempt count reset"
    assert not any(naming.EXCEPTION_HEADER in m.headers for m in replayed)
    assert {m.delivery_info["routing_key"] for m in replayed} == {CREATED}
    assert depth(test_vhost_url, "billing.orders.order.cancelled") == 0, "only the selected event"
    assert [row["task_id"] for row in listed(test_vhost_url)] == archive[CANCELLED], "the rest stays, in order"


def test_replay_killed_half_way_loses_nothing(archive: dict[str, list[str]], test_vhost_url: str) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery_event_operator.cli",
            "archive",
            "replay",
            "billing",
            "--broker-url",
            test_vhost_url,
            "--event",
            CREATED,
            "--rate",
            "50",  # 60 → 300 replayed takes ~5 s: the kill lands in the middle even on a busy machine
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    eventually(lambda: depth(test_vhost_url, "billing.orders.order.created") >= 60, timeout=30)
    process.send_signal(signal.SIGKILL)
    process.wait(10)

    handler_ids = [m.headers["id"] for m in drain(test_vhost_url, "billing.orders.order.created")]
    archived_ids = [row["task_id"] for row in listed(test_vhost_url)]
    everything = archive[CREATED] + archive[CANCELLED]
    assert set(handler_ids) | set(archived_ids) == set(everything), "each message archived or replayed"
    in_both = set(handler_ids) & set(archived_ids)
    # A kill between a batch's confirm and its acknowledgements leaves that batch both: at most CONFIRM_BATCH (how
    # many its age bound holds depends on the machine's speed, not on the rate asked).
    in_flight = operations.CONFIRM_BATCH
    assert len(in_both) <= in_flight, "at most the batch in flight is both"
    assert 60 <= len(handler_ids) < 300

    cli("replay", "billing", "--broker-url", test_vhost_url, "--event", CREATED)
    second = [m.headers["id"] for m in drain(test_vhost_url, "billing.orders.order.created")]
    replays = Counter(handler_ids + second)
    assert set(replays) == set(archive[CREATED])
    assert sum(count - 1 for count in replays.values()) <= in_flight


def test_purge(archive: dict[str, list[str]], test_vhost_url: str) -> None:
    refused = cli("purge", "billing", "--broker-url", test_vhost_url, check=False)
    assert refused.returncode == 2
    assert depth(test_vhost_url, "billing:archived") == 1000
    assert (
        "purged 300 of 1000"
        in cli("purge", "billing", "--broker-url", test_vhost_url, "--event", CREATED, "--yes").stdout
    )
    assert [row["task_id"] for row in listed(test_vhost_url)] == archive[CANCELLED]
    assert "purged 700 of 700" in cli("purge", "billing", "--broker-url", test_vhost_url, "--yes").stdout


def test_connection_through_the_resource_and_its_secret(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], archive: dict[str, list[str]], test_vhost_url: str
) -> None:
    create_broker_secret(kube_api, test_vhost_url, namespace="shop")
    kube_api.client.create(
        "/apis/celeryevents.io/v1alpha1/namespaces/shop/celeryeventservices",
        {
            "apiVersion": "celeryevents.io/v1alpha1",
            "kind": "CeleryEventService",
            "metadata": {"name": "billing-resource"},
            "spec": {**SPEC, "serviceName": "billing"},
        },
    )
    env = {**os.environ, "KUBECONFIG": str(kube_api.kubeconfig)}
    result = cli("list", "billing-resource", "-n", "shop", "--event", CANCELLED, env=env)
    assert len(result.stdout.splitlines()) == 701
    assert "guest:guest" not in result.stdout + result.stderr
    missing = cli("list", "nope", "-n", "shop", env=env, check=False)
    assert missing.returncode == 1
    assert "nope" in missing.stderr


def test_an_empty_archive_and_a_filter_matching_nothing_list_cleanly(test_vhost_url: str) -> None:
    """Issue #16: both crashed with a TypeError (dev mode's archive is empty at first)."""
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(SPEC)))
    empty = cli("list", "billing", "--broker-url", test_vhost_url)
    assert empty.stdout.split() == ["#", "EVENT", "TASK", "ID", "ATTEMPTS", "AGE", "EXCEPTION", "CONTENT"]
    assert "no archived events of billing match" in empty.stderr
    assert json.loads(cli("list", "billing", "--broker-url", test_vhost_url, "--json").stdout) == []


def test_a_filter_matching_nothing(archive: dict[str, list[str]], test_vhost_url: str) -> None:
    result = cli("list", "billing", "--broker-url", test_vhost_url, "--event", "no.such.event")
    assert "Traceback" not in result.stderr
    assert "no archived events of billing match" in result.stderr


def test_a_missing_archive_queue_is_one_line_not_a_traceback(test_vhost_url: str) -> None:
    result = cli("list", "ghost", "--broker-url", test_vhost_url, check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("error: there is no archive queue 'ghost:archived'")
    assert "Traceback" not in result.stderr


def test_a_reader_that_goes_away_ends_the_listing_quietly(archive: dict[str, list[str]], test_vhost_url: str) -> None:
    """`archive list --json | head` ended in a BrokenPipeError traceback."""
    piped = subprocess.run(
        f"{sys.executable} -m celery_event_operator.cli archive list billing --broker-url '{test_vhost_url}' --json"
        " | head -n 3",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert len(piped.stdout.splitlines()) == 3
    assert "Traceback" not in piped.stderr
    assert "BrokenPipe" not in piped.stderr


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_a_count_begun_just_after_a_walk_sees_the_whole_archive(test_vhost_url: str, queue_type: str) -> None:
    """The broker puts back what a walk held a moment after its channel closed (a quorum archive of 20,000 was empty
    just after): a count begun then saw part of the archive, or none of it, as all there was — and a replay that
    trusted it ended `Replayed` with nothing moved."""
    spec = {**SPEC, "queueType": queue_type, "archive": {"maxLength": 20_000}}
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(spec)))
        channel = connection.channel()
        for order_id in range(5000):
            event = CREATED if order_id % 10 < 3 else CANCELLED
            headers = {"task": event, "id": str(order_id), naming.ARCHIVED_AT_HEADER: 1_700_000_000.0}
            message = amqp.Message("[[], {}, {}]", application_headers=headers, delivery_mode=2)
            channel.basic_publish(message, exchange=naming.archive_name("billing"), routing_key=event)
        eventually(lambda: depth(test_vhost_url, naming.archive_name("billing")) == 5000, timeout=30)
        created = Selection(events=frozenset({CREATED}))
        counts = [operations.survey(connection, "billing", created) for _ in range(6)]
    assert [(count.archived, count.matched) for count in counts] == [(5000, 1500)] * 6


def test_messages_a_producer_planted_are_listed_replayed_and_purged_like_any_other(test_vhost_url: str) -> None:
    """Each of these raised out of the walk, which put the message back: every later list, replay and purge stopped at
    it again (issue 40, finding 3; the last one: py-amqp hands over a body decoded with its content_encoding). A
    retries header of +Infinity is described too (tests/unit/archive), but RabbitMQ 3.10 refuses to route it (541)."""
    task = {"task": CREATED, "id": "hostile", "retries": 1}
    planted = [
        amqp.Message(b"[" * 100_000 + b"]" * 100_000, content_type="application/json"),
        amqp.Message(b"[5, {}, {}]", application_headers=task),
        amqp.Message(b"[[], [1], {}]", application_headers=task),
        amqp.Message(b"[[], {}, {}]", application_headers={**task, "x-death": "x"}),
        amqp.Message(b"\\ud800", content_encoding="unicode_escape"),
    ]
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(SPEC)))
        channel = connection.channel()
        good = archive_task(channel, 1, CREATED)
        for message in planted:
            channel.basic_publish_confirm(message, exchange=naming.archive_name("billing"), routing_key=CREATED)
        last = archive_task(channel, 2, CREATED)
    rows = listed(test_vhost_url)
    assert [row["task_id"] for row in rows[:1] + rows[-1:]] == [good, last]
    assert "nested too deep to read" in rows[1]["summary"]
    assert "unreadable arguments" in rows[2]["summary"]
    assert rows[4]["exception"] == "unreadable x-death header"
    table = cli("list", "billing", "--broker-url", test_vhost_url)
    assert len(table.stdout.splitlines()) == 1 + 2 + len(planted)
    done = cli("replay", "billing", "--broker-url", test_vhost_url, "--event", CREATED).stdout
    assert f"replayed {2 + len(planted)} of {2 + len(planted)}" in done
    replayed = drain(test_vhost_url, "billing.orders.order.created")
    # the producer's bytes under its encoding (decoded here as py-amqp decodes it for the walk)
    assert (replayed[-2].body, replayed[-2].properties["content_encoding"]) == ("\ud800", "unicode_escape")
    assert depth(test_vhost_url, "billing:archived") == 0


def plant_undecodable_headers(url: str, task_id: str, order_id: int) -> None:
    """A task message (of CREATED) whose headers py-amqp's own decoder raises on, as any AMQP client can archive it."""
    body, headers = raw_headers.task_message(CREATED, task_id, [order_id])
    deep = raw_headers.nested_item("deep", 3000)
    raw_headers.publish(url, naming.archive_name("billing"), CREATED, body, headers, raw_headers.OUT_OF_RANGE, deep)


def test_headers_py_amqp_raised_on_are_listed_replayed_and_purged_with_their_bytes(
    test_vhost_url: str, queue_type: str
) -> None:
    """A timestamp after year 9999 (or a table nested 3,000 deep) in an archived message's headers raised out of
    py-amqp's decoder in the walk's drain_events (the walk CeleryEventReplay uses too): `archive list` and `replay`
    failed with 'cannot reach the broker' (UnexpectedFrame, the OSError's aftermath), and each replay published again
    a copy of what came before it, which stayed archived. A quorum handler queue archived such a message by itself
    (its delivery limit, the worker failing on it). Now it is described, replayed with the header's bytes as they were,
    and purged (amqp_tables)."""
    with Connection(test_vhost_url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec({**SPEC, "queueType": queue_type})))
        good = archive_task(connection.channel(), 1, CREATED)
    plant_undecodable_headers(test_vhost_url, "hostile", 5)
    with Connection(test_vhost_url) as connection:
        last = archive_task(connection.channel(), 2, CREATED)
    rows = listed(test_vhost_url)
    assert [row["task_id"] for row in rows] == [good, "hostile", last]
    assert (rows[1]["kind"], rows[1]["summary"]) == ("celery", f"{CREATED}(5)")

    done = cli("replay", "billing", "--broker-url", test_vhost_url, "--event", CREATED).stdout
    assert "replayed 3 of 3" in done
    replayed = drain(test_vhost_url, "billing.orders.order.created")
    assert [message.headers["id"] for message in replayed] == [good, "hostile", last], "each once, in order"
    kept = {key: replayed[1].headers[key] for key in [*raw_headers.OUT_OF_RANGE, "deep"]}
    deep = raw_headers.nested_item("deep", 3000)
    assert serialization.dumps("F", [kept]) == raw_headers.headers_table({}, raw_headers.OUT_OF_RANGE, deep)
    assert all(isinstance(kept[key], amqp_tables.OutOfRangeTimestamp) for key in raw_headers.OUT_OF_RANGE)
    assert depth(test_vhost_url, "billing:archived") == 0

    plant_undecodable_headers(test_vhost_url, "hostile-again", 6)
    purged = cli("purge", "billing", "--broker-url", test_vhost_url, "--event", CREATED, "--yes").stdout
    assert "purged 1 of 1" in purged
    assert depth(test_vhost_url, "billing:archived") == 0
