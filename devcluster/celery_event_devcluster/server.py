"""Serving the emulated Kubernetes API on a local port, with a kubeconfig for kubectl and kopf."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

import kmock
import yaml

from celery_event_devcluster.emulator import KubeEmulator

CONTEXT_NAME = "celery-event-operator-dev"


@contextlib.asynccontextmanager
async def serve(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[tuple[KubeEmulator, str]]:
    """Run the emulator on host:port (0: a free port) until the context exits; yields it and its URL."""
    emulator = KubeEmulator()
    async with emulator, kmock.Server(emulator, host=host, port=port) as server:
        yield emulator, str(server.url).rstrip("/")


def write_kubeconfig(path: pathlib.Path, server_url: str, namespace: str = "default") -> pathlib.Path:
    """A kubeconfig whose current context is the emulator (plain HTTP, no credentials: it checks none)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT_NAME, "cluster": {"server": server_url}}],
        "users": [{"name": CONTEXT_NAME, "user": {}}],
        "contexts": [
            {"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": CONTEXT_NAME, "namespace": namespace}}
        ],
        "current-context": CONTEXT_NAME,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
