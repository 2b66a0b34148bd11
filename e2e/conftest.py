"""The e2e suite runs on a cluster with a real node that it starts itself (tests/support/node_cluster.py: the
control plane, a kubelet with containerd and kube-proxy, the images built from the Dockerfiles): RabbitMQ of the
run's version as a pod, the chart installed by the real Helm with the operator image built here, then the scenarios
through kubectl, as a user would. See e2e/README.md.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import yaml
from tests.support import waiting
from tests.support.node_cluster import CHART, NodeClusterHandle, node_cluster

from celery_event_devcluster import images, rabbitmq
from celery_event_operator.core.api.metadata import HASH_ANNOTATION

__all__ = ["node_cluster"]

T = TypeVar("T")
MANIFESTS = pathlib.Path(__file__).resolve().parent / "manifests"
RELEASE = "ceo"
OPERATOR_NAMESPACE = "celery-event-operator"
METRICS_SERVICE = f"{RELEASE}-celery-event-operator-metrics"


class Kubectl:
    def __init__(self, namespace: str, kubeconfig: pathlib.Path, worker_image: str) -> None:
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.worker_image = worker_image  # the sample worker image built here, imported into the node

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=240,
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
    for item in items:
        item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def installed(node_cluster: NodeClusterHandle) -> Iterator[NodeClusterHandle]:
    """RabbitMQ as a pod (the run's version: CEO_RABBITMQ_VERSION, else the newest), the broker Secret the samples
    name, and the chart installed by `helm install` with the operator image built here."""
    cluster = node_cluster
    broker = images.build("rabbitmq", rabbitmq.selected())["rabbitmq"]
    cluster.node.load(broker)
    manifest = (MANIFESTS / "rabbitmq.yaml").read_text().replace("RABBITMQ_IMAGE", broker.reference)
    cluster.kubectl("apply", "-f", "-", stdin=manifest)
    cluster.kubectl("rollout", "status", "-n", "default", "deployment/rabbitmq", "--timeout=240s", timeout=300)
    address = cluster.json("get", "service", "-n", "default", "rabbitmq")["spec"]["clusterIP"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "rabbitmq", "namespace": "default"},
        "stringData": {"url": f"amqp://guest:guest@{address}:5672/"},
    }
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    cluster.helm(
        *("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace"),
        *cluster.image_values(),
        *("--wait", "--timeout", "240s"),
    )
    yield cluster
    cluster.helm("uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE, "--wait", check=False)


@pytest.fixture
def kubectl(installed: NodeClusterHandle) -> Kubectl:
    return Kubectl("default", installed.kubeconfig, installed.images["worker"].reference)


def scrape(kubectl: Kubectl) -> str:
    """The operator's /metrics through the API server's service proxy (no port-forward needed)."""
    return kubectl(
        "get", "--raw", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/services/{METRICS_SERVICE}:metrics/proxy/metrics"
    )


def eventually(probe: Callable[[], T], timeout: float = 120, interval: float = 2) -> T:
    """A cluster is slower than the emulated API: longer deadlines, sparser polls."""
    return waiting.eventually(probe, timeout, interval)


EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def worker_manifest(kubectl: Kubectl) -> str:
    deployment = yaml.safe_load((EXAMPLES / "billing-worker.yaml").read_text())
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["image"], container["imagePullPolicy"] = kubectl.worker_image, "Never"
    return yaml.safe_dump(deployment)


def live_workers(kubectl: Kubectl) -> list[dict[str, Any]]:
    """The worker pods not being deleted."""
    items: list[dict[str, Any]] = kubectl.json("get", "pods", "-l", "app=billing-worker")["items"]
    return [pod for pod in items if not pod["metadata"].get("deletionTimestamp")]


def deploy_billing(kubectl: Kubectl, deployment: str) -> Iterator[None]:
    """The sample service and its worker Deployment, settled: the operator stamps its settings' hash on the pod
    template (rolloutOnChange), which rolls the first pods once more; done when that rollout is and the first
    pods are gone. Both removed afterwards."""
    kubectl("apply", "-f", str(EXAMPLES / "billing.yaml"))
    kubectl("apply", "-f", "-", stdin=deployment)

    def stamped() -> bool:
        template = kubectl.json("get", "deployment", "billing-worker")["spec"]["template"]["metadata"]
        return HASH_ANNOTATION in (template.get("annotations") or {})

    eventually(stamped)
    kubectl("rollout", "status", "deployment/billing-worker", "--timeout=180s")
    replicas = yaml.safe_load(deployment)["spec"]["replicas"]
    eventually(lambda: len(kubectl.json("get", "pods", "-l", "app=billing-worker")["items"]) == replicas)
    yield
    kubectl("delete", "deployment", "billing-worker", "--ignore-not-found")
    kubectl("delete", "-f", str(EXAMPLES / "billing.yaml"), "--ignore-not-found", "--timeout=60s")


@pytest.fixture
def service_with_workers(kubectl: Kubectl) -> Iterator[None]:
    yield from deploy_billing(kubectl, worker_manifest(kubectl))


def run_in_service(kubectl: Kubectl, pod: str, code: str) -> None:
    """A one-off pod of the worker image labelled as the service's (so its settings are injected) running `code`."""
    kubectl(
        "run",
        pod,
        "--restart=Never",
        f"--image={kubectl.worker_image}",
        "--image-pull-policy=Never",
        "--labels=celeryevents.io/service=billing",
        "--command",
        "--",
        "python",
        "-c",
        code,
    )
