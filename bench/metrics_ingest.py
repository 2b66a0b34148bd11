"""Benchmark: ingest of Celery events, ours beside a bare kombu consumer of the same stream.

    .venv/bin/python bench/metrics_ingest.py [--events 200000]

A publisher process sends a realistic mix at full speed (task-sent/received/started, then succeeded,
failed or retried; worker heartbeats) to the service's event exchange. Run 1: the operator's consumer
(consumer.consume feeding ServiceMetrics) in this process. Run 2: a bare kombu consumer that only
decodes JSON. Printed per run: events/s, events lost, CPU µs/event, peak RSS. Asserts nothing.
"""

from __future__ import annotations

import argparse
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
from tests.support import rabbitmq

from celery_event_operator import naming
from celery_event_operator.broker import urls
from celery_event_operator.monitoring import consumer
from celery_event_operator.monitoring.state import ServiceMetrics
from celery_event_operator.topology import plan

SERVICE = "bench"


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
        for item in ({"type": "task-sent", "hostname": "gen@producer", "name": name, "args": "(42,)", "kwargs": "{}",
                      "retries": 0, "queue": None, "exchange": "events", "routing_key": name},
                     {"type": "task-received", "hostname": worker, "name": name, "args": "(42,)", "kwargs": "{}",
                      "retries": 0, "root_id": task_id, "parent_id": None},
                     {"type": "task-started", "hostname": worker},
                     {"type": "task-succeeded", "hostname": worker, "runtime": rng.random(), "result": "None"}
                     if outcome < 0.85 else
                     {"type": "task-failed", "hostname": worker, "exception": "KeyError('sku')", "traceback": "…"}
                     if outcome < 0.95 else
                     {"type": "task-retried", "hostname": worker,
                      "exception": "Retry(Retry(...), ValueError('x'), 0)", "traceback": "…"}):
            events.append(json.dumps({**base, **item}).encode())
        if rng.random() < 0.1:
            events.append(json.dumps({"type": "worker-heartbeat", "hostname": worker, "active": 1, "freq": 2.0,
                                      "timestamp": clock, "processed": 10, "loadavg": [0.1, 0.1, 0.1]}).encode())
        clock += 0.001
    return events[:count]


def publish(url: str, count: int, ready: multiprocessing.synchronize.Event) -> None:
    events = stream(count)
    ready.wait()
    connection = Connection(url)
    channel = connection.default_channel.connection.channel()  # raw py-amqp: the fastest publisher
    exchange = naming.event_exchange_name(SERVICE)
    for body in events:
        channel.basic_publish(amqp.Message(body, content_type="application/json"), exchange, "task.event")
    connection.release()


def run_ours(url: str, count: int) -> dict[str, float]:
    address = urls.parse(url, failover_strategy="round-robin", vhost_override=None)
    metrics = ServiceMetrics("bench", SERVICE)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.consume,
                              args=(address, SERVICE, metrics, stop, logging.getLogger("bench")), daemon=True)
    thread.start()
    while not _has_consumer(url, naming.monitor_queue_name(SERVICE)):
        time.sleep(0.05)
    return _measure(url, count, lambda: metrics.events_consumed + metrics.malformed,
                    lambda: (stop.set(), thread.join(5)))


def run_bare(url: str, count: int) -> dict[str, float]:
    """kombu's Consumer with a callback that only decodes: the floor of a kombu-based exporter."""
    received = [0]
    stop = threading.Event()
    exchange = naming.event_exchange_name(SERVICE)

    def bare() -> None:
        with Connection(url) as connection:
            queue = Queue("bench.bare", routing_key="#", queue_arguments=dict(plan.MONITOR_QUEUE_ARGUMENTS),
                          durable=True, exchange=None)
            channel = connection.channel()
            channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
            channel.queue_declare("bench.bare", durable=True, auto_delete=False,
                                  arguments=dict(plan.MONITOR_QUEUE_ARGUMENTS))
            channel.queue_bind("bench.bare", exchange, "#")

            def on_message(body: object, message: object) -> None:
                received[0] += 1

            with Consumer(channel, [queue], callbacks=[on_message], accept=["json"], no_ack=True,
                          prefetch_count=consumer.PREFETCH, auto_declare=False):
                while not stop.is_set():
                    try:
                        connection.drain_events(timeout=1)
                    except TimeoutError:
                        continue

    thread = threading.Thread(target=bare, daemon=True)
    thread.start()
    while not _has_consumer(url, "bench.bare"):
        time.sleep(0.05)
    return _measure(url, count, lambda: received[0], lambda: (stop.set(), thread.join(5)))


def _has_consumer(url: str, queue: str) -> bool:
    with Connection(url) as connection:
        try:
            return bool(connection.channel().queue_declare(queue, passive=True).consumer_count)
        except amqp.exceptions.NotFound:
            return False


def _measure(url: str, count: int, consumed: object, stop: object) -> dict[str, float]:
    ready = multiprocessing.Event()
    publisher = multiprocessing.Process(target=publish, args=(url, count, ready))
    publisher.start()
    time.sleep(2)  # the publisher encodes its stream before the clock starts
    cpu0, start = time.process_time(), time.perf_counter()
    ready.set()
    last, idle_since = -1, time.perf_counter()
    while True:
        done = consumed()  # type: ignore[operator]
        if done >= count:
            break
        if done != last:
            last, idle_since = done, time.perf_counter()
        elif time.perf_counter() - idle_since > 5:
            break  # nothing more is coming: the rest was lost
        time.sleep(0.01)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    publisher.join()
    stop()  # type: ignore[operator]
    got = consumed()  # type: ignore[operator]
    return {"events_per_second": got / elapsed, "lost": count - got, "cpu_us_per_event": cpu / max(got, 1) * 1e6,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    amqp_url = os.environ.get("AMQP_URL", rabbitmq.DEFAULT_AMQP_URL)
    management = rabbitmq.Management(amqp_url)
    for name, run in (("operator consumer", run_ours), ("bare kombu consumer", run_bare)):
        vhost = rabbitmq.create_vhost(management, prefix="ceo-bench")
        try:
            figures = run(rabbitmq.url_with_vhost(amqp_url, vhost), args.events)
        finally:
            rabbitmq.delete_vhost(management, vhost)
        print(f"{name:>20}: {figures['events_per_second']:>8,.0f} events/s, lost {figures['lost']:,.0f}, "
              f"{figures['cpu_us_per_event']:.1f} µs CPU/event, peak RSS {figures['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
