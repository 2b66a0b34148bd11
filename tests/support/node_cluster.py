"""A cluster with a real node (celery_event_devcluster/node.py): the control plane, a kubelet with containerd and
kube-proxy running the images built from the Dockerfiles, and the real Helm binary (built from its Go module).

`node_cluster` (session): one per pytest process that asks for it (~35 s to start with the images imported; its
stop leaves no process, mount, namespace, route or cgroup). Nothing in it is stood in for: pods are run by the
kubelet from the images, Services by kube-proxy, the webhook is called by the API server through its Service.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from celery_event_devcluster import helm
from celery_event_devcluster.images import Image
from celery_event_devcluster.node import NodeCluster

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "celery-event-operator"


class NodeClusterHandle:
    def __init__(self, cluster: NodeCluster, helm_binary: pathlib.Path) -> None:
        assert cluster.plane is not None
        assert cluster.node is not None
        self.cluster = cluster
        self.plane = cluster.plane
        self.node = cluster.node
        self.kubeconfig = cluster.plane.kubeconfig
        self.helm_binary = helm_binary
        self.images: dict[str, Image] = cluster.node.images

    def _run(
        self, command: list[str], check: bool, timeout: float, stdin: str | None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self._run(["kubectl", *args], check, timeout, stdin)

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.helm_binary), *args], check, timeout, None)

    def image_values(self) -> list[str]:
        """`--set` options that run the operator image built here (imported into the node: never pulled)."""
        operator = self.images["operator"]
        return [
            *("--set", f"image.repository={operator.repository}"),
            *("--set", f"image.tag={operator.tag}"),
            *("--set", "image.pullPolicy=Never"),
        ]

    def logs(self) -> str:
        return self.node.logs()


@pytest.fixture(scope="session")
def node_cluster() -> Iterator[NodeClusterHandle]:
    directory = pathlib.Path(tempfile.mkdtemp(prefix="ceo-node-cluster-"))
    helm_binary = helm.build()
    cluster = NodeCluster(directory)
    try:
        cluster.start(image_names=("operator", "worker"))
        yield NodeClusterHandle(cluster, helm_binary)
    finally:
        cluster.stop()
        if not os.environ.get("CEO_KEEP_CLUSTER_FILES"):
            shutil.rmtree(directory, ignore_errors=True)
