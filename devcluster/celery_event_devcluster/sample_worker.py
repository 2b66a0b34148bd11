"""The dev mode's sample worker: examples/app/billing_app.py run locally as the webhook would have
configured its pod, plus a trickle of events, so that status and /metrics show live numbers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import yaml

from celery_event_devcluster import kubelet
from celery_event_operator.core.api.metadata import HASH_ANNOTATION
from celery_event_operator.core.errors import InvalidSpecError
from celery_event_operator.core.injection import pod as injection_pod
from celery_event_operator.core.injection import settings
from celery_event_operator.core.service import spec as specs

POD_NAME = "billing-worker-dev"
POD_PATH = f"/api/v1/namespaces/default/pods/{POD_NAME}"
SERVICE_PATH = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices/billing"
FOLLOW_SECONDS = 2.0
STOP_SECONDS = 5.0
# An event a second; every 20th (the 5th first, so a new user sees one soon) is published by a buggy producer,
# with an argument missing: no retry can fix it, so it is archived at once (`archive list billing` shows it).
TRAFFIC = """
import itertools, time
from billing_app import app, order_cancelled, order_created
for order_id in itertools.count(1):
    if order_id % 20 == 5:
        app.send_task("orders.order.created", args=(order_id,), routing_key="orders.order.created",
                      exchange=app.events_settings.events_exchange, declare=[])
    else:
        order_created(order_id, 100 * order_id)
    if order_id % 5 == 0:
        order_cancelled(order_id)
    time.sleep(1)
"""


async def _get(session: aiohttp.ClientSession, path: str) -> dict[str, Any] | None:
    async with session.get(path) as response:
        if response.status == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = await response.json()
        return body


async def _configured_pod(server_url: str, examples: pathlib.Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The worker pod of examples/billing-worker.yaml after injection, and its settings files."""
    deployment = yaml.safe_load((examples / "billing-worker.yaml").read_text())
    template = deployment["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": template["spec"],
        "metadata": {**template["metadata"], "name": POD_NAME, "namespace": "default"},
    }
    async with aiohttp.ClientSession(server_url) as session:
        body = await _get(session, SERVICE_PATH)
        if body is None:
            raise LookupError("the sample CeleryEventService is missing")
        validated = specs.validate(body)
        name = settings.configmap_name(validated.service_name)
        rendered = settings.render(validated.service_name, validated.spec)
        while True:  # the operator writes it on its reconcile of this generation
            configmap = await _get(session, f"/api/v1/namespaces/default/configmaps/{name}")
            if configmap is not None and settings.data_hash(configmap.get("data") or {}) == settings.config_hash(
                rendered
            ):
                break
            await asyncio.sleep(0.5)
        ref = validated.spec.broker.secret_ref
        changes = injection_pod.changes(
            pod,
            injection_pod.Injection(
                service=validated.service_name,
                secret_name=ref.name,
                secret_key=ref.key,
                configmap=name,
                config_hash=settings.config_hash(rendered),
            ),
        )
        pod["spec"] = {**pod["spec"], "containers": changes.containers, "volumes": changes.volumes}
        pod["metadata"]["annotations"] = changes.annotations
        async with session.post("/api/v1/namespaces/default/pods", json=pod) as response:
            response.raise_for_status()  # a live pod: its metric series stay
    return pod, configmap.get("data") or {}


def _start(env: dict[str, str], app_dir: pathlib.Path, log: Any) -> tuple[subprocess.Popen[bytes], ...]:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "billing_app",
            "worker",
            "--pool=solo",
            f"--hostname=celery@{POD_NAME}",
            "--loglevel=INFO",
        ],
        cwd=app_dir,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    traffic = subprocess.Popen(
        [sys.executable, "-c", TRAFFIC], cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    return traffic, worker


async def _stop(processes: tuple[subprocess.Popen[bytes], ...]) -> None:
    """SIGTERM, then SIGKILL after STOP_SECONDS, as a kubelet does after the grace period (but shorter: the
    worker's soft shutdown waits out all of its 25 s when a task runs, and dev mode should stop at once).
    A task still running is handed back to the broker (late acks): nothing is lost."""
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            await asyncio.to_thread(process.wait, STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            await asyncio.to_thread(process.wait)


async def _current_hash(server_url: str) -> str | None:
    """The settings hash the service's pods should carry now (None while the service is missing or invalid)."""
    async with aiohttp.ClientSession(server_url) as session:
        body = await _get(session, SERVICE_PATH)
    if body is None:
        return None
    try:
        validated = specs.validate(body)
    except InvalidSpecError:
        return None
    return settings.config_hash(settings.render(validated.service_name, validated.spec))


async def _replace_pod(server_url: str) -> None:
    async with aiohttp.ClientSession(server_url) as session, session.delete(POD_PATH) as response:
        if response.status not in (200, 404):
            response.raise_for_status()


@contextlib.asynccontextmanager
async def running(
    server_url: str, broker_url: str, examples: pathlib.Path, state_dir: pathlib.Path
) -> AsyncIterator[None]:
    """Start the sample worker and its traffic once the operator configured the service; stop both. When the
    service's settings change, the worker is replaced by one on the new settings, as a rollout replaces a pod."""
    examples, state_dir = examples.resolve(), state_dir.resolve()  # the worker runs in examples/app
    log = (state_dir / "sample-worker.log").open("ab")

    async def start() -> tuple[tuple[subprocess.Popen[bytes], ...], str]:
        pod, data = await _configured_pod(server_url, examples)
        env = kubelet.container_environment(pod, lambda *_: broker_url, lambda *_: data, state_dir / "settings")
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **env}
        return _start(env, examples / "app", log), pod["metadata"]["annotations"][HASH_ANNOTATION]

    processes, running_hash = await start()

    async def follow_settings() -> None:
        nonlocal processes, running_hash
        while True:
            await asyncio.sleep(FOLLOW_SECONDS)
            wanted = await _current_hash(server_url)
            if wanted is None or wanted == running_hash:
                continue
            log.write(f"--- settings {wanted} replace {running_hash}: the sample worker restarts ---\n".encode())
            log.flush()
            await _stop(processes)
            await _replace_pod(server_url)
            processes, running_hash = await start()

    follower = asyncio.create_task(follow_settings())
    try:
        yield
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await _stop(processes)
        log.close()
