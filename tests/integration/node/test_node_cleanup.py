"""A node's stop leaves nothing on the machine: the kubelet, kube-proxy, containerd and every container end with its
PID namespace, its mounts with its mount namespace, its network (pods' veths, routes, kube-proxy's and the CNI
plugins' iptables rules) with its network namespace; its cgroups and directory are removed."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

from celery_event_devcluster.node import CGROUPS, NodeCluster
from tests.support.waiting import eventually


def run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.name.isdigit() and text in command and int(entry.name) != os.getpid():
            found.append(command)
    return found


def test_a_stopped_node_leaves_no_process_mount_namespace_route_rule_or_cgroup(tmp_path: pathlib.Path) -> None:
    cluster = NodeCluster(tmp_path / "cluster").start(image_names=("worker",))
    assert cluster.node is not None
    assert cluster.network is not None
    assert cluster.plane is not None
    node, network, addresses = cluster.node, cluster.network, cluster.network.addresses
    try:
        kubectl = ["kubectl", "--kubeconfig", str(cluster.plane.kubeconfig)]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {
                "containers": [
                    {
                        "name": "sleeper",
                        "image": node.images["worker"].reference,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "600"],
                    }
                ]
            },
        }
        subprocess.run(
            [*kubectl, "create", "-f", "-"], input=json.dumps(pod), text=True, check=True, capture_output=True
        )

        def running() -> bool:
            found = json.loads(run(*kubectl, "get", "pod", "sleeper", "-o", "json"))
            return bool(found["status"].get("phase") == "Running")

        eventually(running, timeout=120, interval=1)
        # While it runs: its pieces, mounts and rules exist, but inside the node's namespaces only.
        assert processes_mentioning(str(tmp_path))
        assert str(tmp_path) not in pathlib.Path("/proc/self/mounts").read_text()
        rules_inside = run("ip", "netns", "exec", addresses.namespace, "iptables-save")
        assert "KUBE-SERVICES" in rules_inside
        rules_outside = run("iptables-save")
        assert "KUBE-" not in rules_outside
        assert "CNI-" not in rules_outside
        cgroup = CGROUPS / "memory" / node.cgroup_root.lstrip("/")
        assert cgroup.is_dir()

    finally:
        cluster.stop()

    assert addresses.namespace not in run("ip", "netns", "list")
    assert network.outside not in run("ip", "link")
    routes = run("ip", "route")
    assert addresses.pods.split("/")[0] not in routes
    assert addresses.services.split("/")[0] not in routes
    assert not [p for p in CGROUPS.glob(f"*/{node.cgroup_root.lstrip('/')}")]
    assert processes_mentioning(str(tmp_path)) == []
    assert str(tmp_path) not in pathlib.Path("/proc/self/mounts").read_text()
    assert "KUBE-" not in run("iptables-save")
    assert not node.sockets.exists()
