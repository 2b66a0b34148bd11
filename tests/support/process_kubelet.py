"""A kubelet of processes for the real control plane: the one part of Kubernetes that cannot run here (no
container runtime, no images), so it is stood in for, and only it.

It registers a Node (Ready, with room for many pods) for the scheduler to bind pods to, and watches the pods bound
to it. For a pod of a namespace a test registered with `run_workers`, it starts the real Celery worker locally
with exactly the environment and mounted settings the API server admitted the pod with (through the real call to
the operator's webhook) — the image and command are the mocked part: every such pod runs
`celery -A <module> worker` from the test's app directory. Pods of other namespaces run nothing (a pause
container). Either way it reports the pod Running and Ready at 127.0.0.1. A deleted pod (deletionTimestamp) gets
SIGTERM, then SIGKILL once its grace period has passed, as a kubelet does; then the pod is removed (grace 0).
Rollouts, scale-downs and evictions are made by Kubernetes' own controllers and API.
"""

from __future__ import annotations

import contextlib
import datetime
import pathlib
import threading
from collections.abc import Callable
from typing import Any

from tests.support.kube import ApiError, KubeClient
from tests.support.waiting import eventually
from tests.support.workers import Worker, as_kubelet_would

NODE = "process-node"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_manifest(name: str = NODE) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "256Gi", "pods": "500", "ephemeral-storage": "500Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "a process kubelet (tests/support/process_kubelet.py)",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.37.2", "operatingSystem": "linux", "architecture": "amd64"},
        },
    }


class _WorkerSpec:
    def __init__(self, app_dir: pathlib.Path, module: str, options: tuple[str, ...], env: dict[str, str]) -> None:
        self.app_dir, self.module, self.options, self.env = app_dir, module, options, env


class ProcessKubelet:
    def __init__(self, client: KubeClient, directory: pathlib.Path, node: str = NODE, interval: float = 0.2) -> None:
        self.client = client
        self.directory = directory
        self.node = node
        self.interval = interval
        self._specs: dict[str, _WorkerSpec] = {}
        self._workers: dict[str, Worker] = {}  # by pod uid
        self._seen: set[str] = set()
        self._terminating: set[str] = set()
        self._names: dict[str, tuple[str, str]] = {}  # uid → (namespace, name)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="process-kubelet", daemon=True)
        self.errors: list[str] = []

    # -- what the tests use -----------------------------------------------------------------------------------

    def run_workers(
        self, namespace: str, app_dir: pathlib.Path, module: str, *options: str, env: dict[str, str] | None = None
    ) -> None:
        """Pods bound from now on in `namespace` run `celery -A module worker *options` in `app_dir`, named
        `celery@<pod name>` as in a container (whose host name is the pod's); `env` is what the image would add."""
        self._specs[namespace] = _WorkerSpec(app_dir, module, options, env or {})

    def workers(self, namespace: str) -> dict[str, Worker]:
        """The running workers of a namespace, by pod name."""
        with self._lock:
            return {
                self._names[uid][1]: worker
                for uid, worker in self._workers.items()
                if self._names[uid][0] == namespace and uid not in self._terminating
            }

    # -- the loop ---------------------------------------------------------------------------------------------

    def start(self) -> ProcessKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            self.client.create("/api/v1/nodes", node_manifest(self.node))
        except ApiError as exc:
            if exc.status != 409:
                raise
        # A Node's status is its kubelet's to write: the API drops it on create.
        self.client.merge_patch(f"/api/v1/nodes/{self.node}/status", {"status": node_manifest(self.node)["status"]})
        # The TaintNodesByCondition admission plugin taints a new node not-ready; the node-lifecycle controller
        # lifts the taint once the node reports Ready. That controller also evicts from nodes whose kubelet's
        # Lease lapses, which is not the behaviour under test: it does not run, and the taint is lifted here.
        self.client.merge_patch(f"/api/v1/nodes/{self.node}", {"spec": {"taints": None}})
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            with contextlib.suppress(Exception):
                worker.kill()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                pods = self.client.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.node}")["items"]
            except (ApiError, OSError) as exc:
                self.errors.append(f"listing pods: {exc}")
                continue
            for pod in pods:
                uid = pod["metadata"]["uid"]
                self._names[uid] = (pod["metadata"]["namespace"], pod["metadata"]["name"])
                if pod["metadata"].get("deletionTimestamp"):
                    if uid not in self._terminating:
                        self._terminating.add(uid)
                        self._in_thread(self._terminate, pod)
                elif uid not in self._seen:
                    self._seen.add(uid)
                    self._in_thread(self._run, pod)

    def _in_thread(self, work: Callable[[dict[str, Any]], None], pod: dict[str, Any]) -> None:
        def guarded() -> None:
            try:
                work(pod)
            except Exception as exc:  # noqa: BLE001 — a thread cannot raise to the test: reported at teardown
                self.errors.append(f"{work.__name__} {pod['metadata']['name']}: {exc!r}")

        threading.Thread(target=guarded, daemon=True).start()

    def _pod_path(self, pod: dict[str, Any]) -> str:
        return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    def _run(self, pod: dict[str, Any]) -> None:
        namespace, name, uid = pod["metadata"]["namespace"], pod["metadata"]["name"], pod["metadata"]["uid"]
        spec = self._specs.get(namespace)
        started = _now()
        if spec is not None:
            env = {**spec.env, **as_kubelet_would(pod, self.client, self.directory / namespace / name / "settings")}
            log = self.directory / f"{namespace}.{name}.log"
            worker = Worker(spec.app_dir, spec.module, env, log, "-n", f"celery@{name}", *spec.options)
            with self._lock:
                self._workers[uid] = worker
            try:
                worker.start()
            except RuntimeError:
                if uid not in self._terminating:  # else deleted while it started: stopped by _terminate
                    self._report_crashed(pod, started)
                return
            if uid in self._terminating:
                return
        self._report_running(pod, started)

    def _report_crashed(self, pod: dict[str, Any], started: str) -> None:
        """A container that exited at start, as a kubelet reports it between restarts: Running, not Ready."""
        statuses = [
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 1,
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "the worker exited at start"}},
            }
            for container in pod["spec"]["containers"]
        ]
        status = {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": started},
                {"type": "Ready", "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": started},
            ],
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": started,
            "containerStatuses": statuses,
        }
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self.client.merge_patch(self._pod_path(pod) + "/status", {"status": status})

    def _report_running(self, pod: dict[str, Any], started: str) -> None:
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": started}
            for kind in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
        ]
        statuses = [
            {
                "name": container["name"],
                "image": container.get("image", ""),
                "imageID": "",
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": started}},
            }
            for container in pod["spec"]["containers"]
        ]
        status = {
            "phase": "Running",
            "conditions": conditions,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": "127.0.0.1",
            "podIPs": [{"ip": "127.0.0.1"}],
            "startTime": started,
            "containerStatuses": statuses,
        }
        with contextlib.suppress(ApiError):  # deleted meanwhile
            self.client.merge_patch(self._pod_path(pod) + "/status", {"status": status})

    def _terminate(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = pod["spec"].get("terminationGracePeriodSeconds", 30)

        # A worker still starting is stopped once it runs (its process exists as soon as the start began).
        def started() -> tuple[Worker | None] | None:
            with self._lock:
                found = self._workers.get(uid)
            return (found,) if found is None or found.process is not None else None

        [worker] = eventually(started, timeout=60, interval=0.05, message=f"the worker of pod {uid} never started")
        if worker is not None:
            worker.stop_as_kubelet(float(grace))
            with self._lock:
                self._workers.pop(uid, None)
        with contextlib.suppress(ApiError):  # gone already
            self.client.delete(
                self._pod_path(pod) + "?gracePeriodSeconds=0",
                {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
