"""Benchmark: replaying part of a large archive at a given rate (prints figures, asserts nothing).

    .venv/bin/python bench/replay_speed.py [--archived 20000] [--rate 1000] [--queue-type classic quorum]

The archive of service `billing` holds --archived events (3 event names x 2 exception classes, interleaved); a
replay takes the events after one exception class (40 %: 60 % passed over) at --rate per second:

- through the real operator (a CeleryEventReplay on the emulated API): seconds from its creation to Succeeded,
  and from its startTime to its completionTime, events/s and their share of --rate;
- through the command line's direct replay (`archive replay --broker-url`), the same;
- the reference of the same run: the same number of events with nothing passed over (the command line, an
  archive of those only), i.e. what the rate alone allows.

Each run checks what it can on the broker and prints it: copies in the handler queues (each event once), what
stays archived (the passed-over events, in their original order) and the replay's counts.
RabbitMQ at $AMQP_URL, in a vhost of the bench's per run (removed afterwards; the management API is needed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import amqp
from kombu.connection import Connection
from tests.support import bench, rabbitmq
from tests.support.operator_process import OperatorProcess

from celery_event_operator.adapters.topology import apply
from celery_event_operator.core import naming
from celery_event_operator.core.api import crd
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.topology import plan

EVENTS = ("orders.order.created", "orders.order.cancelled", "orders.order.shipped")
EXCEPTIONS = ("TimeoutError", "ValueError")  # 40 % TimeoutError: the replayed class
SELECTED_SHARE = 0.4
COMMAND = (sys.executable, "-m", "celery_event_operator.cli", "archive", "replay")
SERVICES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
REPLAYS = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventreplays"


def spec(queue_type: str, max_length: int) -> dict[str, Any]:
    return {
        "broker": {"secretRef": {"name": "rabbitmq"}},
        "retry": {"maxRetries": 2},
        "events": {"handlers": [{"name": event} for event in EVENTS]},
        "archive": {"maxLength": max_length},
        "queueType": queue_type,
    }


def fill(url: str, count: int, selected_only: bool = False) -> list[tuple[str, str]]:
    """`count` archived events, (task id, exception class) in archive order."""
    archived = []
    with Connection(url) as connection:
        channel = connection.channel()
        for index in range(count):
            exception = EXCEPTIONS[0] if selected_only or index % 5 in (1, 3) else EXCEPTIONS[1]
            event = EVENTS[index % len(EVENTS)]
            task_id = str(uuid.uuid4())
            headers = {
                "lang": "py",
                "task": event,
                "id": task_id,
                "root_id": task_id,
                "retries": 2,
                naming.EXCEPTION_TYPE_HEADER: exception,
                naming.EXCEPTION_HEADER: f"{exception}: order {index}",
                naming.ARCHIVED_AT_HEADER: 1_700_000_000.0,
            }
            body = json.dumps([[index], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}])
            channel.basic_publish(
                amqp.Message(body, content_type="application/json", application_headers=headers, delivery_mode=2),
                exchange=naming.archive_name("billing"),
                routing_key=event,
            )
            archived.append((task_id, exception))
        while channel.queue_declare(naming.archive_name("billing"), passive=True).message_count < count:
            time.sleep(0.2)
    return archived


def taken(url: str, queue: str, ack: bool) -> list[str]:
    """The task ids in a queue, in order (acknowledged: drained; otherwise put back)."""
    with Connection(url) as connection:
        channel = connection.channel()
        found = []
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            found.append(message.headers["id"])
            if ack:
                channel.basic_ack(message.delivery_tag)
        channel.close()
    return found


def check(url: str, archived: list[tuple[str, str]]) -> str:
    """What the broker shows after a replay of the selected class."""
    selected = [task_id for task_id, exception in archived if exception == EXCEPTIONS[0]]
    passed_over = [task_id for task_id, exception in archived if exception != EXCEPTIONS[0]]
    copies = Counter(task_id for event in EVENTS for task_id in taken(url, f"billing.{event}", ack=True))
    left = taken(url, naming.archive_name("billing"), ack=False)
    lost = len(set(selected) - set(copies) - set(left))
    twice = sum(count - 1 for count in copies.values())
    order = "order kept" if left == passed_over else "ORDER CHANGED"
    return f"{sum(copies.values())} copies ({twice} twice), {len(left)} still archived ({order}), {lost} lost"


def settled(management: rabbitmq.Management, vhost: str, count: int) -> None:
    """Until the management API's statistics show the archive filled: a replay is made for events archived a while
    ago, and a replay's first look at an archive waits until the statistics agree with the broker (they lag by up to
    collect_statistics_interval, 5 s)."""
    path = f"/queues/{management.vhost_path(vhost)}/{naming.archive_name('billing')}"
    wait_for(lambda: (management.request("GET", path) or {}).get("messages_ready") == count, 30)


def through_the_operator(
    broker: tuple[rabbitmq.Management, str, str], queue_type: str, count: int, rate: int, workdir: pathlib.Path
) -> str:
    management, vhost, url = broker
    with bench.emulated_cluster(workdir, url) as api:
        for definition in crd.custom_resource_definitions()[1:]:  # the replay's (the service's is there)
            api.client.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", definition)
        operator = OperatorProcess(api.kubeconfig, workdir / "operator.log").start()
        try:
            service = {
                "apiVersion": "celeryevents.io/v1alpha1",
                "kind": "CeleryEventService",
                "metadata": {"name": "billing"},
                "spec": spec(queue_type, max(10_000, count)),
            }
            api.client.create(SERVICES, service)
            wait_for(lambda: ready(api.client.get(f"{SERVICES}/billing")), 60)
            archived = fill(url, count)
            settled(management, vhost, count)
            began = time.monotonic()
            api.client.create(
                REPLAYS,
                {
                    "apiVersion": "celeryevents.io/v1alpha1",
                    "kind": "CeleryEventReplay",
                    "metadata": {"name": "timeouts"},
                    "spec": {
                        "serviceRef": {"name": "billing"},
                        "action": "replay",
                        "filter": {"exceptionTypes": [EXCEPTIONS[0]]},
                        "ratePerSecond": rate,
                    },
                },
            )
            status = wait_for(lambda: ended(api.client.get(f"{REPLAYS}/timeouts")), 600)
            took = time.monotonic() - began
        finally:
            operator.stop()
    span = seconds(status["completionTime"]) - seconds(status["startTime"])
    replayed = status.get("replayed") or 0
    counts = {key: status.get(key) for key in ("archived", "matched", "replayed", "skipped", "remaining")}
    return (
        f"operator, {queue_type}: {replayed} replayed in {took:.1f} s from creation ({replayed / took:.0f}/s, "
        f"{replayed / took / rate:.0%} of {rate}/s); startTime→completionTime {span:.0f} s; {counts}; "
        f"{check(url, archived)}"
    )


def through_the_command_line(
    url: str, queue_type: str, count: int, rate: int, *, selected_only: bool = False
) -> tuple[str, float]:
    with Connection(url) as connection:
        apply.apply(connection, plan.plan("billing", parse_spec(spec(queue_type, max(10_000, count)))))
    archived = fill(url, count, selected_only=selected_only)
    began = time.monotonic()
    replay = ("billing", "--broker-url", url, "--queue-type", queue_type, "--exception", EXCEPTIONS[0])
    subprocess.run(
        [*COMMAND, *replay, "--rate", str(rate)],
        check=True,
        capture_output=True,
    )
    took = time.monotonic() - began
    moved = sum(1 for _, exception in archived if exception == EXCEPTIONS[0])
    what = "reference (nothing passed over)" if selected_only else "command line"
    line = (
        f"{what}, {queue_type}: {moved} replayed in {took:.1f} s ({moved / took:.0f}/s, {moved / took / rate:.0%} "
        f"of {rate}/s); {check(url, archived)}"
    )
    return line, took


def ready(body: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in (body.get("status") or {}).get("conditions", [])
    )


def ended(body: dict[str, Any]) -> dict[str, Any] | None:
    status: dict[str, Any] = body.get("status") or {}
    done = any(
        c.get("type") == "Succeeded" and c.get("status") in ("True", "False") for c in status.get("conditions", [])
    )
    return status if done else None


def wait_for(probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout} s")


def seconds(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archived", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--queue-type", nargs="+", default=["classic", "quorum"], choices=["classic", "quorum"])
    options = parser.parse_args()
    selected = int(options.archived * SELECTED_SHARE)
    print(f"{options.archived} archived, {selected} of them ({SELECTED_SHARE:.0%}) replayed at {options.rate}/s")
    for queue_type in options.queue_type:
        with bench.broker_vhost() as (_, _, url):
            line, _ = through_the_command_line(url, queue_type, selected, options.rate, selected_only=True)
            print(line, flush=True)
        with bench.broker_vhost() as (_, _, url):
            line, _ = through_the_command_line(url, queue_type, options.archived, options.rate)
            print(line, flush=True)
        with bench.broker_vhost() as broker, tempfile.TemporaryDirectory() as workdir:
            figures = through_the_operator(broker, queue_type, options.archived, options.rate, pathlib.Path(workdir))
            print(figures, flush=True)


if __name__ == "__main__":
    main()
