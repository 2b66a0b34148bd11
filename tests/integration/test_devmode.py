"""The README's first command: the operator with the sample on an embedded API, usable with kubectl as the dev mode's
page (docs/getting-started/dev-mode.md) says."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import secrets
import signal
import subprocess
import sys
import urllib.request
from typing import Any

import pytest
from kombu.connection import Connection

from celery_event_devcluster import devmode
from celery_event_operator.core.options import OperatorOptions
from tests.conftest import REPO
from tests.support import rabbitmq, waiting
from tests.support.kube import eventually
from tests.support.operator_process import free_port


def kubectl(kubeconfig: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_dev_mode_serves_the_sample(tmp_path: pathlib.Path, test_vhost_url: str) -> None:
    state = tmp_path / "state"
    metrics_port = free_port()
    log = (tmp_path / "dev.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery_event_operator.cli",
            "dev",
            "--api-port",
            "0",
            "--state-dir",
            "state",  # relative, as in the documentation (but not under the worker's directory)
            "--example",
            str(REPO / "examples" / "broker-secret.yaml"),
            "--example",
            str(REPO / "examples" / "billing.yaml"),
            "--example",
            str(REPO / "examples" / "billing-worker.yaml"),
            "--liveness",
            "",
            "--broker-url",
            test_vhost_url,
            "--webhook-port",
            str(free_port()),
            "--metrics-port",
            str(metrics_port),
        ],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": "/nonexistent"},
        start_new_session=True,
    )
    kubeconfig = state / "kubeconfig"
    try:
        eventually(kubeconfig.exists, timeout=30, message="no kubeconfig written")

        def sample_ready() -> list[str]:
            lines = kubectl(kubeconfig, "get", "ces").stdout.splitlines()
            assert len(lines) == 2, lines
            assert lines[1].split()[:2] == ["billing", "True"], lines
            return lines

        eventually(sample_ready, timeout=30, message="the sample never showed Ready")

        listing = subprocess.run(
            [sys.executable, "-m", "celery_event_operator.cli", "topology", "billing"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
        assert listing.returncode == 0, listing.stdout + listing.stderr
        assert "billing.orders.order.created    queue/events" in listing.stdout
        assert "guest" not in listing.stdout, "no credentials in the listing"

        def live_metrics() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
                    text = response.read().decode()
            except OSError:
                return False  # not serving yet
            return any(
                line.startswith("celery_task_succeeded_total{") and 'service_name="billing"' in line
                for line in text.splitlines()
            )

        eventually(live_metrics, timeout=60, message="no live metrics from the sample worker")

        # Issue #16: the whole product shows: the sample Deployment is found, events retry, one is archived.
        def status() -> dict[str, Any]:
            found: dict[str, Any] = json.loads(kubectl(kubeconfig, "get", "ces", "billing", "-o", "json").stdout)
            return found.get("status", {})

        def condition(kind: str) -> dict[str, Any]:
            return next((c for c in status().get("conditions", []) if c["type"] == kind), {})

        eventually(lambda: condition("WorkersConfigured").get("status") == "True", timeout=30, message="workers")
        eventually(lambda: status().get("retrying", 0) > 0, timeout=90, message="no event was seen retrying")

        def archived_exceptions() -> list[str]:
            listed = subprocess.run(
                [sys.executable, "-m", "celery_event_operator.cli", "archive", "list", "billing", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            )
            return [row["exception"] or "" for row in json.loads(listed.stdout)]

        eventually(
            lambda: any(text.startswith("TypeError") for text in archived_exceptions()),
            timeout=90,
            message="the sample's buggy event was not archived",
        )

        # The dev mode page's maxRetries patch: the sample worker follows, as a rollout would replace its pod.
        patched = kubectl(
            kubeconfig, "patch", "ces", "billing", "--type=merge", "-p", '{"spec":{"retry":{"maxRetries":3}}}'
        )
        assert patched.returncode == 0, patched.stderr
        eventually(
            lambda: "the sample worker restarts" in (state / "sample-worker.log").read_text(errors="replace"),
            timeout=30,
            message="the sample worker kept its old settings",
        )
        # The new pod's settings file is written after the restart is logged (and may be caught half-written).
        waiting.eventually(
            lambda: (
                len(json.loads((state / "settings" / "settings.json").read_text())["celery_events"]["retry_exchanges"])
                == 3
            ),
            timeout=60,
            message="the worker does not run the new settings",
            retrying=(AssertionError, ValueError, OSError),
        )
        eventually(lambda: condition("WorkersConfigured").get("status") == "True", timeout=60, message="rolled")

        applied = kubectl(kubeconfig, "apply", "--validate=false", "-f", str(REPO / "examples/shipping-quorum.yaml"))
        assert applied.returncode == 0, applied.stderr
        eventually(lambda: "shipping" in kubectl(kubeconfig, "get", "ces").stdout, timeout=30)
    finally:
        exit_code = stop_dev_mode(process)
        log.close()
    output = (tmp_path / "dev.log").read_text()
    assert "export KUBECONFIG=" in output
    assert exit_code == 0, output[-5000:]


def stop_dev_mode(process: subprocess.Popen[bytes]) -> int:
    """Ctrl-C; a dev mode still running 20 s later fails the test, and is killed with its sample worker (its
    own session) so that the next test finds the fixed ports free."""
    process.send_signal(signal.SIGINT)
    try:
        return process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise AssertionError("the dev mode did not stop within 20 s of Ctrl-C") from None


DEV_MODE_PAGE = "docs/getting-started/dev-mode.md"


def documented_block() -> str:
    """The commands the dev mode's page tells a new user to run in another shell while `./dev up` runs."""
    page = (REPO / DEV_MODE_PAGE).read_text()
    after = page.split("In another shell:", 1)[1]
    return after.split("```sh\n", 1)[1].split("```", 1)[0]


def test_the_documented_commands_work_against_the_dev_mode(tmp_path: pathlib.Path, test_vhost_url: str) -> None:
    """Issue #16: every command of the dev mode page's block, in its order, exits 0 with no traceback (run from a
    directory laid out as the repository: .venv, examples, and the dev mode's .dev state)."""
    block = documented_block()
    assert "kubectl delete ces billing" in block
    for entry in (".venv", "examples"):
        (tmp_path / entry).symlink_to(REPO / entry)
    log = (tmp_path / "dev.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_event_operator.cli", "dev", "--broker-url", test_vhost_url],
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": "/nonexistent"},
        start_new_session=True,
    )
    kubeconfig = tmp_path / ".dev" / "kubeconfig"
    try:
        eventually(kubeconfig.exists, timeout=30, message="no kubeconfig written")
        eventually(
            lambda: "True" in kubectl(kubeconfig, "get", "ces", "billing").stdout, timeout=60, message="not Ready"
        )

        def metrics_flow() -> bool:
            try:
                with urllib.request.urlopen("http://127.0.0.1:9808/metrics", timeout=5) as response:
                    return "celery_task_received_total{" in response.read().decode()
            except OSError:
                return False

        eventually(metrics_flow, timeout=60, message="no task metrics yet")

        def buggy_event_archived() -> bool:
            listed = subprocess.run(
                [sys.executable, "-m", "celery_event_operator.cli", "archive", "list", "billing", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, "KUBECONFIG": str(kubeconfig)},
            )
            return listed.returncode == 0 and '"exception_type": "TypeError"' in listed.stdout

        eventually(buggy_event_archived, timeout=60, interval=1, message="the buggy producer archived nothing")
        result = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
            env={**os.environ, "KUBECONFIG": "/nonexistent"},
        )
        assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stdout + result.stderr
        assert 'celeryeventservice.celeryevents.io "billing" deleted' in result.stdout
        # The replay through the operator: the buggy producer's archived events sent back (to fail again).
        replayed = re.search(r"(\d+) of (\d+) selected archived events of billing sent back", result.stdout)
        assert replayed is not None, result.stdout
        assert int(replayed[1]) == int(replayed[2]) >= 1
        assert re.search(r"billing-replay-\S+\s+billing\s+replay\s+True\s+Replayed", result.stdout), result.stdout
    finally:
        stop_dev_mode(process)
        log.close()


def test_the_dev_vhost_is_made_at_start_and_removed_by_dev_down(
    monkeypatch: pytest.MonkeyPatch, amqp_url: str, rabbitmq_management: rabbitmq.Management
) -> None:
    """The dev mode's own vhost (a name of this test's: a developer's `./dev up` may be running)."""
    name = f"ceo-case-dev-{secrets.token_hex(3)}"
    monkeypatch.setattr(devmode, "DEV_VHOST", name)
    monkeypatch.setenv("AMQP_URL", amqp_url)
    url = devmode.dev_broker_url(amqp_url)
    assert url.endswith(f"/{name}")
    with Connection(url) as connection:
        connection.channel().exchange_declare("probe", "topic", durable=False, auto_delete=True)
    assert name in {vhost["name"] for vhost in rabbitmq_management.request("GET", "/vhosts")}
    assert devmode.run_command(argparse.Namespace(down=True), OperatorOptions()) == 0
    assert name not in {vhost["name"] for vhost in rabbitmq_management.request("GET", "/vhosts")}
