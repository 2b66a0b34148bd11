"""The control plane itself: the API server's checks (etcd among them), and `./dev cluster up|down` (the module it
runs) starting one for a person and leaving nothing behind."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import pytest

from celery_event_devcluster import controlplane
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


def test_a_port_taken_before_etcd_binds_it_is_picked_again(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port is free when it is picked, not when it is bound: a CI run's control plane failed to start when another
    test process bound etcd's port first. Here the first port picked is held by a listening socket."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = controlplane.free_port
        picks = [real(), taken]  # the API server's, then etcd's client port
        monkeypatch.setattr(controlplane, "free_port", lambda: picks.pop(0) if picks else real())
        plane = ControlPlane(tmp_path / "controlplane").start()
        try:
            assert plane.get("/readyz") == "ok"
            assert str(taken) not in plane.url
        finally:
            plane.stop()
