"""Replays in the setups users run beside them (issue 31), each checked against the broker at the end — every copy in
the handler queues once, what stays archived, and matched/replayed/skipped/remaining and the Succeeded condition
agreeing with both: classic and quorum archives; events archived during the replay, also with an archived-at header
older than the replay's start (a worker whose clock is behind); another client holding part of the archive before
the replay, or taking part of it while a resumed replay counts; `archive list` during the move; the operator
SIGKILLed mid-move; two replays back to back; limit, dry run and purge. The real operator on the emulated API, real
RabbitMQ (written by a second pair of eyes as probes; each failed on the code it was written against, or guards
against a RabbitMQ bug: rabbitmq-server#10327)."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import pathlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.archive import operations
from celery_event_operator.core import naming
from celery_event_operator.core.archive.messages import Selection
from tests.conftest import create_broker_secret
from tests.integration.archive.test_archive_tools import archived_message, depth, drain
from tests.integration.replay.test_replay_honesty import counts, reader_holding
from tests.integration.replay.test_replay_resource import (
    CANCELLED,
    CREATED,
    archive,
    archived_ids,
    create_replay,
    create_service,
    ended,
    ready,
    replay_status,
    succeeded,
)
from tests.support.kube import EmulatedApi, eventually
from tests.support.operator_process import OperatorProcess

ARCHIVE = "billing:archived"
SKEWED_AT = 1_700_000_000.0  # an archived-at header long before any replay's start: a worker whose clock is behind


def publish(channel: Any, event: str, archived_at: float, order_id: int = 0) -> str:
    task_id, message = archived_message(event, archived_at, order_id)
    channel.basic_publish_confirm(message, exchange=naming.archive_name("billing"), routing_key=event)
    return task_id


def bulk_archive(url: str, kinds: dict[str, int]) -> dict[str, list[str]]:
    """As `archive`, faster (one confirm wait, for the last message): for archives large enough that a walk takes a
    while. Unconfirmed publishes carry no promise: on RabbitMQ 3.10, under CI's load, a quorum archive once stayed
    short of 6,000 for two minutes after the connection closed. The last one is confirmed (a channel's messages reach
    the one archive queue in order) and the connection stays open until the archive shows them all."""
    ids: dict[str, list[str]] = {event: [] for event in kinds}
    ids["all"] = []
    plan = [event for event, count in kinds.items() for _ in range(count)]
    order = sorted(range(len(plan)), key=lambda index: (index % 7, index))
    with Connection(url) as connection:
        channel = connection.default_channel
        for order_id, index in enumerate(order):
            event = plan[index]
            task_id, message = archived_message(event, SKEWED_AT, order_id)
            send = channel.basic_publish_confirm if order_id == len(order) - 1 else channel.basic_publish
            send(message, exchange=naming.archive_name("billing"), routing_key=event)
            ids[event].append(task_id)
            ids["all"].append(task_id)
        eventually(lambda: depth(url, ARCHIVE) == len(plan), timeout=120, message="the archive did not fill")
    return ids


class Arrivals:
    """New events archived all the time (every `interval` s) while the replay runs: one in two with an archived-at
    header before the replay's start (a clock-skewed worker), the others with the time now."""

    def __init__(self, url: str, interval: float = 0.01, skewed: bool = True) -> None:
        self.url, self.interval, self.with_skewed = url, interval, skewed
        self.skewed: list[str] = []
        self.current: list[str] = []
        self.archived_at: dict[str, float] = {}  # each current one's archived-at header
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Connection(self.url) as connection:
            channel = connection.channel()
            n = 0
            while not self._stop.is_set():
                if n % 2 and self.with_skewed:
                    self.skewed.append(publish(channel, CREATED, SKEWED_AT, n))
                else:
                    now = time.time()
                    self.current.append(publish(channel, CREATED, now, n))
                    self.archived_at[self.current[-1]] = now
                n += 1
                self._stop.wait(self.interval)

    def __enter__(self) -> Arrivals:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


class GrabOnWalk:
    """Another client that takes archived messages with basic.get (no consumer) as soon as a consumer appears on the
    archive (the replay's first walk), up to `up_to`, and holds them until released."""

    def __init__(self, url: str, up_to: int, after_consumers: int = 1) -> None:
        self.url, self.up_to, self.after = url, up_to, after_consumers
        self.held: list[str] = []
        self.grabbed_at: float | None = None
        self._release = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Connection(self.url) as connection:
            watch = connection.channel()
            grab = connection.channel()
            seen = 0
            previous = 0
            while not self._release.is_set():
                consumers = watch.queue_declare(ARCHIVE, passive=True).consumer_count
                if consumers and not previous:
                    seen += 1
                previous = consumers
                if seen >= self.after:
                    break
            self.grabbed_at = time.time()
            misses = 0
            while len(self.held) < self.up_to and misses < 50:
                message = grab.basic_get(ARCHIVE, no_ack=False)
                if message is None:
                    misses += 1
                    continue
                self.held.append(message.headers["id"])
            self._done.set()
            self._release.wait()
            grab.close()

    def start(self) -> GrabOnWalk:
        self._thread.start()
        return self

    def wait_grabbed(self, timeout: float) -> None:
        self._done.wait(timeout)

    def release(self) -> None:
        self._release.set()
        self._thread.join(10)


@pytest.fixture
def operator_process(
    kube_api: EmulatedApi,
    crd_installed: dict[str, Any],
    test_vhost_url: str,
    tmp_path: pathlib.Path,
    request: pytest.FixtureRequest,
) -> Iterator[list[OperatorProcess]]:
    create_broker_secret(kube_api, test_vhost_url)
    started = [OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-0.log").start()]
    yield started
    started[-1].stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:  # what each operator did, without the libraries' debug lines
        for process in started:
            # The operator's own debug lines stay (what each replay observed and did); the libraries' go.
            said = [
                line
                for line in process.log().splitlines()
                if ("[DEBUG" not in line or "] celery_event_operato" in line) and "aiohttp.access" not in line
            ]
            print(f"--- {process.log_path.name} ---\n" + "\n".join(said[-300:]))


def audit(
    url: str, status: dict[str, Any], condition: dict[str, Any], taken: list[str], handler: str = f"billing.{CREATED}"
) -> dict[str, Any]:
    """What the broker shows against what status says."""
    copies = Counter(m.headers["id"] for m in drain(url, handler))
    left = archived_ids(url)
    return {
        "condition": (condition.get("status"), condition.get("reason"), condition.get("message")),
        "status": {k: status.get(k) for k in ("archived", "matched", "replayed", "purged", "skipped", "remaining")},
        "copies": sum(copies.values()),
        "distinct_copies": len(copies),
        "doubled": sum(c - 1 for c in copies.values()),
        "taken_originals_copied": sum(1 for i in taken if i in copies),
        "taken_originals_left": sum(1 for i in set(left) if i in set(taken)),
        "archived_left": len(left),
        "_copies": copies,
        "_left": left,
    }


def shown(facts: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in facts.items() if not k.startswith("_")}


# --- arrivals, some clock-skewed, during the move ---------------------------------------------------------------


@pytest.mark.parametrize("skewed", [True, False], ids=["skewed", "current"])
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_arrivals_during_the_move_counts_add_up(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, queue_type: str, skewed: bool
) -> None:
    create_service(kube_api, queueType=queue_type, archive={"maxLength": 100_000})
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 1500})
    samples: list[tuple[float, Any, Any, Any]] = []
    began = time.monotonic()
    with Arrivals(test_vhost_url, skewed=skewed) as arrivals:
        create_replay(kube_api, "everything", ratePerSecond=300)  # ~5 s of move
        while time.monotonic() - began < 40:
            now = replay_status(kube_api, "everything")
            condition = succeeded(kube_api, "everything")
            samples.append(
                (round(time.monotonic() - began, 1), now.get("replayed"), now.get("remaining"), condition.get("reason"))
            )
            if condition.get("status") in ("True", "False"):
                break
            time.sleep(0.3)
    ended_while_arriving = samples[-1][3]
    went_down = [(a, b) for a, b in itertools.pairwise(samples) if (a[1] or 0) > (b[1] or 0)]
    print("samples", samples[::5], "last", samples[-1])
    print("replayed went down:", went_down[:5])
    status = ended(kube_api, "everything", timeout=90)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "everything"), ids[CREATED])
    skewed_copied = sum(1 for i in arrivals.skewed if i in facts["_copies"])
    skewed_left = sum(1 for i in arrivals.skewed if i in set(facts["_left"]))
    # The replay takes what its header says was archived before status.startTime (an arrival of that second's
    # first moment, before the replay counted, is one of them): none after.
    start = datetime.datetime.fromisoformat(status["startTime"].replace("Z", "+00:00")).timestamp()
    current_copied = sum(1 for i in arrivals.current if i in facts["_copies"] and arrivals.archived_at[i] >= start)
    facts |= {
        "skewed_arrivals": len(arrivals.skewed),
        "skewed_copied": skewed_copied,
        "skewed_left": skewed_left,
        "current_arrivals": len(arrivals.current),
        "current_copied": current_copied,
    }
    facts["ended_while_arriving"] = ended_while_arriving
    print(shown(facts))
    assert not went_down, ("status.replayed went down while the replay ran", went_down[:5])
    assert facts["condition"][1] == "Replayed", shown(facts)
    assert facts["taken_originals_copied"] == 1500, shown(facts)
    assert facts["taken_originals_left"] == 0, shown(facts)
    assert facts["doubled"] == 0, shown(facts)
    assert current_copied == 0, "an event archived after status.startTime (its header says so) was replayed"
    assert status["replayed"] == facts["copies"], ("replayed says other than the copies made", shown(facts))
    assert status["matched"] == status["replayed"] + status["skipped"] + status["remaining"], shown(facts)


# --- another client grabs part of the archive while the replay's first count walks it --------------------------


# --- a reader holding part of the archive before the replay, on quorum, released before / after -------------------


@pytest.mark.parametrize("release", ["before_end", "after_end"])
def test_quorum_reader_before_the_replay(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, release: str
) -> None:
    create_service(kube_api, queueType="quorum")
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 1000, CANCELLED: 600})
    with reader_holding(test_vhost_url, 800) as reader_held:
        create_replay(kube_api, "created", filter={"events": [CREATED]})
        eventually(
            lambda: succeeded(kube_api, "created").get("reason") == "ArchiveInUse",
            timeout=30,
            interval=0.3,
            message="the replay did not say that the archive is in use",
        )
        if release == "after_end":
            with contextlib.suppress(AssertionError):
                eventually(
                    lambda: succeeded(kube_api, "created").get("status") in ("True", "False"), timeout=20, interval=0.5
                )
        held_then = dict(succeeded(kube_api, "created"))
    status = ended(kube_api, "created", timeout=60)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "created"), ids[CREATED])
    facts["while_held"] = (held_then.get("status"), held_then.get("reason"))
    created_left = [i for i in facts["_left"] if i in set(ids[CREATED])]
    facts["created_left_positions"] = [ids["all"].index(i) for i in created_left]
    facts["created_left_held_by_reader"] = sum(1 for i in created_left if i in set(reader_held))
    print(shown(facts))
    assert held_then.get("status") == "Unknown", shown(facts)
    assert facts["condition"][1] == "Replayed", shown(facts)
    assert facts["taken_originals_copied"] == 1000, shown(facts)
    assert facts["doubled"] == 0, shown(facts)
    assert not created_left, ("replayed, and still archived", shown(facts))
    # The order of what stays is RabbitMQ's after another client's basic.get on a quorum queue: compared as a set.
    assert sorted(facts["_left"]) == sorted(ids[CANCELLED]), shown(facts)
    assert counts(status) == (1000, 1000, 0, 0), shown(facts)


# --- a basic.get client that starts during the move and holds what it gets --------------------------------------


# --- `archive list` (a consumer) during the move --------------------------------------------------------------


def test_archive_list_during_the_move(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str
) -> None:
    create_service(kube_api, queueType="quorum")
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 1500, CANCELLED: 500})
    create_replay(kube_api, "created", filter={"events": [CREATED]}, ratePerSecond=300)
    eventually(lambda: (replay_status(kube_api, "created").get("replayed") or 0) >= 100, timeout=60, interval=0.1)
    listed = []
    with Connection(test_vhost_url) as connection:
        for _ in range(3):
            listed.append(len(operations.list_archive(connection, "billing", Selection()).items))
    status = ended(kube_api, "created", timeout=60)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "created"), ids[CREATED])
    facts["listed"] = listed
    print(shown(facts))
    assert facts["condition"][1] == "Replayed", shown(facts)
    assert facts["taken_originals_copied"] == 1500, shown(facts)
    assert facts["doubled"] == 0, shown(facts)
    assert facts["_left"] == [i for i in ids["all"] if i in set(ids[CANCELLED])], shown(facts)
    assert counts(status) == (1500, 1500, 0, 0), shown(facts)


# --- limit, dry run, purge on both queue types ------------------------------------------------------------------


@pytest.mark.every_broker  # what a purge and a limited walk leave depends on the broker's acknowledgements
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_limit_dry_run_and_purge(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, queue_type: str
) -> None:
    create_service(kube_api, queueType=queue_type)
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 700, CANCELLED: 300})
    create_replay(kube_api, "dry", filter={"events": [CREATED]}, dryRun=True)
    dry = ended(kube_api, "dry")
    assert succeeded(kube_api, "dry")["reason"] == "DryRun", dry
    assert (dry["matched"], dry.get("replayed"), dry["remaining"]) == (700, 0, 0), dry
    assert depth(test_vhost_url, ARCHIVE) == 1000

    create_replay(kube_api, "limited", filter={"events": [CREATED]}, limit=250)
    limited = ended(kube_api, "limited")
    copies = [m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")]
    assert copies == ids[CREATED][:250], (len(copies), limited)
    assert counts(limited) == (700, 250, 450, 0), limited

    create_replay(kube_api, "purge", action="purge", confirm=True, filter={"events": [CANCELLED]})
    purged = ended(kube_api, "purge")
    assert succeeded(kube_api, "purge")["reason"] == "Purged", purged
    assert (purged["matched"], purged["purged"], purged["skipped"], purged["remaining"]) == (300, 300, 0, 0), purged
    left = peek(test_vhost_url)
    purged_but_archived = [i for i in left if i in set(ids[CANCELLED])]
    replayed_but_archived = [i for i in left if i in set(ids[CREATED][:250])]
    assert not purged_but_archived, (f"{len(purged_but_archived)} purged events still archived", purged, len(left))
    assert not replayed_but_archived, (f"{len(replayed_but_archived)} replayed events still archived", len(left))
    assert sorted(left) == sorted(ids[CREATED][250:])

    create_replay(kube_api, "rest", filter={"events": [CREATED]})
    rest = ended(kube_api, "rest")
    copies = [m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}")]
    assert sorted(copies) == sorted(ids[CREATED][250:]), len(copies)  # the order is RabbitMQ's after peek on quorum
    assert counts(rest) == (450, 450, 0, 0), rest
    assert depth(test_vhost_url, ARCHIVE) == 0


# --- SIGKILL mid-move on quorum, resumed ----------------------------------------------------------------------


def test_quorum_operator_killed_mid_move_resumes_honestly(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    create_service(kube_api, queueType="quorum")
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 3000, CANCELLED: 1000})
    create_replay(kube_api, "created", filter={"events": [CREATED]}, ratePerSecond=250)
    eventually(lambda: (replay_status(kube_api, "created").get("replayed") or 0) >= 800, timeout=60, interval=0.2)
    process = operator_process[-1].process
    assert process is not None
    process.kill()
    process.wait(10)
    operator_process[-1].stop()
    operator_process.append(OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-1.log").start())
    status = ended(kube_api, "created", timeout=120)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "created"), ids[CREATED])
    print(shown(facts))
    assert facts["condition"][1] == "Replayed", shown(facts)
    assert facts["distinct_copies"] == 3000, shown(facts)
    assert facts["taken_originals_left"] == 0, shown(facts)
    assert facts["doubled"] <= operations.CONFIRM_BATCH, shown(facts)
    assert facts["_left"] == [i for i in ids["all"] if i in set(ids[CANCELLED])], "order kept"
    assert counts(status) == (3000, 3000, 0, 0), shown(facts)


# --- two replays of one archive back to back --------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_two_replays_back_to_back(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, queue_type: str
) -> None:
    """The second waits for the first's slot and starts right after its walk let go (the same process: LET_GO)."""
    create_service(kube_api, queueType=queue_type, archive={"maxLength": 100_000})
    ready(kube_api)
    ids = bulk_archive(test_vhost_url, {CREATED: 3000, CANCELLED: 3000})
    create_replay(kube_api, "first", filter={"events": [CREATED]}, ratePerSecond=1000)
    eventually(lambda: succeeded(kube_api, "first").get("reason") == "Running", timeout=30, interval=0.05)
    create_replay(kube_api, "second", filter={"events": [CANCELLED]})
    first = ended(kube_api, "first", timeout=60)
    second = ended(kube_api, "second", timeout=90)
    copies_created = Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CREATED}"))
    copies_cancelled = Counter(m.headers["id"] for m in drain(test_vhost_url, f"billing.{CANCELLED}"))
    facts = {
        "first": (succeeded(kube_api, "first").get("reason"), counts(first)),
        "second": (succeeded(kube_api, "second").get("reason"), counts(second)),
        "created_copies": sum(copies_created.values()),
        "cancelled_copies": sum(copies_cancelled.values()),
        "left": depth(test_vhost_url, ARCHIVE),
    }
    print(facts)
    assert counts(first) == (3000, 3000, 0, 0), facts
    assert counts(second) == (3000, 3000, 0, 0), facts
    assert copies_created == Counter(ids[CREATED]), facts
    assert copies_cancelled == Counter(ids[CANCELLED]), facts
    assert facts["left"] == 0, facts


def peek(url: str) -> list[str]:
    """The archive's task ids in order, as `archived_ids`, then waits until the broker put them all back (on a
    quorum queue a moment after the channel closed: a walk begun at once would see part of the archive)."""
    found = archived_ids(url)
    eventually(lambda: depth(url, ARCHIVE) >= len(found), timeout=10, message="the peeked messages did not come back")
    return found


@pytest.mark.every_broker  # RabbitMQ 3.10 dropped acknowledgements a quorum queue got just before a close
def test_a_quorum_replay_leaves_none_of_what_it_replayed_archived(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str
) -> None:
    """Nothing else touches the archive: a replay of half of a quorum archive (no limit: one walk, ended from it).
    Status says what it replayed; none of those may stay archived."""
    create_service(kube_api, queueType="quorum")
    ready(kube_api)
    ids = bulk_archive(test_vhost_url, {CREATED: 3000, CANCELLED: 3000})
    create_replay(kube_api, "created", filter={"events": [CREATED]})
    status = ended(kube_api, "created", timeout=90)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "created"), ids[CREATED])
    print(shown(facts))
    assert facts["condition"][1] == "Replayed", shown(facts)
    assert facts["taken_originals_copied"] == 3000, shown(facts)
    assert facts["taken_originals_left"] == 0, ("replayed and still archived", shown(facts))
    assert counts(status) == (3000, 3000, 0, 0), shown(facts)


@pytest.mark.parametrize("round_", [1, 2, 3])
def test_a_quorum_purge_leaves_none_of_what_it_purged_archived(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, round_: int
) -> None:
    """Nothing else touches the archive: a purge of 300 of 1,000 on a quorum archive. Status says what it purged;
    none of those may stay archived (RabbitMQ 3.10 may drop acknowledgements sent just before a channel closes on a
    quorum queue: rabbitmq-server#10327)."""
    create_service(kube_api, queueType="quorum")
    ready(kube_api)
    ids = archive(test_vhost_url, {CREATED: 700, CANCELLED: 300})
    create_replay(kube_api, "purge", action="purge", confirm=True, filter={"events": [CANCELLED]})
    status = ended(kube_api, "purge", timeout=60)
    left = peek(test_vhost_url)
    still = [i for i in left if i in set(ids[CANCELLED])]
    facts = {
        "condition": succeeded(kube_api, "purge").get("message"),
        "left": len(left),
        "purged_yet_archived": len(still),
    }
    print(facts)
    assert (status["matched"], status["purged"], status["skipped"], status["remaining"]) == (300, 300, 0, 0), status
    assert not still, facts
    assert sorted(left) == sorted(ids[CREATED]), facts


def test_a_resume_whose_count_another_client_grabs_from_counts_only_what_it_moved(
    kube_api: EmulatedApi, operator_process: list[OperatorProcess], test_vhost_url: str, tmp_path: pathlib.Path
) -> None:
    """The issue's resume case with the grab timed on the resumed count: SIGKILL mid-move, and a basic.get client
    takes archived messages the moment the next operator's count walk consumes, holding them for 25 s. What it holds
    was not moved: the resumed replay must not count it as replayed, nor end while it is held."""
    create_service(kube_api, archive={"maxLength": 100_000})
    ready(kube_api)
    ids = bulk_archive(test_vhost_url, {CREATED: 10000})
    create_replay(kube_api, "everything", ratePerSecond=500)
    eventually(lambda: (replay_status(kube_api, "everything").get("replayed") or 0) >= 1000, timeout=60, interval=0.2)
    process = operator_process[-1].process
    assert process is not None
    process.kill()
    process.wait(10)
    operator_process[-1].stop()
    eventually(lambda: depth(test_vhost_url, ARCHIVE) >= 5000, timeout=10)
    grab = GrabOnWalk(test_vhost_url, up_to=3000).start()
    try:
        operator_process.append(OperatorProcess(kube_api.kubeconfig, tmp_path / "operator-1.log").start())
        grab.wait_grabbed(60)
        with contextlib.suppress(AssertionError):
            eventually(
                lambda: succeeded(kube_api, "everything").get("status") in ("True", "False"), timeout=25, interval=0.3
            )
        while_held = dict(succeeded(kube_api, "everything"))
        status_while_held = replay_status(kube_api, "everything")
    finally:
        grab.release()
    status = ended(kube_api, "everything", timeout=120)
    facts = audit(test_vhost_url, status, succeeded(kube_api, "everything"), ids[CREATED])
    facts |= {
        "grabbed": len(grab.held),
        "while_held": (while_held.get("status"), while_held.get("reason"), while_held.get("message")),
        "counts_while_held": counts(status_while_held),
    }
    print(shown(facts))
    assert grab.held, "the probe grabbed nothing"
    assert while_held.get("status") == "Unknown", ("ended while another client held selected events", shown(facts))
    assert facts["taken_originals_left"] == 0, shown(facts)
    assert facts["distinct_copies"] == 10000, shown(facts)
    assert status["replayed"] == facts["distinct_copies"], shown(facts)
