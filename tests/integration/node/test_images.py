"""The two images built from the repository's Dockerfiles as a user's CI would build them (devcluster/images/
build.sh: no registry, no Docker engine), run by a container runtime the way the chart runs them: a read-only root
filesystem, user 10001, nothing written but what the container mounts."""

from __future__ import annotations

import pathlib
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from celery_event_devcluster.controlplane import free_port
from celery_event_devcluster.images import PODMAN_ULIMITS, Image, build
from tests.support.cluster import ChartOperator, Cluster
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    return build()


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    # runc, as the node's containerd runs them: crun 1.8 (which apt installs for podman when no runtime is there yet)
    # refuses a machine whose cgroups are v1 beside a v2 hierarchy ("cgroups in hybrid mode not supported").
    return subprocess.run(
        ["podman", "--runtime", "runc", *args], capture_output=True, text=True, timeout=120, check=check
    )


@pytest.fixture
def container_name() -> Iterator[str]:
    name = f"ceo-test-{secrets.token_hex(4)}"
    yield name
    podman("rm", "--force", "--time", "5", name, check=False)


def answer(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def test_the_operator_image_serves_liveness_and_metrics_as_its_user_on_a_read_only_root(
    cluster: Cluster, images: dict[str, Image], container_name: str, tmp_path: pathlib.Path
) -> None:
    """The image's own entry point, given the chart's ServiceAccount's credentials and the chart's arguments that
    do not need a Service (the webhook is tested on a node: test_release_on_node.py)."""
    installed = ChartOperator(cluster, {}, tmp_path).install()
    health, metrics = free_port(), free_port()
    try:
        podman(
            *("run", "--detach", "--name", container_name, "--read-only", "--user", "10001"),
            *("--network", "host", *PODMAN_ULIMITS),
            *("--volume", f"{installed.kubeconfig}:/etc/celery-event-operator/kubeconfig:ro"),
            *("--env", "KUBECONFIG=/etc/celery-event-operator/kubeconfig"),
            images["operator"].reference,
            *("run", f"--liveness=http://127.0.0.1:{health}/healthz", "--webhook-port=0"),
            *(f"--metrics-port={metrics}", "--metrics-addr=127.0.0.1", f"--namespace={installed.namespace}"),
        )
        try:
            eventually(lambda: answer(f"http://127.0.0.1:{health}/healthz") == 200, timeout=60)
        except AssertionError:
            pytest.fail(podman("logs", container_name, check=False).stdout[-4000:])
        assert answer(f"http://127.0.0.1:{metrics}/metrics") == 200
        assert podman("exec", container_name, "id", "-u").stdout.strip() == "10001"
        written = podman("exec", container_name, "sh", "-c", "echo x > /opt/venv/x", check=False)
        assert "Read-only file system" in written.stderr
        assert podman("inspect", "--format", "{{.State.Running}}", container_name).stdout.strip() == "true"
    finally:
        podman("rm", "--force", "--time", "5", container_name, check=False)
        installed.uninstall()


def test_the_worker_image_has_celery_and_the_runtime_for_its_user(images: dict[str, Image]) -> None:
    """Its default user, the venv's Celery (kombu's timer needs the system's time zones) and the operator's runtime,
    read-only. The sample app itself needs the settings the operator injects: the e2e suite runs it on a node."""
    code = "import kombu.asynchronous.timer, celery_event_operator.runtime as r; print(r.events_app('billing').main)"
    done = podman(
        *("run", "--rm", "--read-only", "--network", "none", *PODMAN_ULIMITS),
        images["worker"].reference,
        *("sh", "-c", f'id -u && celery --version && python3 -c "{code}"'),
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    user, version, app = done.stdout.splitlines()[:3]
    assert (user, app) == ("10001", "billing")
    assert version.startswith("5.7"), version
