"""Benchmark: metric series under pod churn, with the real operator on the emulated API.

    .venv/bin/python bench/metrics_churn.py [--rollouts 20] [--pods 10]

Each rollout creates a new set of labelled pods, sends their Celery events (heartbeats and task
events for three task names, two exception classes), and deletes the previous pods through the API.
After each rollout it prints the series count (the task series, and the per-pod series of workers), the
/metrics size and scrape time, and the operator's RSS. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import amqp
from kombu.connection import Connection
from tests.support import bench
from tests.support.operator_process import OperatorProcess

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"


def events_of(worker: str, tasks: int) -> list[dict[str, object]]:
    events: list[dict[str, object]] = [{"type": "worker-heartbeat", "hostname": f"celery@{worker}", "active": 1}]
    for index in range(tasks):
        name = ("orders.created", "orders.cancelled", "refunds")[index % 3]
        uuid = f"{worker}-{index}"
        events += [
            {"type": "task-received", "hostname": f"celery@{worker}", "uuid": uuid, "name": name},
            {"type": "task-started", "hostname": f"celery@{worker}", "uuid": uuid},
        ]
        if index % 5 == 0:
            events.append(
                {
                    "type": "task-failed",
                    "hostname": f"celery@{worker}",
                    "uuid": uuid,
                    "exception": ("KeyError('x')", "ValueError('y')")[index % 2],
                }
            )
        else:
            events.append(
                {"type": "task-succeeded", "hostname": f"celery@{worker}", "uuid": uuid, "runtime": 0.01 * index}
            )
    return events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--tasks-per-pod", type=int, default=30)
    args = parser.parse_args()
    with bench.broker_vhost() as (_, _, url):
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="ceo-bench-"))
        with bench.emulated_cluster(workdir, url) as api:
            operator = OperatorProcess(api.kubeconfig, workdir / "operator.log").start()
            assert operator.process is not None
            try:
                api.client.create(
                    CES,
                    {
                        "apiVersion": "celeryevents.io/v1alpha1",
                        "kind": "CeleryEventService",
                        "metadata": {"name": "billing"},
                        "spec": {"broker": {"secretRef": {"name": "rabbitmq"}}},
                    },
                )
                time.sleep(3)  # the consumer starts
                previous: list[str] = []
                with Connection(url) as connection:
                    channel = connection.channel()
                    for rollout in range(1, args.rollouts + 1):
                        current = [f"billing-worker-{rollout:02d}-{index}" for index in range(args.pods)]
                        for name in current:
                            api.client.create(
                                PODS,
                                {
                                    "apiVersion": "v1",
                                    "kind": "Pod",
                                    "metadata": {"name": name, "labels": {"celeryevents.io/service": "billing"}},
                                    "spec": {"containers": [{"name": "w", "image": "w"}]},
                                },
                            )
                            for event in events_of(name, args.tasks_per_pod):
                                channel.basic_publish(amqp.Message(json.dumps(event)), "billing:celeryev", "x")
                        for name in previous:
                            api.client.delete(f"{PODS}/{name}")
                        previous = current
                        time.sleep(1.0)
                        started = time.perf_counter()
                        with urllib.request.urlopen(operator.metrics_url, timeout=30) as response:
                            body = response.read()
                        scrape = time.perf_counter() - started
                        lines = [
                            line
                            for line in body.decode().splitlines()
                            if line.startswith("celery_") and 'service_name="billing"' in line
                        ]
                        tasks = sum(1 for line in lines if line.startswith("celery_task_"))
                        workers = sum(1 for line in lines if line.startswith("celery_worker_"))
                        size = len(body) / 1024
                        print(
                            f"rollout {rollout:2d}: {len(lines):5d} series of billing ({tasks} task series,"
                            f" {workers} of workers), /metrics {size:6.1f} KiB, scrape {scrape * 1000:5.1f} ms,"
                            f" operator RSS {bench.rss_mb(operator.process.pid):5.1f} MB"
                        )
            finally:
                operator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
