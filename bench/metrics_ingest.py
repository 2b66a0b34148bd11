"""Benchmark: ingest of Celery events, ours beside a bare kombu consumer of the same stream.

    .venv/bin/python bench/metrics_ingest.py [--events 100000]

A publisher process sends a realistic mix at full speed (task-sent/received/started, then succeeded,
failed or retried; worker heartbeats) to the service's event exchange, consumed by the operator's
events connection (monitoring/events_connection.py feeding ServiceMetrics, on an event loop) and then
by a bare kombu consumer that only decodes the JSON, each in this process. Two rounds: live (the
consumer runs while the publisher sends: events lost at a generator's full speed) and backlog (the
queue holds every event before the consumer starts: the consumer's own speed, not the publisher's).
Printed per run: events/s, events lost, CPU µs/event, peak RSS. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import pathlib
import random
import resource
import sys
import threading
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import amqp
from kombu import Consumer, Queue
from kombu.connection import Connection
from tests.support import framed_publisher, rabbitmq

from celery_event_operator.adapters.broker.events_connection import EventsConnection
from celery_event_operator.core import naming
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.monitoring.state import ServiceMetrics
from celery_event_operator.core.topology import plan

SERVICE = "bench"
PREFETCH = 5000  # for the kombu consumer (ours consumes without acknowledgement: no prefetch limit applies)


def stream(count: int) -> list[bytes]:
    """A realistic mix, pre-encoded: 4 task events per task in 10 pods, and heartbeats."""
    rng = random.Random(7)
    workers = [f"celery@bench-worker-{index}" for index in range(10)]
    events: list[bytes] = []
    clock = 1_800_000_000.0
    while len(events) < count:
        task_id, worker = str(uuid.uuid4()), rng.choice(workers)
        name = rng.choice(["orders.order.created", "orders.order.cancelled", "payments.refund"])
        base = {"uuid": task_id, "timestamp": clock, "utcoffset": 0, "pid": 12, "clock": len(events)}
        outcome = rng.random()
        for item in (
            {
                "type": "task-sent",
                "hostname": "gen@producer",
                "name": name,
                "args": "(42,)",
                "kwargs": "{}",
                "retries": 0,
                "queue": None,
                "exchange": "events",
                "routing_key": name,
            },
            {
                "type": "task-received",
                "hostname": worker,
                "name": name,
                "args": "(42,)",
                "kwargs": "{}",
                "retries": 0,
                "root_id": task_id,
                "parent_id": None,
            },
            {"type": "task-started", "hostname": worker},
            {"type": "task-succeeded", "hostname": worker, "runtime": rng.random(), "result": "None"}
            if outcome < 0.85
            else {"type": "task-failed", "hostname": worker, "exception": "KeyError('sku')", "traceback": "…"}
            if outcome < 0.95
            else {
                "type": "task-retried",
                "hostname": worker,
                "exception": "Retry(Retry(...), ValueError('x'), 0)",
                "traceback": "…",
            },
        ):
            events.append(json.dumps({**base, **item}).encode())
        if rng.random() < 0.1:
            events.append(
                json.dumps(
                    {
                        "type": "worker-heartbeat",
                        "hostname": worker,
                        "active": 1,
                        "freq": 2.0,
                        "timestamp": clock,
                        "processed": 10,
                        "loadavg": [0.1, 0.1, 0.1],
                    }
                ).encode()
            )
        clock += 0.001
    return events[:count]


def publish(url: str, count: int, ready: multiprocessing.synchronize.Event) -> None:
    """The stream to the service's event exchange, at full speed once `ready` is set."""
    exchange = naming.event_exchange_name(SERVICE)
    framed_publisher.publish_all(url, [(exchange, body) for body in stream(count)], ready)


def declare(url: str, queue: str) -> None:
    """The event exchange and a queue bound to it, with the monitor queue's arguments."""
    with Connection(url) as connection:
        channel = connection.channel()
        channel.exchange_declare(naming.event_exchange_name(SERVICE), "topic", durable=True, auto_delete=False)
        channel.queue_declare(queue, durable=True, auto_delete=False, arguments=dict(plan.MONITOR_QUEUE_ARGUMENTS))
        channel.queue_bind(queue, naming.event_exchange_name(SERVICE), "#")


class Ours:
    """The operator's events connection feeding ServiceMetrics, on an event loop in a thread of this process."""

    queue = naming.monitor_queue_name(SERVICE)

    def __init__(self, url: str) -> None:
        self.address = broker_address.parse(url)
        self.metrics = ServiceMetrics("bench", SERVICE)
        self.stop = threading.Event()

    def start(self) -> None:
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        connection = EventsConnection(self.address, None, logging.getLogger("bench"))
        connection.subscribe(SERVICE, self.queue, naming.event_exchange_name(SERVICE), self.metrics)
        while not self.stop.is_set():
            await asyncio.sleep(0.05)
        await connection.close()

    def consumed(self) -> int:
        return self.metrics.events_consumed + self.metrics.malformed


class BareKombu:
    """kombu's Consumer decoding the JSON, with a callback that only counts: the floor of a kombu-based exporter."""

    queue = "bench.bare"

    def __init__(self, url: str) -> None:
        self.url = url
        self.received = 0
        self.stop = threading.Event()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def consumed(self) -> int:
        return self.received

    def _on_message(self, body: object, message: object) -> None:
        self.received += 1

    def _run(self) -> None:
        with Connection(self.url) as connection:
            queue = Queue(
                self.queue,
                routing_key="#",
                queue_arguments=dict(plan.MONITOR_QUEUE_ARGUMENTS),
                durable=True,
                exchange=None,
            )
            with Consumer(
                connection.channel(),
                [queue],
                callbacks=[self._on_message],
                accept=["json"],
                no_ack=True,
                prefetch_count=PREFETCH,
                auto_declare=False,
            ):
                while not self.stop.is_set():
                    try:
                        connection.drain_events(timeout=1)
                    except TimeoutError:
                        continue


def _has_consumer(url: str, queue: str) -> bool:
    with Connection(url) as connection:
        try:
            return bool(connection.channel().queue_declare(queue, passive=True).consumer_count)
        except amqp.exceptions.NotFound:
            return False


def measure(kind: type[Ours | BareKombu], url: str, count: int, backlog: bool) -> dict[str, float]:
    """Live: the consumer runs while the publisher sends at full speed. Backlog: the queue holds all the
    events before the consumer starts, so its own speed is measured, not the publisher's."""
    subject = kind(url)
    declare(url, subject.queue)
    ready = multiprocessing.Event()
    publisher = multiprocessing.Process(target=publish, args=(url, count, ready))
    publisher.start()
    if backlog:
        ready.set()
        publisher.join()
    else:
        subject.start()
        while not _has_consumer(url, subject.queue):
            time.sleep(0.05)
        time.sleep(2)  # the publisher encodes its stream before the clock starts
    cpu0, start = time.process_time(), time.perf_counter()
    if backlog:
        subject.start()
    else:
        ready.set()
    last, idle_since = -1, time.perf_counter()
    while True:
        done = subject.consumed()
        if done >= count:
            break
        if done != last:
            last, idle_since = done, time.perf_counter()
        elif time.perf_counter() - idle_since > 5:
            break  # nothing more is coming: the rest was lost
        time.sleep(0.01)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    publisher.join()
    subject.stop.set()
    subject.thread.join(5)  # before its vhost goes
    got = subject.consumed()
    return {
        "events_per_second": got / elapsed,
        "lost": count - got,
        "cpu_us_per_event": cpu / max(got, 1) * 1e6,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--events",
        type=int,
        default=100_000,
        help="at most the monitor queue's max-length (100,000), or a backlog loses the rest",
    )
    args = parser.parse_args()
    amqp_url = os.environ.get("AMQP_URL", rabbitmq.DEFAULT_AMQP_URL)
    management = rabbitmq.Management(amqp_url)
    for backlog in (False, True):
        print(
            "backlog: the queue holds every event before the consumer starts (the consumer's own speed)"
            if backlog
            else "live: the publisher sends at full speed while the consumer runs"
        )
        for name, kind in (("operator consumer", Ours), ("bare kombu consumer", BareKombu)):
            vhost = rabbitmq.create_vhost(management, prefix="ceo-bench")
            try:
                figures = measure(kind, rabbitmq.url_with_vhost(amqp_url, vhost), args.events, backlog)
            finally:
                rabbitmq.delete_vhost(management, vhost)
            print(
                f"{name:>22}: {figures['events_per_second']:>8,.0f} events/s, lost {figures['lost']:,.0f}, "
                f"{figures['cpu_us_per_event']:.1f} µs CPU/event, peak RSS {figures['peak_rss_mb']:.0f} MB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
