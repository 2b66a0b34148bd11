"""The e2e suite runs against the cluster of KUBECONFIG (see e2e/README.md); without one it skips."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import yaml
from tests.support import waiting

T = TypeVar("T")
HOW_TO_RUN = "e2e needs a cluster: run `e2e/run.sh` where Docker exists (it creates one with kind)"


class Kubectl:
    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        result = self.run(*args, stdin=stdin)
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    cluster = (
        bool(os.environ.get("KUBECONFIG"))
        and subprocess.run(["kubectl", "version", "--request-timeout=5s"], capture_output=True, check=False).returncode
        == 0
    )
    for item in items:
        item.add_marker(pytest.mark.e2e)
        if not cluster:
            item.add_marker(pytest.mark.skip(reason=HOW_TO_RUN))


@pytest.fixture
def kubectl() -> Kubectl:
    return Kubectl(os.environ.get("E2E_NAMESPACE", "default"))


OPERATOR_NAMESPACE = os.environ.get("E2E_OPERATOR_NAMESPACE", "celery-event-operator")
METRICS_SERVICE = os.environ.get("E2E_METRICS_SERVICE", "ceo-celery-event-operator-metrics")


def scrape(kubectl: Kubectl) -> str:
    """The operator's /metrics through the API server's service proxy (no port-forward needed)."""
    return kubectl(
        "get", "--raw", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/services/{METRICS_SERVICE}:metrics/proxy/metrics"
    )


def eventually(probe: Callable[[], T], timeout: float = 120, interval: float = 2) -> T:
    """A cluster is slower than the emulated API: longer deadlines, sparser polls."""
    return waiting.eventually(probe, timeout, interval)


EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
WORKER_IMAGE = os.environ.get("E2E_WORKER_IMAGE", "billing-worker:e2e")


def worker_manifest() -> str:
    deployment = yaml.safe_load((EXAMPLES / "billing-worker.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = WORKER_IMAGE, "Never"
    return yaml.safe_dump(deployment)


def deploy_billing(kubectl: Kubectl, deployment: str) -> Iterator[None]:
    """The sample service and its worker Deployment, until the rollout is done; both removed afterwards."""
    kubectl("apply", "-f", str(EXAMPLES / "billing.yaml"))
    kubectl("apply", "-f", "-", stdin=deployment)
    kubectl("rollout", "status", "deployment/billing-worker", "--timeout=180s")
    yield
    kubectl("delete", "deployment", "billing-worker", "--ignore-not-found")
    kubectl("delete", "-f", str(EXAMPLES / "billing.yaml"), "--ignore-not-found", "--timeout=60s")


@pytest.fixture
def service_with_workers(kubectl: Kubectl) -> Iterator[None]:
    yield from deploy_billing(kubectl, worker_manifest())


def run_in_service(kubectl: Kubectl, pod: str, code: str) -> None:
    """A one-off pod of the worker image labelled as the service's (so its settings are injected) running `code`."""
    kubectl(
        "run",
        pod,
        "--restart=Never",
        f"--image={WORKER_IMAGE}",
        "--image-pull-policy=Never",
        "--labels=celeryevents.io/service=billing",
        "--command",
        "--",
        "python",
        "-c",
        code,
    )
