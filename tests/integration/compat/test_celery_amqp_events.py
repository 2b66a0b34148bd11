"""A service written with celery-amqp-events runs unchanged on the operator's topology.

The library declares its own queues when its worker starts, so any difference in names or arguments
would surface as PRECONDITION_FAILED (a handler queue makes the worker exit; a retry or archive
queue fails silently) — hence the exact comparison of arguments in the planner tests, and this test
of the real thing: the library in its own virtualenv (Celery 5.0.1, kombu 5.0.2, pip < 24.1 to
install them), a real worker, and the real operator on the emulated API.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from kombu.connection import Connection

from tests.conftest import REPO, billing_sample, create_broker_secret
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess
from tests.support.waiting import stays

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version

HERE = pathlib.Path(__file__).resolve().parent
VENV = REPO / ".venv" / "compat-celery-amqp-events"
CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
MAX_RETRIES = 2


@pytest.fixture(scope="session")
def library_python() -> pathlib.Path:
    python = VENV / "bin" / "python"
    marker = VENV / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, timeout=120)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "pip<24.1"], check=True, timeout=300)
        subprocess.run([*pip, "celery==5.0.1", "kombu==5.0.2", "celery-amqp-events==0.1.0"], check=True, timeout=600)
        marker.touch()
    return python


@pytest.fixture
def operator_with_service(
    kube_api: EmulatedApi, crd_installed: dict[str, Any], test_vhost_url: str, tmp_path: pathlib.Path
) -> Iterator[OperatorProcess]:
    create_broker_secret(kube_api, test_vhost_url)
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    service = billing_sample()
    service["spec"]["retry"] = {"maxRetries": MAX_RETRIES}
    kube_api.client.create(CES, service)
    yield process
    process.stop()


def handled(log: pathlib.Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_library_service_runs_unchanged(
    library_python: pathlib.Path,
    kube_api: EmulatedApi,
    operator_with_service: OperatorProcess,
    test_vhost_url: str,
    tmp_path: pathlib.Path,
) -> None:
    eventually(lambda: condition(kube_api, "Ready").get("status") == "True", timeout=20)
    handler_log = tmp_path / "handled.jsonl"
    env = {
        **os.environ,
        "BROKER_URL": test_vhost_url,
        "HANDLER_LOG": str(handler_log),
        # the library's settings, equal to the resource's: maxRetries 2, archive defaults
        "AMQP_EVENTS_MAX_RETRIES": str(MAX_RETRIES),
    }
    worker_log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [str(library_python), "-m", "celery", "-A", "cae_service", "worker", "--pool=solo", "--loglevel=INFO"],
        cwd=HERE,
        env=env,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    try:
        eventually(
            lambda: "ready." in (tmp_path / "worker.log").read_text(),
            timeout=60,
            message="the library's worker did not start",
        )
        subprocess.run(
            [
                str(library_python),
                "-c",
                "from cae_service import fire; fire('orders.order.created', 42); fire('orders.order.cancelled', 7)",
            ],
            cwd=HERE,
            env=env,
            check=True,
            timeout=60,
        )

        eventually(
            lambda: any(h["event"] == "created" and h["order_id"] == 42 for h in handled(handler_log)),
            timeout=30,
            message="the handler never got its event",
        )
        eventually(
            lambda: len([h for h in handled(handler_log) if h["event"] == "cancelled"]) == MAX_RETRIES + 1,
            timeout=30,
            message="the failing handler did not get its retries",
        )
        attempts = [h for h in handled(handler_log) if h["event"] == "cancelled"]
        assert [h["retries"] for h in attempts] == [0, 1, 2]
        # Retries came back through the operator's retry levels and recover exchange.
        assert [h["exchange"] for h in attempts] == ["events", "billing:recover", "billing:recover"]

        def archived() -> int:
            with Connection(test_vhost_url) as connection:
                count: int = connection.channel().queue_declare("billing:archived", passive=True).message_count
                return count

        eventually(lambda: archived() == 1, timeout=30, message="the exhausted event was not archived")

        # A resync or two after the library declared everything itself: both sides stay content.
        stays(
            lambda: worker.poll() is None and condition(kube_api, "TopologyReady")["status"] == "True",
            seconds=2,
            message="the library's worker exited (PRECONDITION_FAILED?) or the topology broke",
        )
        assert "PRECONDITION_FAILED" not in (tmp_path / "worker.log").read_text()
    finally:
        worker.terminate()
        worker.wait(30)
        worker_log.close()
