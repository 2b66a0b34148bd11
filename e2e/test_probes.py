"""The chart's probes on a real kubelet: an operator that stops answering is restarted.

The operator's liveness endpoint is served by its event loop (kopf's), so a stuck loop leaves /healthz unanswered;
here the operator's process is frozen whole (SIGSTOP from outside the container: what a stuck loop looks like from
the kubelet), and the kubelet's own probe, not a test's, finds it dead and restarts the container."""

from __future__ import annotations

import os
import pathlib
import signal
from typing import Any

from tests.support.node_cluster import NodeClusterHandle

from e2e.conftest import OPERATOR_NAMESPACE, RELEASE, Kubectl, eventually

CGROUPS = pathlib.Path("/sys/fs/cgroup/pids")


def operator_pod(kubectl: Kubectl) -> dict[str, Any]:
    pods = kubectl.json("get", "pods", "-n", OPERATOR_NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")
    [pod] = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
    return pod  # type: ignore[no-any-return]


def processes_of(installed: NodeClusterHandle, container_id: str) -> list[int]:
    """The container's processes as this machine numbers them (its cgroup under the node's cgroup root)."""
    root = CGROUPS / installed.node.cgroup_root.lstrip("/")
    [cgroup] = [path for path in root.rglob(container_id) if path.is_dir()]
    return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]


def test_a_frozen_operator_fails_its_liveness_probe_and_is_restarted(
    kubectl: Kubectl, installed: NodeClusterHandle
) -> None:
    pod = operator_pod(kubectl)
    [status] = pod["status"]["containerStatuses"]
    assert status["ready"]
    restarts = status["restartCount"]
    container_id = status["containerID"].removeprefix("containerd://")
    for pid in processes_of(installed, container_id):
        os.kill(pid, signal.SIGSTOP)

    def restarted() -> dict[str, Any] | None:
        [now] = operator_pod(kubectl)["status"]["containerStatuses"]
        return now if now["restartCount"] > restarts and now["ready"] else None

    # Liveness: every 20 s, 5 s to answer, 3 failures; then the kubelet stops the container (a stopped process
    # still takes SIGKILL) and starts it again, Ready once the webhook listens.
    now = eventually(restarted, timeout=240, interval=5)
    assert now["lastState"]["terminated"]["exitCode"] == 137, now["lastState"]
    events = kubectl.json("get", "events", "-n", OPERATOR_NAMESPACE)["items"]
    unhealthy = [e["message"] for e in events if e["reason"] == "Unhealthy" and pod["metadata"]["name"] in str(e)]
    assert any(message.startswith("Liveness probe failed") for message in unhealthy), unhealthy
