"""Benchmark: /metrics at fleet scale, through the real operator on the emulated API with real RabbitMQ.

    .venv/bin/python bench/metrics_fleet.py [--services 1000] [--pods 10] [--task-names 25]
                                            [--generated-names 50000] [--scrapes 3] [--reference COMMIT]

With --reference, the same run is made first with the operator of COMMIT (a worktree of it, imported first), then with
this checkout's, and the figures are printed side by side at the end.

N services, each with P labelled pods in the emulated API and the events of a Celery worker fleet: per task,
task-sent from a producer, task-received and task-started on one of the pods, then task-succeeded (or
task-failed for one name in ten, task-retried and then task-succeeded for another), and the pods'
heartbeats, for T task names; plus one service whose producers name every task differently
(--generated-names names, one task each, sent as batches of 100 events per message so that its
100,000-message events queue drops none). The emulated API runs in this process, the operator in its own,
RabbitMQ at $AMQP_URL in a vhost of the bench's (removed afterwards). Printed, in order:

- samples per service (median and max of the N, and the generated-names service's own), total samples;
- whether every one of the N services has exactly its task series (names, counts);
- per scrape, after a task event to every service (so every service's block is rendered again: the worst
  case, tasks running everywhere) or a heartbeat to every service (only their few other lines are), and
  then again with nothing changed, gzip (as Prometheus asks) and plain: bytes, seconds, and the operator's
  CPU seconds meanwhile (its own cost, whatever else runs on the machine);
- during each scrape after a heartbeat round: the longest response of the liveness endpoint, which the
  operator's event loop serves, asked a hundred times a second on a kept-alive connection (the longest
  event-loop stall, give or take one request), and the webhook's p99 and longest response
  (AdmissionReviews, as often), beside the same measured for --quiet-seconds without a scrape;
- all of these twice: right after the set-up, and once the operator froze its settled heap for Python's
  cycle collector (it does 2 minutes after its start; the full collections of a large heap stall the loop);
- the operator's RSS.

Asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import multiprocessing
import pathlib
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.support import bench, framed_publisher, rabbitmq, waiting
from tests.support.kube import EmulatedApi
from tests.support.operator_process import OperatorProcess, admission_review

from celery_event_operator.core import naming

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
PODS = "/api/v1/namespaces/default/pods"
GENERATED = "generated"
CONSUMED = re.compile(rb'^celery_event_operator_events_consumed_total\{[^}]*service_name="([^"]*)"\} (\S+)$', re.M)
SERVICE_OF_SAMPLE = re.compile(rb'service_name="([^"]*)"')


def service_name(index: int) -> str:
    return f"svc-{index:04d}"


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq"}},
            "retry": {"maxRetries": 3},
            "events": {"handlers": [{"name": f"domain.{name}.happened"}]},
            "monitoring": {"enabled": True},
        },
    }


def pod(service_name_: str, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{service_name_}-worker-{index}", "labels": {"celeryevents.io/service": service_name_}},
        "spec": {"containers": [{"name": "w", "image": "w"}]},
    }


def task_events(name: str, pods: int, task: str, number: int, clock: float) -> list[dict[str, Any]]:
    """One task's events in the realistic mix; one name in ten fails, another is retried once."""
    worker = f"celery@{name}-worker-{number % pods}"
    uuid = f"{name}-{task}-{number}"
    base = {"uuid": uuid, "pid": 12, "clock": number}
    events: list[dict[str, Any]] = [
        {
            **base,
            "type": "task-sent",
            "hostname": "gen@producer",
            "name": task,
            "queue": f"{name}-tasks",
            "retries": 0,
            "timestamp": clock,
        },
        {**base, "type": "task-received", "hostname": worker, "name": task, "retries": 0, "timestamp": clock + 0.01},
        {**base, "type": "task-started", "hostname": worker, "timestamp": clock + 0.02},
    ]
    digit = int(task[-1])
    if digit == 0:
        events.append({**base, "type": "task-failed", "hostname": worker, "exception": "KeyError('sku')"})
        return events
    if digit == 1:
        events.append({**base, "type": "task-retried", "hostname": worker, "exception": "Retry in 1s: ValueError('x')"})
    events.append({**base, "type": "task-succeeded", "hostname": worker, "runtime": 0.05 * digit})
    return events


def heartbeat(name: str, index: int) -> dict[str, Any]:
    return {"type": "worker-heartbeat", "hostname": f"celery@{name}-worker-{index}", "active": 1, "timestamp": 1.0}


def fleet_round(names: list[str], pods: int, tasks: list[str], number: int) -> Iterable[tuple[str, bytes]]:
    """Every service's pods' heartbeats and a task of every name, one event per message, services interleaved."""
    for index in range(pods):
        for name in names:
            yield naming.event_exchange_name(name), json.dumps(heartbeat(name, index)).encode()
    for task in tasks:
        for name in names:
            for item in task_events(name, pods, task, number, 1_800_000_000.0 + number):
                yield naming.event_exchange_name(name), json.dumps(item).encode()


def generated_round(count: int, pods: int) -> Iterable[tuple[str, bytes]]:
    """One task of each of `count` generated names, as batches of 100 events per message."""
    exchange = naming.event_exchange_name(GENERATED)
    batch: list[dict[str, Any]] = [heartbeat(GENERATED, index) for index in range(pods)]
    for number in range(count):
        batch += task_events(GENERATED, pods, f"generated.task.{number}0", number, 1_800_000_000.0)
        if len(batch) >= 100:
            yield exchange, json.dumps(batch).encode()
            batch = []
    if batch:
        yield exchange, json.dumps(batch).encode()


def publish(url: str, messages: list[tuple[str, bytes]]) -> None:
    """In a process of its own: framing a hundred thousand messages must not take this one's CPU."""
    process = multiprocessing.Process(target=framed_publisher.publish_all, args=(url, messages))
    process.start()
    process.join()


def events_in(messages: list[tuple[str, bytes]]) -> int:
    return sum(len(decoded) if isinstance(decoded := json.loads(body), list) else 1 for _, body in messages)


def get(url: str, compressed: bool) -> tuple[bytes, float]:
    headers = {"Accept-Encoding": "gzip"} if compressed else {}
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as response:
        body = response.read()
    return body, time.perf_counter() - started


def consumed(operator: OperatorProcess) -> float:
    body, _ = get(operator.metrics_url, compressed=True)
    return sum(float(value) for _, value in CONSUMED.findall(gzip.decompress(body)))


def wait_consumed(operator: OperatorProcess, total: float, timeout: float = 600) -> None:
    deadline, last, last_change = time.monotonic() + timeout, -1.0, time.monotonic()
    while time.monotonic() < deadline:
        done = consumed(operator)
        if done >= total:
            return
        if done != last:
            last, last_change = done, time.monotonic()
        elif time.monotonic() - last_change > 30:
            print(f"  (consumption stopped at {done:,.0f} of {total:,.0f} events)")
            return
        time.sleep(2)
    print(f"  (timeout: {consumed(operator):,.0f} of {total:,.0f} events consumed)")


def ping(kind: str, port: int, cert: str, stop: Any, results: Any) -> None:
    """Requests back to back on one kept-alive connection until `stop`: their durations (liveness GETs, or
    AdmissionReviews over TLS), so that they measure the operator's answer, not our handshakes."""
    import http.client  # noqa: PLC0415  (in the child process only)
    import ssl  # noqa: PLC0415

    if kind == "liveness":
        connection: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        method, path, body, headers = "GET", "/healthz", None, {}
    else:
        context = ssl.create_default_context(cafile=cert)
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, context=context)
        review = json.dumps(admission_review(pod("svc-0000", 99))).encode()
        method, path, body, headers = "POST", "/inject-celery-settings", review, {"Content-Type": "application/json"}
    durations = []
    while not stop.is_set():
        started = time.perf_counter()
        connection.request(method, path, body=body, headers=headers)
        connection.getresponse().read()
        durations.append(time.perf_counter() - started)
        time.sleep(0.01)  # a hundred a second: enough to catch a stall, without taking a core from the operator
    connection.close()
    results.put((kind, durations))


class Pingers:
    """The liveness endpoint and the webhook, asked back to back from two processes meanwhile."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator = operator

    def __enter__(self) -> Pingers:
        self.stop, self.results = multiprocessing.Event(), multiprocessing.Queue()
        liveness_port = int(self.operator.liveness_url.rsplit(":", 1)[1].split("/", 1)[0])
        self.processes = [
            multiprocessing.Process(
                target=ping, args=(kind, port, str(self.operator.webhook_cert), self.stop, self.results)
            )
            for kind, port in (("liveness", liveness_port), ("webhook", self.operator.webhook_port))
        ]
        for process in self.processes:
            process.start()
        time.sleep(0.5)  # both asking before the clock starts
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.durations = dict(self.results.get(timeout=60) for _ in self.processes)
        for process in self.processes:
            process.join()

    def summary(self) -> str:
        liveness = sorted(self.durations["liveness"])
        webhook = sorted(self.durations["webhook"])
        p99 = webhook[min(len(webhook) - 1, int(len(webhook) * 0.99))]
        return (
            f"liveness longest {1000 * liveness[-1]:6.1f} ms (median {1000 * statistics.median(liveness):.1f}),"
            f" webhook p99 {1000 * p99:6.1f} ms, longest {1000 * webhook[-1]:6.1f} ms ({len(webhook)} reviews)"
        )


def samples_per_service(text: bytes) -> dict[str, int]:
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line and not line.startswith(b"#"):
            found = SERVICE_OF_SAMPLE.search(line)
            if found:
                key = found.group(1).decode()
                counts[key] = counts.get(key, 0) + 1
    return counts


def exact_fleet(text: bytes, names: list[str], tasks: list[str], rounds: int) -> int:
    """How many of the fleet's services have exactly their task series: each name's counters as sent."""
    expected = {
        kind: {task: rounds for task in tasks if kind != "failed" or task[-1] == "0"}
        for kind in ("sent", "received", "started", "failed")
    }
    expected["succeeded"] = {task: rounds for task in tasks if task[-1] != "0"}
    expected["retried"] = {task: rounds for task in tasks if task[-1] == "1"}
    found: dict[str, dict[str, dict[str, float]]] = {}
    pattern = re.compile(rb"^celery_task_(\w+)_total\{([^}]*)\} (\S+)$", re.M)
    for kind, labels, value in pattern.findall(text):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels.decode()))
        if float(value):
            per_kind = found.setdefault(fields["service_name"], {}).setdefault(kind.decode(), {})
            per_kind[fields["name"]] = per_kind.get(fields["name"], 0.0) + float(value)
    return sum(1 for name in names if found.get(name) == expected)


def drained(management: rabbitmq.Management, vhost: str) -> None:
    """Until the services' events queues are empty (then 1 s, for the operator to count what it took): found
    through the management API, so that the scrape that follows is the first since the events came."""

    def empty() -> bool:
        queues = management.request("GET", f"/queues/{management.vhost_path(vhost)}?columns=name,messages")
        return all(not queue.get("messages") for queue in queues if queue["name"].endswith(".celeryev"))

    waiting.eventually(empty, timeout=600, interval=0.5, message="the events queues were not drained")
    time.sleep(1)


def scrape_round(
    operator: OperatorProcess,
    broker: tuple[str, rabbitmq.Management, str],
    names: list[str],
    *,
    compressed: bool,
    tasks: bool,
    number: int,
) -> None:
    """An event to every service (a task event: its whole block stale, the worst case; a heartbeat: only its
    few other lines), then a scrape with the pingers, then one with nothing changed."""
    url, management, vhost = broker
    touch = [
        (
            naming.event_exchange_name(name),
            json.dumps(
                {
                    "type": "task-received",
                    "hostname": f"celery@{name}-worker-0",
                    "uuid": f"touch-{number}",
                    "name": "tasks.t02",
                }
                if tasks
                else heartbeat(name, 0)
            ).encode(),
        )
        for name in [*names, GENERATED]
    ]
    publish(url, touch)
    drained(management, vhost)
    assert operator.process is not None
    with Pingers(operator) as pingers:
        cpu = bench.cpu_seconds(operator.process.pid)
        body, seconds = get(operator.metrics_url, compressed)
        cpu = bench.cpu_seconds(operator.process.pid) - cpu
    _, unchanged = get(operator.metrics_url, compressed)
    print(
        f"scrape {number} {'gzip' if compressed else 'plain':5} after {'tasks' if tasks else 'heartbeats':10}:"
        f" {len(body) / 1e6:6.1f} MB in {seconds:5.2f} s, operator CPU {cpu:4.2f} s (unchanged: {unchanged:4.2f} s);"
        f" {pingers.summary()}"
    )


def scrapes(
    operator: OperatorProcess, broker: tuple[str, rabbitmq.Management, str], names: list[str], args: argparse.Namespace
) -> None:
    with Pingers(operator) as idle:
        time.sleep(args.quiet_seconds)
    print(f"no scrape ({args.quiet_seconds:.0f} s): {idle.summary()}")
    for number in range(1, args.scrapes + 1):
        scrape_round(operator, broker, names, compressed=True, tasks=True, number=number)
    scrape_round(operator, broker, names, compressed=True, tasks=False, number=args.scrapes + 1)
    scrape_round(operator, broker, names, compressed=False, tasks=True, number=args.scrapes + 2)


def wait_frozen(operator: OperatorProcess) -> None:
    """Until the operator froze its settled heap for the collector (it logs it)."""
    waiting.eventually(
        lambda: "frozen for the collector" in operator.log(), timeout=600, interval=1, message="no heap freeze"
    )
    time.sleep(2)  # the freeze's own full collection is over


def set_up(api: EmulatedApi, names: list[str], args: argparse.Namespace) -> bool:
    """The pods and the services, until every service consumes its events."""
    started = time.monotonic()
    for name in [*names, GENERATED]:
        for index in range(args.pods):
            api.client.create(PODS, pod(name, index))
        api.client.create(CES, service(name))
    print(f"created in {time.monotonic() - started:.1f}s")
    while (ready := ready_consumers(api)) < len(names) + 1:
        if time.monotonic() - started > args.timeout:
            print(f"timeout: {ready}/{len(names) + 1} consuming after {args.timeout:.0f}s")
            return False
        time.sleep(2)
    print(f"all consuming:   {time.monotonic() - started:.1f}s")
    return True


def ingest(operator: OperatorProcess, url: str, names: list[str], tasks: list[str], args: argparse.Namespace) -> None:
    started = time.monotonic()
    total = 0
    for number in range(args.rounds):
        messages = list(fleet_round(names, args.pods, tasks, number))
        total += events_in(messages)
        publish(url, messages)
    generated = list(generated_round(args.generated_names, args.pods))
    total += events_in(generated)
    publish(url, generated)
    wait_consumed(operator, total)
    print(f"ingested:        {total:,} events in {time.monotonic() - started:.1f}s")


def report_series(operator: OperatorProcess, names: list[str], tasks: list[str], args: argparse.Namespace) -> None:
    body, _ = get(operator.metrics_url, compressed=False)
    per_service = samples_per_service(body)
    fleet = sorted(per_service.get(name, 0) for name in names)
    print(
        f"samples/service: median {statistics.median(fleet):,.0f}, max {fleet[-1]:,}"
        f" (target <= 1,000); {GENERATED}: {per_service.get(GENERATED, 0):,} (target <= 50,000)"
    )
    print(f"samples in all:  {sum(per_service.values()):,}")
    print(f"exact services:  {exact_fleet(body, names, tasks, args.rounds)}/{len(names)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--task-names", type=int, default=25)
    parser.add_argument("--generated-names", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2, help="tasks of every name and service")
    parser.add_argument("--scrapes", type=int, default=3)
    parser.add_argument("--quiet-seconds", type=float, default=10, help="the stalls measured without a scrape")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--operator-args", default="", help="extra arguments of `celery-event-operator run`")
    parser.add_argument("--reference", help="a commit whose operator runs first, for its figures beside these")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped from outside: still remove the vhost
    if args.reference is None:
        return run(args, None)
    with bench.reference_checkout(args.reference) as source:
        print(f"== the operator of {args.reference}")
        with _Figures() as before:
            failed = run(args, source)
    print("== the operator of this checkout")
    with _Figures() as after:
        failed = run(args, None) or failed
    bench.side_by_side(args.reference, before.values, after.values)
    return failed


class _Figures(io.TextIOBase):
    """The figures printed meanwhile ("label: value" lines, named after their section), still printed."""

    LINE = re.compile(r"^(?!-- )([^:]{3,60}):\s+(.*)$")

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self._section = ""
        self._stdout = sys.stdout

    def __enter__(self) -> _Figures:
        sys.stdout = self
        return self

    def __exit__(self, *_: object) -> None:
        sys.stdout = self._stdout

    def write(self, text: str) -> int:
        for line in text.splitlines():
            if line.startswith("-- "):
                self._section = line[3:].split(":")[0] + " · "
            elif match := self.LINE.match(line):
                self.values[self._section + match.group(1).strip()] = match.group(2).strip()
        return self._stdout.write(text)

    def flush(self) -> None:
        self._stdout.flush()


def run(args: argparse.Namespace, source: pathlib.Path | None) -> int:
    """One run with the operator of `source` (None: this checkout's); 1 when its set-up did not finish."""
    with bench.broker_vhost() as (management, vhost, url):
        workdir = pathlib.Path(tempfile.mkdtemp(prefix="ceo-bench-"))
        names = [service_name(index) for index in range(args.services)]
        tasks = [f"tasks.t{number:02d}" for number in range(args.task_names)]
        print(
            f"{args.services} services x {args.pods} pods x {args.task_names} task names, and one service of"
            f" {args.generated_names:,} generated task names; operator log: {workdir / 'operator.log'}"
        )
        with bench.emulated_cluster(workdir, url) as api:
            operator = OperatorProcess(
                api.kubeconfig,
                workdir / "operator.log",
                *args.operator_args.split(),
                resync_seconds=30,
                verbose=False,
                source=source,
            ).start()
            started = time.monotonic()
            assert operator.process is not None
            try:
                if not set_up(api, names, args):
                    return 1
                ingest(operator, url, names, tasks, args)
                report_series(operator, names, tasks, args)
                broker = (url, management, vhost)
                print("-- fresh: right after the set-up and the events")
                scrapes(operator, broker, names, args)
                wait_frozen(operator)
                print(f"-- settled: the operator froze its heap ({time.monotonic() - started:.0f} s after its start)")
                scrapes(operator, broker, names, args)
                print(f"operator RSS:    {bench.rss_mb(operator.process.pid):.0f} MB")
                print(f"overflow Events: {overflow_events(api)}")
            finally:
                operator.stop()
    return 0


def ready_consumers(api: EmulatedApi) -> int:
    return sum(
        1
        for item in api.client.get(CES)["items"]
        for c in (item.get("status") or {}).get("conditions", [])
        if c["type"] == "MonitoringReady" and c["status"] == "True"
    )


def overflow_events(api: EmulatedApi, wait: float = 45.0) -> str:
    """The MetricLabelsOverflowed Events, once there is one (a status pass reports: every 15 s)."""
    deadline = time.monotonic() + wait
    while True:
        found = [
            f"{e['involvedObject']['name']}: {e['message']}"
            for e in api.client.get("/api/v1/namespaces/default/events")["items"]
            if e.get("reason") == "MetricLabelsOverflowed"
        ]
        if found or time.monotonic() > deadline:
            return f"{len(found)}" + "".join(f"\n  {item}" for item in found)
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
