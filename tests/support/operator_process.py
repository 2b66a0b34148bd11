"""The real operator (`celery-event-operator run`, i.e. `kopf run` with our handlers) as a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
import uuid
from typing import Any

from celery_event_devcluster.controlplane import free_port
from celery_event_operator.adapters import certs
from tests.support import waiting


def accepts(port: int) -> bool:
    """Whether something listens on the local `port` (a kubelet's tcpSocket probe)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


PORT_ATTEMPTS = 3


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: pathlib.Path,
        log_path: pathlib.Path,
        *extra_args: str,
        resync_seconds: float = 2.0,
        verbose: bool = True,
        webhook: bool = True,
        source: pathlib.Path | None = None,
    ) -> None:
        """`source`: a checkout whose operator runs instead of this one's (a benchmark's reference commit)."""
        self.kubeconfig = kubeconfig
        self.source = source
        self.verbose = verbose
        self.log_path = log_path
        self.webhook = webhook
        self._given_args = extra_args
        self._resync_seconds = resync_seconds
        self._pick_ports()
        self.process: subprocess.Popen[bytes] | None = None

    def _pick_ports(self) -> None:
        """Free ports for liveness, the webhook (with a certificate the tests can verify it by) and /metrics."""
        self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        self.webhook_port = free_port()
        self.webhook_cert, webhook_key = certs.self_signed(
            self.log_path.parent / f"webhook-{self.webhook_port}", ["127.0.0.1"]
        )
        self.metrics_port = free_port()
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        webhook_args = [
            *("--webhook-port", str(self.webhook_port), "--webhook-addr", "127.0.0.1"),
            *("--webhook-cert", str(self.webhook_cert), "--webhook-key", str(webhook_key)),
        ]
        if not self.webhook:
            webhook_args = ["--webhook-port", "0"]  # what the chart passes with webhook.enabled=false
        self.extra_args = (
            *self._given_args,
            "--resync-seconds",
            str(self._resync_seconds),
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-addr",
            "127.0.0.1",
            *webhook_args,
        )

    def start(self) -> OperatorProcess:
        """Start and wait until it serves. A free port is free when picked, not when bound: another process of
        the test run may take it meanwhile, and then the operator starts again on other ports."""
        for _ in range(PORT_ATTEMPTS - 1):
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                return self._start()
            except RuntimeError:
                if "address already in use" not in self.log()[logged:].lower():
                    raise
                self._log.close()
                self._pick_ports()
        return self._start()

    def _start(self) -> OperatorProcess:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        if self.source is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.source / "operator"), env.get("PYTHONPATH")]))
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery_event_operator.cli",
                "run",
                *(["--verbose"] if self.verbose else []),
                "--liveness",
                self.liveness_url,
                *self.extra_args,
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

        def serving() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.liveness_url, timeout=1):
                    pass
            except OSError:
                return False
            # As the chart's readiness probe: kopf opens the webhook seconds after the liveness endpoint.
            return not self.webhook or accepts(self.webhook_port)

        waiting.eventually(
            serving, timeout=30, interval=0.2, message=f"the operator never served (liveness, webhook):\n{self.log()}"
        )
        return self

    def admit(self, review: dict[str, Any]) -> dict[str, Any]:
        """POST an AdmissionReview to the webhook over HTTPS, as the API server does."""
        context = ssl.create_default_context(cafile=str(self.webhook_cert))
        request = urllib.request.Request(
            f"https://127.0.0.1:{self.webhook_port}/inject-celery-settings",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer

    def scrape(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text: str = response.read().decode()
            return text

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # kopf's graceful stop
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._log.close()


def worker_pod(labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A worker pod as its Deployment's ReplicaSet creates it (before the webhook), with `labels` added."""
    container = {"name": "worker", "image": "billing-worker", "command": ["celery", "-A", "billing_app", "worker"]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "billing-worker-",
            "namespace": "default",
            "labels": {"app": "billing-worker", **(labels or {})},
        },
        "spec": {"containers": [container], **spec},
    }


def admission_review(pod: dict[str, Any], namespace: str = "default") -> dict[str, Any]:
    """A pod's CREATE as the API server sends it to a mutating webhook."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
        },
    }
