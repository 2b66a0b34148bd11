"""What the benchmarks share: the emulated API with the CRD and the broker Secret, and a process's figures."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Iterator, Mapping

from celery_event_operator.core.api import crd
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi


@contextlib.contextmanager
def broker_vhost() -> Iterator[tuple[rabbitmq.Management, str, str]]:
    """A vhost of the benchmark's own on the broker at $AMQP_URL (management, vhost, its URL); removed afterwards."""
    amqp_url = os.environ.get("AMQP_URL", rabbitmq.DEFAULT_AMQP_URL)
    management = rabbitmq.Management(amqp_url, os.environ.get("RABBITMQ_MANAGEMENT_URL"))
    vhost = rabbitmq.create_vhost(management, prefix="ceo-bench")
    try:
        yield management, vhost, rabbitmq.url_with_vhost(amqp_url, vhost)
    finally:
        rabbitmq.delete_vhost(management, vhost)


@contextlib.contextmanager
def emulated_cluster(workdir: pathlib.Path, broker_url: str) -> Iterator[EmulatedApi]:
    """The emulated API (kubeconfig in `workdir`) with the CRD installed and the Secret `rabbitmq` of the broker."""
    with EmulatedApi(workdir / "kubeconfig") as api:
        api.client.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd.custom_resource_definition())
        api.client.create(
            "/api/v1/namespaces/default/secrets", {"metadata": {"name": "rabbitmq"}, "stringData": {"url": broker_url}}
        )
        yield api


def rss_mb(pid: int) -> float:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """The CPU time of a process so far (user and system), from /proc."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def reference_checkout(commit: str) -> Iterator[pathlib.Path]:
    """A worktree of `commit` (removed afterwards), whose operator a benchmark runs beside this checkout's."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="ceo-reference-"))
    adding = ["git", "worktree", "add", "--detach", "--force", str(path), commit]
    subprocess.run(adding, check=True, capture_output=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(path)], check=False, capture_output=True)


def side_by_side(reference: str, before: Mapping[str, str], after: Mapping[str, str]) -> None:
    """The figures of the reference run and of this one, in one table."""
    print(f"\n{'figure':<40} | {reference:<48} | this checkout")
    for figure in dict.fromkeys([*before, *after]):
        print(f"{figure:<40} | {before.get(figure, '-'):<48} | {after.get(figure, '-')}")
