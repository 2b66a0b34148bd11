"""Real Celery worker processes started from what the webhook injected into a pod.

No kubelet runs here, so `as_kubelet_would` stands in for it (the one mocked part; see
celery_event_devcluster/kubelet.py): the container's env with `secretKeyRef`s read from the API, and the ConfigMap
volume written to a directory that stands in for the mount path.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

from celery_event_devcluster import kubelet
from tests.support import waiting
from tests.support.kube import KubeClient

# This checkout's operator/ (the runtime). The venv's editable install may point at another checkout (a worktree's
# tests run with the main checkout's venv): first on the workers' PYTHONPATH, the runtime under test is what runs.
SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2] / "operator"


def as_kubelet_would(pod: dict[str, Any], client: KubeClient, mount_root: pathlib.Path) -> dict[str, str]:
    def read_secret(namespace: str, name: str, key: str) -> str:
        data = client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")["data"]
        return base64.b64decode(data[key]).decode()

    def read_configmap(namespace: str, name: str) -> dict[str, str]:
        configmap: dict[str, str] = client.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")["data"]
        return configmap

    return kubelet.container_environment(pod, read_secret, read_configmap, mount_root)


class Worker:
    """`celery -A <module> worker` in `app_dir`, with exactly the given env (plus PATH/HOME, and this checkout's
    runtime first on PYTHONPATH)."""

    def __init__(
        self, app_dir: pathlib.Path, module: str, env: dict[str, str], log_path: pathlib.Path, *options: str
    ) -> None:
        self.app_dir = app_dir
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            **env,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH")])),
        }
        self.command = [sys.executable, "-m", "celery", "-A", module, "worker", "--loglevel=INFO", *options]
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Worker:
        log = self.log_path.open("ab")
        # A session of its own, as a container's processes: a SIGKILL ends the pool's children with it.
        self.process = subprocess.Popen(
            self.command, cwd=self.app_dir, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        started_at = self.log_path.stat().st_size

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited:\n{self.log()[-5000:]}")
            return " ready." in self.log_path.read_text(errors="replace")[started_at:]

        waiting.eventually(ready, timeout=timeout, interval=0.2, message="the worker did not get ready")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def run(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Python code in the same environment and directory (a producer, an inspection)."""
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.app_dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    def spawn(self, code: str) -> subprocess.Popen[str]:
        """Like `run`, without waiting for it (a producer that keeps going while the test acts)."""
        return subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=self.app_dir,
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def kill(self) -> None:
        """SIGKILL to every process of the worker (its pool's children too), as a container's end."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self, timeout: float = 40) -> int:
        """SIGTERM, as the kubelet sends it on a rollout or scale-down; the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def stop_as_kubelet(self, grace_seconds: float) -> int | None:
        """What a kubelet does to a deleted pod: SIGTERM, then SIGKILL once its grace period passed; the exit code
        (None: killed)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(grace_seconds)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # warm shutdown
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def release_held(handled_log: pathlib.Path, *order_ids: int) -> None:
    """Lets the held tasks of these orders end (orders_app's `hold:` behaviour: it waits for this file)."""
    for order_id in order_ids:
        pathlib.Path(f"{handled_log}.release-{order_id}").touch()
