"""An API server having a bad minute (issue #26), shared by its test (what must hold) and its benchmark (the
webhook's answer times, bench/api_faults.py): the real operator talks to the emulated API through a proxy that, for
a window, answers 30 % of requests with 500 and 20 % with 429 (Retry-After), every status patch with 409, and cuts
every watch after 5 s, while services are created, deleted and changed, and AdmissionReviews keep coming.
"""

from __future__ import annotations

import dataclasses
import pathlib
import statistics
import threading
import time
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator.core.api.models import parse_spec
from celery_event_operator.core.topology import plan
from tests.support import rabbitmq
from tests.support.fault_proxy import FaultProxy
from tests.support.kube import EmulatedApi, eventually, gone
from tests.support.operator_process import OperatorProcess, admission_review, worker_pod

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
WINDOW_SECONDS = 60.0
RESYNC_SECONDS = 10.0
BASELINE_REVIEWS = 200  # the webhook's answers before the window: its p99 on this machine
SERVICES = [f"s{i}" for i in range(10)]
UNTOUCHED = SERVICES[1:9]  # s0 is changed, s9 deleted, s10 created in the window
HANDLER = "orders.order.created"


def service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "celeryevents.io/v1alpha1",
        "kind": "CeleryEventService",
        "metadata": {"name": name},
        "spec": {
            "broker": {"secretRef": {"name": f"{name}-broker", "key": "url"}},
            "events": {"handlers": [{"name": HANDLER}]},
            "retry": {"maxRetries": 3},
            "statusIntervalSeconds": 3,
            "workers": {"scaleTargetRef": {"kind": "Deployment", "name": f"{name}-worker"}, "replicas": 1},
            **spec,
        },
    }


def deployment(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "w", "image": "w"}]}},
        },
    }


def healed(api: EmulatedApi, name: str, queue_length: int) -> bool:
    body = api.client.get(f"{CES}/{name}")
    status = body.get("status") or {}
    ready: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
    return (
        ready.get("status") == "True"
        and status.get("observedGeneration") == body["metadata"]["generation"]
        and status.get("queueLength") == queue_length
    )


def consumers(management: rabbitmq.Management, vhost: str) -> dict[str, set[str]]:
    """The consumer tags on each service's events queue (`S.celeryev`), as the broker has them now."""
    found: dict[str, set[str]] = {}
    for consumer in management.request("GET", f"/consumers/{management.vhost_path(vhost)}"):
        queue = consumer["queue"]["name"]
        if queue.endswith(".celeryev"):
            found.setdefault(queue.removesuffix(".celeryev"), set()).add(consumer["consumer_tag"])
    return found


class Sampler(threading.Thread):
    """Throughout the window: AdmissionReviews for the untouched services' pods (their latency), and once a second
    the untouched services' Ready and the broker's consumers of their events queues."""

    def __init__(
        self,
        api: EmulatedApi,
        operator: OperatorProcess,
        management: rabbitmq.Management,
        vhost: str,
        proxy: FaultProxy,
    ) -> None:
        super().__init__(daemon=True)
        self.api, self.operator, self.management, self.vhost, self.proxy = api, operator, management, vhost, proxy
        self.latencies: list[float] = []  # in the window
        self.before: list[float] = []  # before it: the same webhook on the same machine, the API answering
        self.uninjected: list[str] = []
        self.not_ready: list[tuple[str, str]] = []
        self.without_consumer: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        next_sample = 0.0
        count = 0
        while not self.stop.is_set():
            name = UNTOUCHED[count % len(UNTOUCHED)]
            count += 1
            review = admission_review(worker_pod({"celeryevents.io/service": name}))
            faulting, started = self.proxy.faulting, time.monotonic()
            answer = self.operator.admit(review)
            (self.latencies if faulting else self.before).append(time.monotonic() - started)
            if "patch" not in answer["response"]:
                self.uninjected.append(name)
            if faulting and time.monotonic() >= next_sample:
                next_sample = time.monotonic() + 1.0
                self._sample()
            self.stop.wait(0.02)

    def _sample(self) -> None:
        for name in UNTOUCHED:
            status = self.api.client.get(f"{CES}/{name}").get("status") or {}
            ready: dict[str, Any] = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
            if ready.get("status") != "True":
                self.not_ready.append((name, ready.get("reason", "")))
        held = consumers(self.management, self.vhost)
        self.without_consumer += [name for name in UNTOUCHED if not held.get(name)]


def start_services(api: EmulatedApi, vhost_url: str) -> dict[str, int]:
    """The ten services Ready, with a known number of messages waiting in each handler queue: the queue lengths to
    find after the faults (none in the one to delete: its empty queues are removed, a non-empty one would be kept)."""
    for name in SERVICES:
        api.client.create(CES, service(name, **({"deletionPolicy": "delete"} if name == "s9" else {})))
    expected = {name: index + 1 for index, name in enumerate(SERVICES[:-1])} | {"s9": 0}
    eventually(lambda: all(healed(api, n, 0) for n in SERVICES), timeout=60, message="never Ready")
    with Connection(vhost_url, connect_timeout=5) as connection:
        channel = connection.channel()
        for name, count in expected.items():
            for _ in range(count):
                channel.basic_publish(amqp.Message("e"), exchange="", routing_key=f"{name}.{HANDLER}")
    eventually(lambda: all(healed(api, n, expected[n]) for n in SERVICES), timeout=30, message="no queue lengths")
    return expected


def bad_minute(api: EmulatedApi, proxy: FaultProxy, sampler: Sampler) -> None:
    """The window: a create, a delete and a spec change inside it, each once the faults had an effect on what came
    before, and AdmissionReviews throughout (and before)."""
    sampler.start()
    eventually(lambda: len(sampler.before) >= BASELINE_REVIEWS, timeout=30, message="no webhook answers before")
    proxy.open_window(WINDOW_SECONDS)
    eventually(lambda: proxy.counts["watch cut"] > 0, timeout=WINDOW_SECONDS / 2, message="no watch cut")
    api.client.create(CES, service("s10"))
    eventually(  # taken up through the faults: kopf's finalizer is on it
        lambda: api.client.get(f"{CES}/s10")["metadata"].get("finalizers"),
        timeout=WINDOW_SECONDS / 2,
        message="the service created in the window was never taken up",
    )
    refused_writes = proxy.counts["409"]
    api.client.delete(f"{CES}/s9")
    eventually(lambda: proxy.counts["409"] > refused_writes, timeout=WINDOW_SECONDS / 2, message="no status write")
    api.client.merge_patch(f"{CES}/s0", {"spec": {"retry": {"maxRetries": 1}}})
    assert proxy.faulting, "the create, the delete and the change came after the window"
    eventually(lambda: not proxy.faulting, timeout=WINDOW_SECONDS + 5, message="the window never closed")
    sampler.stop.set()
    sampler.join(15)


def planned_queues(api: EmulatedApi, services: list[str]) -> set[str]:
    planned: set[str] = set()
    for name in services:
        spec = parse_spec(api.client.get(f"{CES}/{name}")["spec"])
        planned |= {queue.name for queue in plan.plan(name, spec).queues}
    return planned


@dataclasses.dataclass
class Outcome:
    """What a bad minute left: the faults dealt, the webhook's answer times, what the samples saw, the healing."""

    proxy: FaultProxy
    sampler: Sampler
    operator_log: str
    tags_before: dict[str, set[str]]
    tags_after: dict[str, set[str]]
    expected: dict[str, int]  # the live services after the window, with the queue length each must report
    heal_seconds: float

    def webhook_figures(self) -> str:
        def figures(durations: list[float]) -> str:
            ordered = sorted(durations)
            p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
            return (
                f"{len(ordered)} reviews, p50 {statistics.median(ordered) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
                f"max {ordered[-1] * 1000:.1f} ms"
            )

        return f"webhook during the faults: {figures(self.sampler.latencies)}; before: {figures(self.sampler.before)}"


def run(
    api: EmulatedApi, vhost_url: str, vhost: str, management: rabbitmq.Management, workdir: pathlib.Path
) -> Outcome:
    """Ten services Ready, then the window with its create, delete and change, then healing awaited (the operator
    stopped at the end)."""
    for name in [*SERVICES, "s10"]:  # a Secret each (one broker): many Secret reads fall in the window
        api.client.create(
            "/api/v1/namespaces/default/secrets",
            {"metadata": {"name": f"{name}-broker"}, "stringData": {"url": vhost_url}},
        )
        api.client.create(DEPLOYMENTS, deployment(f"{name}-worker"))
    with FaultProxy(api.url) as proxy:
        kubeconfig = proxy.write_kubeconfig(workdir / "faulty-kubeconfig")
        operator = OperatorProcess(kubeconfig, workdir / "operator.log", resync_seconds=RESYNC_SECONDS).start()
        try:
            expected = start_services(api, vhost_url)
            # The management API lists consumers from statistics the broker emits every few seconds.
            eventually(
                lambda: all(len(consumers(management, vhost).get(n, ())) == 1 for n in SERVICES),
                timeout=20,
                interval=0.5,
                message="a Ready service without exactly one consumer on its events queue",
            )
            tags_before = consumers(management, vhost)
            sampler = Sampler(api, operator, management, vhost, proxy)
            bad_minute(api, proxy, sampler)
            faults_ended = time.monotonic()
            expected = {name: count for name, count in expected.items() if name != "s9"} | {"s10": 0}
            eventually(
                lambda: all(healed(api, n, c) for n, c in expected.items()) and gone(api.client, f"{CES}/s9"),
                timeout=RESYNC_SECONDS + 20,
                interval=0.5,
                message="not healed after the faults",
            )
            heal_seconds = time.monotonic() - faults_ended
            tags_after = consumers(management, vhost)
        finally:
            operator.stop()
    return Outcome(proxy, sampler, operator.log(), tags_before, tags_after, expected, heal_seconds)
