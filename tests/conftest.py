"""Fixtures shared by the suites: real RabbitMQ (a vhost per session), emulated API, real operator."""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from celery_event_operator.core.api import crd
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi
from tests.support.operator_process import OperatorProcess
from tests.support.private_broker import PrivateRabbit

REPO = pathlib.Path(__file__).resolve().parent.parent

# The real control plane's fixtures (cluster, namespace, chart_operator): see tests/support/cluster.py.
pytest_plugins = ["tests.support.cluster"]


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """The broker of the run (AMQP_URL); a clear error when none answers, never a silent skip."""
    url = os.environ.get("AMQP_URL", rabbitmq.DEFAULT_AMQP_URL)
    rabbitmq.check_reachable(url)
    return url


@pytest.fixture(scope="session")
def rabbitmq_management(amqp_url: str) -> rabbitmq.Management:
    return rabbitmq.Management(amqp_url, os.environ.get("RABBITMQ_MANAGEMENT_URL"))


@pytest.fixture(scope="session")
def vhost(rabbitmq_management: rabbitmq.Management) -> Iterator[str]:
    """A vhost of this test session only; removed afterwards with everything in it."""
    name = rabbitmq.create_vhost(rabbitmq_management)
    yield name
    rabbitmq.delete_vhost(rabbitmq_management, name)


@pytest.fixture(scope="session")
def vhost_url(amqp_url: str, vhost: str) -> str:
    return rabbitmq.url_with_vhost(amqp_url, vhost)


@pytest.fixture
def test_vhost(rabbitmq_management: rabbitmq.Management) -> Iterator[str]:
    """A vhost of this test only, for tests that assert everything the broker holds."""
    name = rabbitmq.create_vhost(rabbitmq_management, prefix="ceo-case")
    yield name
    rabbitmq.delete_vhost(rabbitmq_management, name)


@pytest.fixture
def test_vhost_url(amqp_url: str, test_vhost: str) -> str:
    return rabbitmq.url_with_vhost(amqp_url, test_vhost)


@pytest.fixture(params=["classic", "quorum"])
def queue_type(request: pytest.FixtureRequest) -> str:
    """Every real-worker scenario runs for both queue types."""
    found: str = request.param
    return found


def billing_sample() -> dict[str, Any]:
    """A fresh copy of the sample service (examples/billing.yaml), for a test to adjust."""
    sample: dict[str, Any] = yaml.safe_load((REPO / "examples" / "billing.yaml").read_text())
    return sample


def create_broker_secret(
    api: EmulatedApi, url: str, namespace: str = "default", name: str = "rabbitmq", **more: str
) -> None:
    """The broker Secret a service names: its `url`, and `more` keys (e.g. managementURL)."""
    api.client.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"url": url, **more}},
    )


@pytest.fixture
def private_rabbit(request: pytest.FixtureRequest) -> Iterator[PrivateRabbit]:
    """A RabbitMQ node of this test's own, to stop and start (the shared broker is never stopped); indirect
    parameters are PrivateRabbit's options (e.g. {"management": True})."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="ceo-rabbit-"))
    rabbit = PrivateRabbit(base, **getattr(request, "param", {}))
    try:
        yield rabbit.start()
    finally:
        rabbit.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def kube_api(tmp_path: pathlib.Path) -> Iterator[EmulatedApi]:
    """A fresh emulated Kubernetes API per test, with a kubeconfig for kubectl and the operator."""
    with EmulatedApi(tmp_path / "kubeconfig") as api:
        yield api


@pytest.fixture
def crd_installed(kube_api: EmulatedApi) -> dict[str, Any]:
    """The operator's CRDs (the service's is returned)."""
    created = [
        kube_api.client.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", definition)
        for definition in crd.custom_resource_definitions()
    ]
    body: dict[str, Any] = created[0]
    return body


@pytest.fixture
def operator(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log").start()
    yield process
    process.stop()
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(f"--- operator log ---\n{process.log()[-20000:]}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def load_examples() -> list[tuple[str, dict[str, Any]]]:
    """Every document of examples/, named `file#index`."""
    found = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for index, document in enumerate(yaml.safe_load_all(path.read_text())):
            if document:
                found.append((f"{path.name}#{index}", document))
    return found
