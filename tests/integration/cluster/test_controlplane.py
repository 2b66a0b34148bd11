"""The control plane itself: the API server's checks (etcd among them), and `./dev cluster up|down` (the module it
runs) starting one for a person and leaving nothing behind."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from celery_event_devcluster.controlplane import ControlPlane
from tests.support.cluster import Cluster


def test_the_api_server_serves_from_etcd_and_authorises_with_rbac(cluster: Cluster) -> None:
    checks = cluster.kubectl("get", "--raw", "/livez?verbose").stdout
    assert "[+]etcd ok" in checks
    assert "livez check passed" in checks
    assert cluster.kubectl("auth", "can-i", "create", "pods", "--as=nobody", check=False).stdout.strip() == "no"


def test_cluster_up_prints_its_kubeconfig_last_and_down_removes_it(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "cluster"
    command = [sys.executable, "-m", "celery_event_devcluster.controlplane"]
    up = subprocess.run([*command, "up", str(directory)], capture_output=True, text=True, timeout=180, check=True)
    kubeconfig = up.stdout.strip().splitlines()[-1]
    pids = ControlPlane.of(directory).pids.values()
    try:
        checks = subprocess.run(
            ["kubectl", "--kubeconfig", kubeconfig, "get", "--raw", "/livez?verbose"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        assert "[+]etcd ok" in checks
    finally:
        subprocess.run([*command, "down", str(directory)], timeout=60, check=True)
    assert not directory.exists()
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in pathlib.Path(f"/proc/{pid}/status").read_text()
