"""Benchmark: wait-time autoscaling against queue-length autoscaling (issue 41) on the real control plane (prints
figures, asserts nothing).

    python -m celery_event_devcluster.rabbitmq run 4.3 -- .venv/bin/python bench/wait_autoscaling.py \\
        [--policies wait mpr-steady mpr-slow] [--phase-seconds 120] [--json /tmp/wait.json]

One control plane (kube-apiserver, etcd, the Deployment and ReplicaSet controllers, the scheduler) with the process
kubelet (tests/support/process_kubelet.py: each admitted pod runs as a real `celery worker`, so a pod's start is a
real worker's start), the chart's operator as its ServiceAccount, RabbitMQ at $AMQP_URL. For each policy, one after
the other, on a namespace and a vhost of its own: a service whose worker Deployment runs bench/wait_app (one task,
`bench.work(seconds, published_at)`, 2 slots a pod: threads pool, `workers.celery.concurrency: 2`), autoscaled from
1 to --max-replicas with the same stabilization and status interval, and a producer in this process publishing the
same trace with the Celery client of the injected settings (`task_send_sent_event` on: the operator sees the
arrivals). The trace, each phase --phase-seconds long (Poisson arrivals, runtimes uniform in ±50 % of the mean):

    steady  4/s x 0.5 s      step  40/s x 0.5 s      burst  4/s x 0.5 s, 200 at once at its start
    slow    4/s x 2.5 s      quiet 0.5/s x 0.5 s

Measured per policy: each task's wait (started_at - published_at, both this machine's clock) with p50/p95/max per
phase by publication time, and p95 once the new pods run (tasks published in a phase's first S seconds left out, S
the longest pod start measured in the run: from the pod's creation to its worker's readiness); worker-seconds (each
pod's life on the API server, from creation to removal, within the trace); the scale decisions (changes of the
Deployment's spec.replicas, polled every 0.5 s) and their direction reversals, all and "unforced" (both decisions in
one phase). Then the verdict of the issue's target.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import json
import math
import os
import pathlib
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tests.support import bench
from tests.support.cluster import ChartOperator, Cluster
from tests.support.kube import ApiError, KubeClient, gone
from tests.support.waiting import eventually

from celery_event_devcluster.controlplane import ControlPlane
from celery_event_operator.core.api import metadata
from celery_event_operator.runtime import app as runtime

APP_DIR = pathlib.Path(__file__).resolve().parent / "wait_app"
APP_MODULE = "wait_work"
EVENT = "bench.work"  # the handler of APP_MODULE
SERVICE = "bench"
DEPLOYMENT = "bench-worker"
SLOTS = 2  # tasks a pod runs at once
POLL_SECONDS = 0.5
POLICIES = ("wait", "mpr-steady", "mpr-slow")


@dataclasses.dataclass(frozen=True)
class Phase:
    name: str
    rate: float  # arrivals a second
    runtime: float  # mean task runtime, seconds
    burst: bool = False  # --burst tasks published at once at the phase's start


PHASES = (
    Phase("steady", 4, 0.5),
    Phase("step", 40, 0.5),
    Phase("burst", 4, 0.5, burst=True),
    Phase("slow", 4, 2.5),
    Phase("quiet", 0.5, 0.5),
)


@dataclasses.dataclass(frozen=True)
class Arrival:
    at: float  # seconds after the trace's start
    seconds: float  # the task's runtime
    phase: str


def trace(phase_seconds: float, seed: int, burst: int) -> list[Arrival]:
    """The same arrivals for every policy (seeded)."""
    rng = random.Random(seed)
    arrivals = []
    for index, phase in enumerate(PHASES):
        start = index * phase_seconds
        if phase.burst:
            arrivals += [Arrival(start, phase.runtime * rng.uniform(0.5, 1.5), phase.name) for _ in range(burst)]
        at = start + rng.expovariate(phase.rate)
        while at < start + phase_seconds:
            arrivals.append(Arrival(at, phase.runtime * rng.uniform(0.5, 1.5), phase.name))
            at += rng.expovariate(phase.rate)
    return arrivals


def messages_per_replica(phase: Phase, target_wait: float) -> int:
    """What a KEDA user would set for a phase: a pod clears SLOTS / runtime tasks a second, so the queue one replica
    is meant for is what it clears within the wait the user accepts."""
    return max(1, math.floor(SLOTS * target_wait / phase.runtime))


def autoscaling(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    common = {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": args.max_replicas,
        "scaleDownStabilizationSeconds": args.stabilization_seconds,
    }
    if policy == "wait":
        return common | {"targetWaitSeconds": args.target_wait}
    return common | {"messagesPerReplica": args.mpr_steady if policy == "mpr-steady" else args.mpr_slow}


def service_body(policy: str, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": SERVICE},
        "spec": {
            "broker": {"secretRef": {"name": "rabbitmq", "key": "url"}},
            "events": {"exchange": "events", "handlers": [{"name": EVENT}]},
            "retry": {"maxRetries": 1},
            "deletionPolicy": "delete",
            "statusIntervalSeconds": args.status_interval,
            "workers": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT},
                "celery": {"concurrency": SLOTS},
            },
            "autoscaling": autoscaling(policy, args),
        },
    }


def deployment_body() -> dict[str, Any]:
    labels = {"app": DEPLOYMENT}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": DEPLOYMENT},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels | {metadata.SERVICE_LABEL: SERVICE}},
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "bench-worker:latest",
                            "command": ["celery", "-A", APP_MODULE, "worker"],
                        }
                    ]
                },
            },
        },
    }


class PolicyRefusedError(Exception):
    """The API server does not take the policy (the CRD has no such field yet)."""


@dataclasses.dataclass
class PodLife:
    name: str
    created: float  # first seen (polled every POLL_SECONDS)
    ready: float | None = None
    deleting: float | None = None
    removed: float | None = None


@dataclasses.dataclass
class Watch:
    """What the pollers saw: the Deployment's spec.replicas changes, the pods' lives, the service's status."""

    replicas: list[tuple[float, int]] = dataclasses.field(default_factory=list)
    pods: dict[str, PodLife] = dataclasses.field(default_factory=dict)
    status: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    errors: int = 0


class Run:
    """One policy on a namespace and a vhost of its own."""

    def __init__(
        self, cluster: Cluster, operator: ChartOperator, policy: str, args: argparse.Namespace, workdir: pathlib.Path
    ) -> None:
        self.cluster, self.operator, self.policy, self.args = cluster, operator, policy, args
        self.client: KubeClient = cluster.client
        self.workdir = workdir / policy
        self.records = self.workdir / "records"
        self.records.mkdir(parents=True)
        self.namespace = cluster.create_namespace(f"bench-{policy}")
        self.ces = f"/apis/celeryevents.io/v1alpha1/namespaces/{self.namespace}/celeryeventservices/{SERVICE}"
        self.deployment = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{DEPLOYMENT}"
        self.pods = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector=app%3D{DEPLOYMENT}"
        self.watch = Watch()
        self._stop = threading.Event()

    # -- set-up -----------------------------------------------------------------------------------------------

    def start(self, vhost_url: str) -> None:
        self.cluster.kubelet.run_workers(
            self.namespace,
            APP_DIR,
            APP_MODULE,
            "--pool=threads",
            f"--concurrency={SLOTS}",
            # The workers run this checkout's runtime, as the operator does (PYTHONPATH of the bench).
            env={"BENCH_RECORDS": str(self.records), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
        )
        self.client.create(
            f"/api/v1/namespaces/{self.namespace}/secrets",
            {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rabbitmq"}, "stringData": {"url": vhost_url}},
        )
        body = service_body(self.policy, self.args)
        try:
            created = self.client.create(
                f"/apis/celeryevents.io/v1alpha1/namespaces/{self.namespace}/celeryeventservices", body
            )
        except ApiError as exc:
            raise PolicyRefusedError(f"the API server refused the service: {exc}") from None
        # An unknown field is pruned by the API server, not refused: a policy it dropped was not asked for.
        kept = created["spec"].get("autoscaling", {})
        lost = sorted(set(body["spec"]["autoscaling"]) - set(kept))
        if lost:
            self.client.delete(self.ces)
            raise PolicyRefusedError(f"the CRD has no {', '.join(lost)} (pruned by the API server)")
        self.autoscaling = kept
        eventually(self._ready, timeout=90, interval=0.5, message="the service never got Ready")
        self.client.create(f"/apis/apps/v1/namespaces/{self.namespace}/deployments", deployment_body())
        eventually(self._settled, timeout=120, interval=0.5, message="the workers never settled")

    def _ready(self) -> bool:
        conditions = (self.client.get(self.ces).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _settled(self) -> bool:
        """One pod, of the template the operator stamped with the settings hash, running, and nothing else."""
        deployment = self.client.get(self.deployment)
        rolled = deployment.get("status", {})
        stamped = (deployment["spec"]["template"]["metadata"].get("annotations") or {}).get(metadata.HASH_ANNOTATION)
        pods = self.client.get(self.pods)["items"]
        return bool(
            stamped
            and rolled.get("observedGeneration") == deployment["metadata"]["generation"]
            and rolled.get("updatedReplicas") == rolled.get("readyReplicas") == rolled.get("replicas") == 1
            and len(pods) == 1
            and len(self.cluster.kubelet.workers(self.namespace)) == 1
        )

    def producer_app(self, vhost_url: str) -> Any:
        """The Celery client a producer of this service runs: the service's injected settings (the ConfigMap's
        settings.json: event exchange, `task_send_sent_event`, confirms), the broker of its Secret."""
        configmap = self.client.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{SERVICE}-celery-events")
        path = self.workdir / "settings.json"
        path.write_text(configmap["data"]["settings.json"])
        before = os.environ.get(runtime.SETTINGS_ENV)
        os.environ[runtime.SETTINGS_ENV] = str(path)
        try:
            return runtime.events_app(broker_url=vhost_url)
        finally:
            if before is None:
                del os.environ[runtime.SETTINGS_ENV]
            else:
                os.environ[runtime.SETTINGS_ENV] = before

    # -- the trace --------------------------------------------------------------------------------------------

    def poll(self) -> None:
        """Every POLL_SECONDS: the Deployment's spec.replicas and the pods; every 2 s the service's status."""
        rounds = 0
        while not self._stop.is_set():
            now = time.time()
            try:
                replicas = int(self.client.get(self.deployment)["spec"]["replicas"])
                if not self.watch.replicas or self.watch.replicas[-1][1] != replicas:
                    self.watch.replicas.append((now, replicas))
                seen = set()
                for pod in self.client.get(self.pods)["items"]:
                    uid = pod["metadata"]["uid"]
                    seen.add(uid)
                    life = self.watch.pods.setdefault(uid, PodLife(pod["metadata"]["name"], now))
                    conditions = pod.get("status", {}).get("conditions") or []
                    if life.ready is None and any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                        life.ready = now
                    if life.deleting is None and pod["metadata"].get("deletionTimestamp"):
                        life.deleting = now
                for uid, life in self.watch.pods.items():
                    if uid not in seen and life.removed is None:
                        life.removed = now
                if rounds % 4 == 0:
                    status = self.client.get(self.ces).get("status") or {}
                    kept = {key: value for key, value in status.items() if key != "conditions"}
                    self.watch.status.append({"at": now, **kept})
            except (ApiError, OSError):
                self.watch.errors += 1
            rounds += 1
            self._stop.wait(max(0.0, POLL_SECONDS - (time.time() - now)))

    def run_trace(self, arrivals: Sequence[Arrival], vhost_url: str) -> dict[str, Any]:
        app = self.producer_app(vhost_url)
        send = app.event(EVENT)(lambda seconds, published_at: None)
        poller = threading.Thread(target=self.poll, name=f"poll-{self.policy}", daemon=True)
        poller.start()
        started = time.time()
        lag, failed = 0.0, 0
        for arrival in arrivals:
            delay = started + arrival.at - time.time()
            if delay > 0:
                time.sleep(delay)
            lag = max(lag, -delay)
            try:
                send(arrival.seconds, time.time())
            except Exception:  # noqa: BLE001 — counted and printed: a lost publish is the bench's, not the policy's
                failed += 1
        ended = started + len(PHASES) * self.args.phase_seconds
        if time.time() < ended:
            time.sleep(ended - time.time())
        # Until every task ran (or --drain-seconds): the waits of the last tasks are part of the trace.
        with contextlib.suppress(AssertionError):
            eventually(lambda: len(self.tasks()) >= len(arrivals) - failed, timeout=self.args.drain_seconds, interval=1)
        drained = time.time()
        self._stop.set()
        poller.join(10)
        app.close()
        return {"started": started, "ended": ended, "drained": drained, "producer_lag": lag, "publish_failed": failed}

    def tasks(self) -> dict[str, dict[str, Any]]:
        """The tasks run, by id (a task run twice counts by its first start)."""
        found: dict[str, dict[str, Any]] = {}
        for path in self.records.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if record["id"] not in found or record["started_at"] < found[record["id"]]["started_at"]:
                        found[record["id"]] = record
        return found

    def events_seen(self) -> dict[str, float]:
        """The task events the operator counted for this service (`celery_task_{sent,started}_total`): the wait
        policy sees the arrivals only through task-sent."""
        counted = {"sent": 0.0, "started": 0.0}
        try:
            scraped = self.operator.process.scrape()
        except OSError:
            return {}
        for line in scraped.splitlines():
            for kind in counted:
                if line.startswith(f"celery_task_{kind}_total{{") and f'namespace="{self.namespace}"' in line:
                    counted[kind] += float(line.rsplit(" ", 1)[1])
        return counted

    def scaled_events(self) -> list[str]:
        """The operator's Scaled Events (each names its reason)."""
        events = self.client.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        ordered = sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        return [f"{e.get('lastTimestamp')} {e['message']}" for e in ordered if e.get("reason") == "Scaled"]

    # -- tear-down --------------------------------------------------------------------------------------------

    def remove(self) -> None:
        """The service, its workers (gone before the next policy's run: they would share its CPU) and namespace."""
        with contextlib.suppress(ApiError):
            self.client.delete(self.ces)
        eventually(lambda: gone(self.client, self.ces), timeout=120, interval=1, message="the service stayed")
        with contextlib.suppress(ApiError):
            self.client.delete(self.deployment)
        eventually(
            lambda: not self.client.get(self.pods)["items"] and not self.cluster.kubelet.workers(self.namespace),
            timeout=180,
            interval=1,
            message="the worker pods stayed",
        )
        with contextlib.suppress(ApiError):
            self.client.delete(f"/api/v1/namespaces/{self.namespace}")


# -- figures --------------------------------------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float | None:
    """Nearest rank."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def phase_of(at: float, phase_seconds: float) -> str:
    index = int(at // phase_seconds)
    return PHASES[index].name if 0 <= index < len(PHASES) else ("before" if index < 0 else "after")


def reversals(decisions: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Changes of direction between consecutive decisions: all of them, and those whose two decisions fall in
    one phase (unforced: the trace's own changes of load force the others)."""
    every = unforced = 0
    for before, after in itertools.pairwise(decisions):
        if (before["to"] > before["from"]) != (after["to"] > after["from"]):
            every += 1
            unforced += before["phase"] == after["phase"]
    return every, unforced


def figures(
    run: Run, arrivals: Sequence[Arrival], times: dict[str, Any], settle_seconds: float | None
) -> dict[str, Any]:
    args = run.args
    started, ended, drained = times["started"], times["ended"], times["drained"]
    tasks = run.tasks()
    published = len(arrivals) - times["publish_failed"]
    starts = [
        life.ready - life.created
        for life in run.watch.pods.values()
        if life.ready is not None and started <= life.created <= ended
    ]
    settle = settle_seconds if settle_seconds is not None else max(starts, default=0.0)
    waits: dict[str, list[tuple[float, float]]] = {phase.name: [] for phase in PHASES}  # (offset in phase, wait)
    for task in tasks.values():
        offset = task["published_at"] - started
        name = phase_of(offset, args.phase_seconds)
        if name in waits:
            waits[name].append((offset % args.phase_seconds, task["started_at"] - task["published_at"]))
    not_started = max(0, published - len(tasks))
    phases = {}
    for phase in PHASES:
        every = [wait for _, wait in waits[phase.name]]
        settled = [wait for offset, wait in waits[phase.name] if offset >= settle]
        phases[phase.name] = {
            "tasks": len(every),
            "p50": percentile(every, 0.5),
            "p95": percentile(every, 0.95),
            "max": max(every, default=None),
            "p95_settled": percentile(settled, 0.95),
            "settled_tasks": len(settled),
        }
    decisions = []
    for (_, before), (at, after) in itertools.pairwise(run.watch.replicas):
        if started <= at <= ended:
            decisions.append(
                {"at": at - started, "from": before, "to": after, "phase": phase_of(at - started, args.phase_seconds)}
            )
    reversed_, unforced = reversals(decisions)
    minutes = (ended - started) / 60
    worker_seconds = sum(
        max(0.0, min(life.removed or ended, ended) - max(life.created, started)) for life in run.watch.pods.values()
    )
    return {
        "policy": run.policy,
        "autoscaling": run.autoscaling,
        "phases": phases,
        "pod_start_seconds": {
            "count": len(starts),
            "median": statistics.median(starts) if starts else None,
            "max": max(starts, default=None),
        },
        "settle_seconds": settle,
        "worker_seconds": worker_seconds,
        "most_replicas": max((r for _, r in run.watch.replicas), default=None),
        "decisions": decisions,
        "reversals": reversed_,
        "reversals_per_10_min": reversed_ * 10 / minutes,
        "unforced_reversals": unforced,
        "unforced_per_10_min": unforced * 10 / minutes,
        "published": published,
        "not_started": not_started,
        "drain_seconds": drained - ended,
        "producer_lag_seconds": times["producer_lag"],
        "publish_failed": times["publish_failed"],
        "poll_errors": run.watch.errors,
        "operator_counted": run.events_seen(),
        "scaled_events": run.scaled_events(),
        "replicas_timeline": [(at - started, replicas) for at, replicas in run.watch.replicas],
        "pods": [dataclasses.asdict(life) for life in run.watch.pods.values()],
        "status_timeline": run.watch.status,
        "tasks": sorted(tasks.values(), key=lambda task: task["published_at"]),
    }


def meets(result: dict[str, Any], target: float) -> bool:
    """p95 within the target in every phase once the new pods run."""
    return (
        all(phase["p95_settled"] is not None and phase["p95_settled"] <= target for phase in result["phases"].values())
        and result["not_started"] == 0
    )


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def print_table(results: Sequence[dict[str, Any]]) -> None:
    width = 28
    print(f"\n{'figure':<30}" + "".join(f" | {r['policy']:<{width}}" for r in results))

    def row(name: str, cell: Callable[[dict[str, Any]], str]) -> None:
        print(f"{name:<30}" + "".join(f" | {cell(r):<{width}}" for r in results))

    row(
        "autoscaling",
        lambda r: ", ".join(
            f"{k}={v}" for k, v in r["autoscaling"].items() if k in ("targetWaitSeconds", "messagesPerReplica")
        ),
    )

    def waits(phase: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: "/".join(seconds(r["phases"][phase][k]) for k in ("p50", "p95", "max")) + " s"

    def settled(phase: str) -> Callable[[dict[str, Any]], str]:
        return lambda r: f"{seconds(r['phases'][phase]['p95_settled'])} s ({r['phases'][phase]['settled_tasks']} tasks)"

    for phase in PHASES:
        row(f"{phase.name} wait p50/p95/max", waits(phase.name))
        row(f"{phase.name} p95 once pods run", settled(phase.name))
    row(
        "pod start median/max",
        lambda r: "{}/{} s ({} pods)".format(
            *(seconds(r["pod_start_seconds"][k]) for k in ("median", "max")), r["pod_start_seconds"]["count"]
        ),
    )
    row("left out of a phase (S)", lambda r: f"{r['settle_seconds']:.1f} s")
    row("worker-seconds", lambda r: f"{r['worker_seconds']:.0f} (most replicas {r['most_replicas']})")
    row("scale decisions", lambda r: str(len(r["decisions"])))
    row("reversals (per 10 min)", lambda r: f"{r['reversals']} ({r['reversals_per_10_min']:.1f})")
    row("unforced (per 10 min)", lambda r: f"{r['unforced_reversals']} ({r['unforced_per_10_min']:.1f})")
    row("tasks published/not started", lambda r: f"{r['published']}/{r['not_started']}")
    row(
        "task-sent, -started counted",
        lambda r: "{}, {} by the operator".format(*(r["operator_counted"].get(k, "-") for k in ("sent", "started"))),
    )
    row("producer lag, publish errors", lambda r: f"{r['producer_lag_seconds']:.2f} s, {r['publish_failed']}")


def verdict(results: Sequence[dict[str, Any]], target: float) -> list[str]:
    """The issue's target, judged on this run."""
    by_policy = {r["policy"]: r for r in results}
    lines = []
    meeting = [r for r in results if r["policy"] != "wait" and meets(r, target)]
    for r in results:
        missed = [
            f"{name} {seconds(p['p95_settled'])} s"
            for name, p in r["phases"].items()
            if p["p95_settled"] is None or p["p95_settled"] > target
        ]
        lines.append(
            f"{r['policy']}: p95 once pods run within {target:g} s in every phase: "
            + ("yes" if not missed and not r["not_started"] else f"NO ({', '.join(missed) or 'tasks not started'})")
        )
    wait = by_policy.get("wait")
    if wait is None:
        lines.append("wait: not run (no verdict on the issue's target)")
        return lines
    cheapest = min(meeting, key=lambda r: r["worker_seconds"], default=None)
    if cheapest is None:
        lines.append("cost: no queue-length setting run met the same p95 in every phase (nothing to compare with)")
    else:
        cheaper = wait["worker_seconds"] <= cheapest["worker_seconds"]
        lines.append(
            f"cost: wait {wait['worker_seconds']:.0f} worker-seconds against {cheapest['policy']} "
            f"{cheapest['worker_seconds']:.0f} (the cheapest meeting the p95): " + ("met" if cheaper else "MISSED")
        )
    lines.append(
        f"reversals: {wait['unforced_per_10_min']:.1f} unforced per 10 min (target <= 2): "
        + ("met" if wait["unforced_per_10_min"] <= 2 else "MISSED")
        + f"; all reversals {wait['reversals_per_10_min']:.1f} per 10 min"
        + " (each change of load between phases may force one)"
    )
    return lines


# -- main -----------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def control_plane(workdir: pathlib.Path) -> Iterator[Cluster]:
    """One control plane with the process kubelet (as tests/support/cluster.py's fixture)."""
    plane = ControlPlane(workdir / "controlplane")
    try:
        plane.start()
        cluster = Cluster(plane, workdir)
        cluster.kubelet.start()
        try:
            yield cluster
        finally:
            cluster.kubelet.stop()
            for error in cluster.kubelet.errors:
                print(f"kubelet: {error}")
    finally:
        plane.stop()


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--phase-seconds", type=float, default=120, help="each phase's length (default 120)")
    parser.add_argument("--target-wait", type=int, default=10, help="targetWaitSeconds, and what p95 is judged by")
    steady = next(p for p in PHASES if p.name == "steady")
    slow = next(p for p in PHASES if p.name == "slow")
    parser.add_argument("--mpr-steady", type=int, help="messagesPerReplica of mpr-steady (default: derived)")
    parser.add_argument("--mpr-slow", type=int, help="messagesPerReplica of mpr-slow (default: derived)")
    parser.add_argument("--max-replicas", type=int, default=30)
    parser.add_argument("--stabilization-seconds", type=int, default=30, help="scaleDownStabilizationSeconds")
    parser.add_argument("--status-interval", type=int, default=5, help="statusIntervalSeconds (1..3600)")
    parser.add_argument("--burst", type=int, default=200, help="tasks published at once at the burst's start")
    parser.add_argument("--drain-seconds", type=float, default=180, help="how long to wait for the last tasks")
    parser.add_argument("--settle-seconds", type=float, help="S: left out of each phase (default: longest pod start)")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--json", type=pathlib.Path, help="save every figure, decision, pod and task here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, records)")
    args = parser.parse_args(argv)
    args.mpr_steady = args.mpr_steady or messages_per_replica(steady, args.target_wait)
    args.mpr_slow = args.mpr_slow or messages_per_replica(slow, args.target_wait)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    arrivals = trace(args.phase_seconds, args.seed, args.burst)
    print(
        f"trace: {len(PHASES)} phases of {args.phase_seconds:g} s, {len(arrivals)} tasks: "
        + ", ".join(
            f"{p.name} {p.rate:g}/s x {p.runtime:g} s" + (f" + {args.burst} at once" if p.burst else "") for p in PHASES
        )
    )
    print(
        f"messagesPerReplica = slots x target / mean runtime (what one pod of {SLOTS} slots clears within "
        f"{args.target_wait} s): mpr-steady {SLOTS} x {args.target_wait} / 0.5 -> {args.mpr_steady}, "
        f"mpr-slow {SLOTS} x {args.target_wait} / 2.5 -> {args.mpr_slow}"
    )
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ceo-wait-bench-"))
    results: list[dict[str, Any]] = []
    refused: dict[str, str] = {}
    try:
        with control_plane(workdir) as cluster:
            operator = ChartOperator(cluster, {}, workdir, resync_seconds=30).install()
            operator.start_all()
            try:
                for policy in args.policies:
                    with bench.broker_vhost() as (_, _, vhost_url):
                        run = Run(cluster, operator, policy, args, workdir)
                        try:
                            run.start(vhost_url)
                        except PolicyRefusedError as exc:
                            refused[policy] = str(exc)
                            print(f"{policy}: refused: {exc}")
                            run.remove()
                            continue
                        print(f"{policy}: running the trace ({time.strftime('%H:%M:%S')})", flush=True)
                        times = run.run_trace(arrivals, vhost_url)
                        result = figures(run, arrivals, times, args.settle_seconds)
                        results.append(result)
                        print(
                            f"{policy}: {len(result['decisions'])} decisions, {result['worker_seconds']:.0f} "
                            f"worker-seconds, most replicas {result['most_replicas']}",
                            flush=True,
                        )
                        run.remove()
            finally:
                operator.stop()
    finally:
        if args.keep:
            print(f"work directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if results:
        print_table(results)
        print()
        for line in verdict(results, args.target_wait):
            print(line)
    if args.json:
        summary = {"args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}}
        args.json.write_text(json.dumps(summary | {"refused": refused, "results": results}, indent=1))
        print(f"saved: {args.json}")


if __name__ == "__main__":
    main()
