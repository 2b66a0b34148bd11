"""Benchmark: N services applied at once to the real operator process (prints figures, asserts nothing).

    .venv/bin/python bench/scale.py [--services 1000] [--queue-type classic|quorum|mixed]
                                    [--ingest-services 100] [--idle-seconds 60] [--pods-per-service 2]
                                    [--reference COMMIT]

With --reference, the same run is made first with the operator of COMMIT (a worktree of it, imported first), then with
this checkout's, and the figures are printed side by side at the end.

Each service has 1 handler, maxRetries 3, monitoring and autoscaling on, a Deployment as its scale
target and --pods-per-service Running worker pods on its settings (no kubelet: a publisher sends their Celery
heartbeats and task events). The emulated Kubernetes API runs in this process, the operator in its own (its CPU, RSS and
threads are its own), RabbitMQ at $AMQP_URL in a vhost of the bench's (removed afterwards; the management
API is needed). Printed, in order:

- seconds until every service is Ready (and until half and 90 % of them were);
- status age relative to each service's interval, max and p99 (from the operator's
  celery_event_operator_status_pass_timestamp_seconds), and services with a connected events consumer
  (their MonitoringReady condition);
- the operator's AMQP connections and channels (every one of its connections, consumers included); how many times
  kopf ran the change handlers of a new resource (once per service is no work done twice);
- its threads and RSS; its CPU while idle (no changes; the worker pods heartbeat as Celery's do, every 2 s), once it has
  settled (after the one-time freeze of its heap for the collector, 120 s after its start)
  over --idle-seconds; the Kubernetes API writes per minute over the same time;
- the Kubernetes API writes per minute under a changing load: each service's first pod runs a long task for
  30 s out of every 60 s (its deletion cost goes up and down), over --idle-seconds, in all and by kind (the
  resource and subresource written: services' status, pods' deletion costs, workloads' scale, Events, …);
- events/s ingested while a generator publishes to --ingest-services services at once, beside the
  figure for one service in the same run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import pathlib
import re
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from kombu.connection import Connection
from tests.support import bench, framed_publisher, rabbitmq
from tests.support.kube import EmulatedApi
from tests.support.operator_process import OperatorProcess

from celery_event_operator.core import naming
from celery_event_operator.core.api.metadata import HASH_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.injection import settings
from celery_event_operator.core.injection.pod import VOLUME_NAME

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"
HEARTBEAT_SECONDS = 2.0  # Celery's
LOAD_PERIOD_SECONDS = 60.0  # the changing load: a long task for the first half of each period
INTERVAL = 15  # statusIntervalSeconds: the default
HEAP_FROZEN = "objects of the settled operator frozen"  # the operator's log, once settled (flow/context.py)
HEAP_FREEZE_WAIT_SECONDS = 150.0
CREATION_HANDLED = "Creation is processed"  # kopf's log line once a new resource's change handlers ran


class Figures:
    """The run's figures, printed as they come and kept in order for the side-by-side table."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def __call__(self, figure: str, value: str) -> None:
        self.values[figure] = value
        print(f"{figure + ':':<40} {value}", flush=True)


def name(index: int) -> str:
    return f"svc-{index:04d}"


def queue_type_of(index: int, chosen: str) -> str:
    """`mixed`: classic and quorum services alternate, as teams run them side by side."""
    if chosen == "mixed":
        return "quorum" if index % 2 else "classic"
    return chosen


def service(index: int, queue_type: str) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name(index)},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "queueType": queue_type,
            "retry": {"maxRetries": 3},
            "events": {"handlers": [{"name": f"domain.thing{index}.happened"}]},
            "statusIntervalSeconds": INTERVAL,
            "workers": {"scaleTargetRef": {"kind": "Deployment", "name": f"{name(index)}-worker"}},
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 10},
            "monitoring": {"enabled": True},
        },
    }


def deployment(index: int) -> dict[str, Any]:
    labels = {"app": name(index), "celeryevents.io/service": name(index)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name(index)}-worker"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name(index)}},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "w", "image": "w"}]}},
        },
    }


def pod_name(index: int, number: int) -> str:
    return f"{name(index)}-worker-{number}"


def pod(index: int, number: int, queue_type: str) -> dict[str, Any]:
    """A Running worker pod as the API server keeps it after the webhook (the service's settings hash)."""
    config_hash = settings.config_hash(settings.render(name(index), parse_spec(service(index, queue_type)["spec"])))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(index, number),
            "labels": {"app": name(index), SERVICE_LABEL: name(index)},
            "annotations": {HASH_ANNOTATION: config_hash},
        },
        # The settings volume the webhook adds: without it the pod runs none, and the operator replaces it.
        "spec": {"containers": [{"name": "w", "image": "w"}], "volumes": [{"name": VOLUME_NAME, "emptyDir": {}}]},
        "status": {"phase": "Running", "podIP": f"10.{index // 250}.{index % 250}.{number + 1}"},
    }


def worker_events(url: str, services: list[str], pods_per_service: int, load: bool, stop: Any) -> None:
    """Celery's worker events of every pod until `stop`: heartbeats every 2 s; with `load`, the first pod of each
    service starts a long task at the start of each period and ends it half-way (task-started, task-succeeded)."""
    with Connection(url) as connection:
        client = connection.connection
        channel = client.channel()
        client.transport.sock.settimeout(None)
        started = time.monotonic()
        running = False
        while not stop.is_set():
            period_at = (time.monotonic() - started) % LOAD_PERIOD_SECONDS
            busy = load and period_at < LOAD_PERIOD_SECONDS / 2
            framed = []
            for service_name in services:
                exchange = naming.event_exchange_name(service_name)
                for number in range(pods_per_service):
                    hostname = f"celery@{service_name}-worker-{number}"
                    events = [{"type": "worker-heartbeat", "hostname": hostname, "active": int(busy and number == 0)}]
                    if number == 0 and busy != running:
                        kind = "task-started" if busy else "task-succeeded"
                        events.append(
                            {"type": kind, "hostname": hostname, "uuid": f"{service_name}-long", "runtime": 30.0}
                        )
                    for event in events:
                        body = json.dumps({**event, "timestamp": time.time()}).encode()
                        framed.append(framed_publisher.publish_frames(channel.channel_id, exchange, body))
            running = busy
            client.transport.write(b"".join(framed))
            stop.wait(HEARTBEAT_SECONDS)


def conditions_true(api: EmulatedApi, kind: str) -> int:
    return sum(
        1
        for item in api.client.get(CES)["items"]
        for c in (item.get("status") or {}).get("conditions", [])
        if c["type"] == kind and c["status"] == "True"
    )


def process_figures(pid: int) -> tuple[int, float, float]:
    """(threads, RSS MB, CPU seconds) of a process, from /proc."""
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    rss = int(re.search(r"^VmRSS:\s+(\d+)", status, re.M).group(1)) / 1024  # type: ignore[union-attr]
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return threads, rss, cpu


def scraped(operator: OperatorProcess, metric: str) -> dict[str, float]:
    """metric{…name or service_name="x"…} value → {x: value}."""
    found: dict[str, float] = {}
    for line in operator.scrape().splitlines():
        if line.startswith(metric + "{"):
            labels, value = line[len(metric) + 1 :].rsplit("} ", 1)
            key = re.search(r'(?:service_name|name)="([^"]*)"', labels)
            if key:
                found[key.group(1)] = found.get(key.group(1), 0.0) + float(value)
    return found


def operator_connections(management: rabbitmq.Management, vhost: str) -> list[dict[str, Any]]:
    return [
        c
        for c in management.request("GET", "/connections")
        if c.get("vhost") == vhost
        and str((c.get("client_properties") or {}).get("connection_name", "")).startswith("celery-event-operator")
    ]


def generate(url: str, services: list[str], per_service: int, ready: Any) -> None:
    """Heartbeats to the services' event exchanges, interleaved, at full speed."""
    messages = [
        (
            naming.event_exchange_name(service_name),
            json.dumps(
                {
                    "type": "worker-heartbeat",
                    "hostname": f"celery@{service_name}-w",
                    "active": number % 3,
                    "timestamp": 1.0,
                }
            ).encode(),
        )
        for number in range(per_service)
        for service_name in services
    ]
    framed_publisher.publish_all(url, messages, ready, routing_key="task.x")


def broker_pid() -> int | None:
    """The local RabbitMQ node's process (its CPU is the other half of the story), if there is one."""
    for stat in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"beam.smp" in stat.read_bytes() and b"rabbit" in stat.read_bytes():
                return int(stat.parent.name)
        except OSError:
            continue
    return None


def broker_figure(cpu: float | None) -> str:
    return "" if cpu is None else f", broker CPU {cpu:.1f} µs/event"


def ingest(operator: OperatorProcess, url: str, services: list[str], total: int) -> tuple[float, float, float | None]:
    """Events/s the operator consumed while a generator published `total` events spread over `services`, and
    the operator's and the local broker's CPU µs per event meanwhile."""
    assert operator.process is not None
    broker = broker_pid()
    before = scraped(operator, "celery_event_operator_events_consumed_total")
    base = sum(before.get(s, 0.0) for s in services)
    ready = multiprocessing.Event()
    generator = multiprocessing.Process(target=generate, args=(url, services, total // len(services), ready))
    generator.start()
    time.sleep(min(10.0, 2 + total / 20_000))  # the generator frames its stream before the clock starts
    _, _, cpu0 = process_figures(operator.process.pid)
    broker0 = process_figures(broker)[2] if broker else 0.0
    started = last_change = time.perf_counter()
    ready.set()
    done = 0.0
    while done < total and time.perf_counter() - last_change < 5:
        time.sleep(1)  # a scrape of a thousand services costs the operator too: not more often
        consumed = scraped(operator, "celery_event_operator_events_consumed_total")
        now_done = sum(consumed.get(s, 0.0) for s in services) - base
        if now_done != done:
            done, last_change = now_done, time.perf_counter()
    _, _, cpu1 = process_figures(operator.process.pid)
    broker_cpu = (process_figures(broker)[2] - broker0) / max(done, 1) * 1e6 if broker else None
    generator.join()
    return done / (last_change - started), (cpu1 - cpu0) / max(done, 1) * 1e6, broker_cpu


def report_steady_state(
    api: EmulatedApi,
    operator: OperatorProcess,
    management: rabbitmq.Management,
    vhost: str,
    *,
    url: str,
    args: argparse.Namespace,
    record: Figures,
) -> None:
    if not args.pods_per_service:
        measure_steady_state(api, operator, management, vhost, args=args, record=record)
        return
    stop = multiprocessing.Event()
    heartbeats = multiprocessing.Process(
        target=worker_events, args=(url, [name(i) for i in range(args.services)], args.pods_per_service, False, stop)
    )
    heartbeats.start()
    try:
        measure_steady_state(api, operator, management, vhost, args=args, record=record)
    finally:
        stop.set()
        heartbeats.join()


def measure_steady_state(
    api: EmulatedApi,
    operator: OperatorProcess,
    management: rabbitmq.Management,
    vhost: str,
    *,
    args: argparse.Namespace,
    record: Figures,
) -> None:
    time.sleep(2 * INTERVAL)  # every status refreshed at least once
    stamps = scraped(operator, "celery_event_operator_status_pass_timestamp_seconds")
    now = time.time()
    ages = sorted((now - stamps.get(name(i), 0.0)) / INTERVAL for i in range(args.services))
    p99 = ages[min(len(ages) - 1, int(len(ages) * 0.99))]
    record("status age / interval", f"max {ages[-1]:.2f}, p99 {p99:.2f}, median {statistics.median(ages):.2f}")
    record("consumers connected", f"{conditions_true(api, 'MonitoringReady')}/{args.services}")
    connections = operator_connections(management, vhost)
    channels = sum(c.get("channels", 0) for c in connections)
    record("AMQP connections", f"{len(connections)}, channels {channels}")
    # Idle means settled: the one-time freeze of the settled heap for the collector (flow/context.py, 120 s after
    # the start: ~0.4 s of CPU at this scale) fell inside the window in every run, a startup cost read as idle.
    waited = time.monotonic()
    while HEAP_FROZEN not in operator.log() and time.monotonic() - waited < HEAP_FREEZE_WAIT_SECONDS:
        time.sleep(1)
    frozen = HEAP_FROZEN in operator.log()
    record("idle window starts", "after the heap's freeze" if frozen else "no heap freeze logged: at once")
    # kopf logs each run of the change handlers for a new resource: more runs than services is work done twice.
    record("creations handled", f"{operator.log().count(CREATION_HANDLED)} for {args.services} services")
    assert operator.process is not None
    threads, rss, cpu0 = process_figures(operator.process.pid)
    writes0, at0 = api.writes(), time.monotonic()
    time.sleep(args.idle_seconds)
    _, rss, cpu1 = process_figures(operator.process.pid)
    minutes = (time.monotonic() - at0) / 60
    record("threads", f"{threads}")
    record("RSS", f"{rss:.0f} MB")
    record("idle CPU", f"{100 * (cpu1 - cpu0) / (minutes * 60):.1f} % of one core over {args.idle_seconds:.0f}s")
    record_writes(record, "API writes at rest", writes0, api.writes(), minutes)
    record("stuck workers", f"{conditions_false(api, 'WorkersHealthy')} services report some")


def record_writes(
    record: Figures, figure: str, before: dict[tuple[str, str], int], after: dict[tuple[str, str], int], minutes: float
) -> None:
    """Writes per minute between two counts of the emulated API's, in all and per resource written."""
    kinds = {kind: (after.get(kind, 0) - before.get(kind, 0)) / minutes for kind in after}
    record(f"{figure}, per minute", f"{sum(kinds.values()):.1f}")
    when = figure.removeprefix("API writes").strip(" ,")  # each row its own key in the side-by-side table
    for (resource, subresource), rate in sorted(kinds.items(), key=lambda item: -item[1]):
        if rate:
            record(f"  {resource}{'/' + subresource if subresource else ''} ({when})", f"{rate:.1f}")


def report_changing_load(api: EmulatedApi, url: str, args: argparse.Namespace, record: Figures) -> None:
    """API writes per minute while each service's first pod runs a long task half of the time."""
    stop = multiprocessing.Event()
    load = multiprocessing.Process(
        target=worker_events, args=(url, [name(i) for i in range(args.services)], args.pods_per_service, True, stop)
    )
    load.start()
    try:
        time.sleep(LOAD_PERIOD_SECONDS / 2)  # the first long tasks pass 10 s: costs go up
        writes0, at0 = api.writes(), time.monotonic()
        record("pods with a deletion cost at the start", f"{cost_annotated(api)}")
        time.sleep(max(args.idle_seconds, LOAD_PERIOD_SECONDS))
        minutes = (time.monotonic() - at0) / 60
        record_writes(record, "API writes, changing load", writes0, api.writes(), minutes)
    finally:
        stop.set()
        load.join()


def cost_annotated(api: EmulatedApi) -> int:
    return sum(
        1
        for item in api.client.get(PODS)["items"]
        if (item["metadata"].get("annotations") or {}).get("controller.kubernetes.io/pod-deletion-cost")
        not in (None, "0")
    )


def conditions_false(api: EmulatedApi, kind: str) -> int:
    return sum(
        1
        for item in api.client.get(CES)["items"]
        for c in (item.get("status") or {}).get("conditions", [])
        if c["type"] == kind and c["status"] == "False"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--queue-type", choices=("classic", "quorum", "mixed"), default="classic")
    parser.add_argument("--ingest-services", type=int, default=100)
    parser.add_argument("--ingest-events", type=int, default=100_000)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--pods-per-service", type=int, default=2, help="0: no pods (and no worker events)")
    parser.add_argument("--resync-seconds", type=float, default=30)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--reference", help="a commit whose operator runs first, for its figures beside these")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped from outside: still remove the vhost
    if args.reference is None:
        return 0 if run(args, None) is not None else 1
    with bench.reference_checkout(args.reference) as source:
        print(f"== the operator of {args.reference}")
        before = run(args, source)
    print("== the operator of this checkout")
    after = run(args, None)
    if before is None or after is None:
        return 1
    bench.side_by_side(args.reference, before.values, after.values)
    return 0


def run(args: argparse.Namespace, source: pathlib.Path | None) -> Figures | None:
    """One run of the benchmark with the operator of `source` (None: this checkout's); None when it timed out."""
    record = Figures()
    with bench.broker_vhost() as (management, vhost, url):
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="ceo-bench-"))
        print(
            f"{args.services} {args.queue_type} services (1 handler, maxRetries 3, monitoring and autoscaling on,"
            " a Deployment each);"
            f" operator log: {workdir / 'operator.log'}"
        )
        with bench.emulated_cluster(workdir, url) as api:
            for index in range(args.services):
                api.client.create(DEPLOYMENTS, deployment(index))
                for number in range(args.pods_per_service):
                    api.client.create(PODS, pod(index, number, queue_type_of(index, args.queue_type)))
            operator = OperatorProcess(
                api.kubeconfig,
                workdir / "operator.log",
                resync_seconds=args.resync_seconds,
                verbose=False,
                source=source,
            ).start()
            try:
                started = time.monotonic()
                for index in range(args.services):
                    api.client.create(CES, service(index, queue_type_of(index, args.queue_type)))
                record("created", f"{time.monotonic() - started:.1f} s")
                reached: dict[int, float] = {}  # share of the services Ready (%) → when first seen
                while (ready := conditions_true(api, "Ready")) < args.services:
                    if time.monotonic() - started > args.timeout:
                        print(f"timeout: {ready}/{args.services} Ready after {args.timeout:.0f}s")
                        return None
                    for share in (50, 90):
                        if ready * 100 >= share * args.services:
                            reached.setdefault(share, time.monotonic() - started)
                    time.sleep(1)
                done = time.monotonic() - started
                record("all Ready", f"{done:.1f} s")
                record("half, 90 % Ready", f"{reached.get(50, done):.1f} s, {reached.get(90, done):.1f} s")

                report_steady_state(api, operator, management, vhost, url=url, args=args, record=record)
                if args.pods_per_service:
                    report_changing_load(api, url, args, record)
                single, single_cpu, single_broker = ingest(operator, url, [name(0)], args.ingest_events)
                many, many_cpu, many_broker = ingest(
                    operator, url, [name(i) for i in range(args.ingest_services)], args.ingest_events
                )
                record(
                    "ingest, 1 service",
                    f"{single:,.0f} events/s, operator CPU {single_cpu:.1f} µs/event{broker_figure(single_broker)}",
                )
                record(
                    f"ingest, {args.ingest_services} services",
                    f"{many:,.0f} events/s ({100 * many / single:.0f} % of one service's), operator CPU "
                    f"{many_cpu:.1f} µs/event{broker_figure(many_broker)}",
                )
            finally:
                operator.stop()
    return record


if __name__ == "__main__":
    sys.exit(main())
