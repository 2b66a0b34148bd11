"""The emulated Kubernetes API for tests: served from a background thread, spoken to over HTTP.

Tests talk to it as any client would (HTTP, kubectl), never through its Python objects, so what they
check is what a real API server would have served.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import secrets
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from celery_event_devcluster.access import Asked
from celery_event_devcluster.emulator import KubeEmulator
from celery_event_devcluster.rbac import Identity
from celery_event_devcluster.server import serve, write_kubeconfig
from tests.support import waiting

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body.get('message')}")
        self.status = status
        self.body = body


def _status_of(answer: bytes) -> dict[str, Any]:
    """An error's body: a Status object, or the plain text a real API server answers for a path it does not serve
    ("404 page not found": a resource whose CRD is not installed)."""
    try:
        found = json.loads(answer or b"{}")
    except ValueError:
        return {"message": answer.decode(errors="replace").strip()}
    return found if isinstance(found, dict) else {"message": str(found)}


class KubeClient:
    """Just enough of a Kubernetes client for assertions: raw paths, JSON in and out."""

    def __init__(self, server_url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> None:
        self.server_url = server_url
        self.context = context  # HTTPS: the CA and the client certificate of a real API server
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        accept: str = "application/json",
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.server_url + path,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": accept, **self.headers},
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.context) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _status_of(exc.read())) from None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def create(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def json_patch(self, path: str, operations: list[dict[str, Any]]) -> Any:
        return self.request("PATCH", path, operations, content_type="application/json-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)


class EmulatedApi:
    """The dev-mode emulator on a free port, in a thread with its own event loop."""

    def __init__(self, kubeconfig: pathlib.Path) -> None:
        self.kubeconfig = kubeconfig
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self.url = ""
        self.emulator: KubeEmulator | None = None  # for white-box checks of the adapter only
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with serve(port=0) as (emulator, url):
            self.emulator = emulator
            self.url = url
            write_kubeconfig(self.kubeconfig, url)
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> EmulatedApi:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the emulated Kubernetes API did not start")
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _on_loop(self, work: Callable[[KubeEmulator], T]) -> T:
        """Run `work` on the emulator's event loop (its state is the loop's alone)."""
        assert self.emulator is not None
        emulator = self.emulator

        async def run() -> T:
            return work(emulator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(10)

    def restricted_kubeconfig(self, identity: Identity, path: pathlib.Path) -> pathlib.Path:
        """A kubeconfig whose requests come from `identity`: RBAC from the API's own Roles and bindings decides
        them (and the admission plugins enabled with `admit`)."""
        token = secrets.token_urlsafe(24)
        self._on_loop(lambda emulator: emulator.access.restrict(token, identity))
        return write_kubeconfig(path, self.url, token=token)

    def admit(self, plugin: str) -> None:
        """Enable an admission plugin for the restricted identities (owner_references.NAME)."""
        self._on_loop(lambda emulator: emulator.access.admission.add(plugin))

    def writes(self) -> dict[tuple[str, str], int]:
        """Every write served so far, by (resource, subresource)."""
        return self._on_loop(lambda emulator: dict(emulator.writes))

    def asked(self) -> dict[Asked, int]:
        """What the restricted identities asked so far, and how often."""
        return self._on_loop(lambda emulator: dict(emulator.access.asked))

    @property
    def client(self) -> KubeClient:
        return KubeClient(self.url)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )


def eventually(
    probe: Callable[[], T], timeout: float = 10, interval: float = 0.1, message: str = "condition not reached"
) -> T:
    """`waiting.eventually`, with API errors (an object not there yet) counting as "not yet"."""
    return waiting.eventually(probe, timeout, interval, message, retrying=(AssertionError, ApiError))


def condition(api: EmulatedApi, type: str, name: str = "billing", namespace: str = "default") -> dict[str, Any]:
    """One condition of a CeleryEventService's status; {} while it has none."""
    path = f"/apis/celeryevents.io/v1alpha1/namespaces/{namespace}/celeryeventservices/{name}"
    status = api.client.get(path).get("status") or {}
    return next((c for c in status.get("conditions", []) if c["type"] == type), {})


def gone(client: KubeClient, path: str) -> bool:
    """Whether the object at `path` is gone (404)."""
    try:
        client.get(path)
    except ApiError as exc:
        return exc.status == 404
    return False


def events(api: EmulatedApi, reason: str, namespace: str = "default") -> list[dict[str, Any]]:
    """The Events of a reason. kopf posts Events from a queue of its own: wait for them with `eventually`."""
    items: list[dict[str, Any]] = api.client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return [event for event in items if event.get("reason") == reason]


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def install_crds(api: EmulatedApi, definitions: Iterable[dict[str, Any]]) -> None:
    """The CustomResourceDefinitions the API does not serve yet (a chart's: ours, kopf's peerings)."""
    served = {item["metadata"]["name"] for item in api.client.get(CRDS)["items"]}
    for definition in definitions:
        if definition["metadata"]["name"] not in served:
            api.client.create(CRDS, definition)
