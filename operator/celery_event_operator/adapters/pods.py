"""The worker pods of every service, listed and then watched by the operator itself: what each service's passes
read of its pods, and a deleted pod's metric series dropped at once.

Not kopf's index: kopf holds every handler until each object it has seen is indexed, adding a toggle per object
that wakes every waiting handler (kopf 1.45's `ToggleSet`): quadratic in the objects that arrive together, ~40 % of
the operator's CPU while 1,000 services and their 2,000 pods became Ready (bench/scale.py). Here a listing is one
consistent snapshot, which a service's first pass waits for once; the watch goes on from its resourceVersion (one
thread per namespace served, or one for the cluster), and a watch too old to resume (410) lists again. A replica
whose kopf watches are paused behind a peer keeps its pods current all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, Protocol

from celery_event_operator.core.errors import KubeError
from celery_event_operator.core.service.pods import PodsOf
from celery_event_operator.core.service.watched import Labelled, WatchedPods

# As kopf's server timeout: a watch that hangs silently is replaced within a minute.
WATCH_SECONDS = 50
# After a failed listing or watch, listed again after these pauses (the last one repeated).
RETRY_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)

logger = logging.getLogger(__name__)


class PodsApi(Protocol):
    """What the watch needs of the API (adapters/kubeapi.py's KubeApi)."""

    def list_worker_pods(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]: ...

    def watch_worker_pods(
        self, namespace: str | None, since: str, seconds: int
    ) -> Generator[dict[str, Any], None, None]: ...


class _Expired(Exception):
    """The watch's resourceVersion is older than the API server keeps (410): list again."""


def watch_scopes(namespaces: tuple[str, ...]) -> tuple[str | None, ...]:
    """What the pods are watched in, a thread each: every namespace served once, or the cluster (None)."""
    return tuple(dict.fromkeys(namespaces)) or (None,)


class PodWatch:
    def __init__(self, api: PodsApi, namespaces: tuple[str, ...], gone: Callable[[Labelled], None]) -> None:
        """`namespaces`: those the operator serves (none: every namespace, one cluster-wide watch). `gone` is
        called, on the event loop, with each pod deleted (or found gone by a listing)."""
        self._api = api
        self._scopes = watch_scopes(namespaces)
        self._gone = gone
        self._pods = WatchedPods()
        self._unlisted = set(self._scopes)
        self._listed = asyncio.Event()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """List and watch from now on, in the background (called on the running event loop)."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for scope in self._scopes:
            name = f"pod-watch-{scope or 'cluster'}"
            threading.Thread(target=self._follow, args=(scope,), name=name, daemon=True).start()

    async def listed(self) -> None:
        """Once every namespace's pods were listed (a service's first pass must not take "none yet" for none)."""
        await self._listed.wait()

    def of(self, namespace: str) -> PodsOf:
        """A view of one namespace's services' live pods (read when called)."""
        return functools.partial(self._pods.of, namespace)

    def close(self) -> None:
        self._stop.set()  # each thread ends with its watch (at most WATCH_SECONDS): they are daemons

    def _follow(self, scope: str | None) -> None:
        failures = 0  # in a row: the pause before the next listing grows with them
        while not self._stop.is_set():
            try:
                objects, version = self._api.list_worker_pods(scope)
                self._on_loop(self._replace, scope, objects)
                while not self._stop.is_set():
                    version = self._watch(scope, version)
                    failures = 0  # only a watch that worked: a listing alone may well be followed by a refusal
            except RuntimeError:
                if self._loop is not None and self._loop.is_closed():
                    return  # the operator is stopping
                failures = self._pause(scope, failures, "RuntimeError")
            # A thread that stopped would leave the pods as they were for ever: whatever went wrong, listed again.
            except Exception as exc:  # noqa: BLE001
                text = "its resourceVersion is too old (410)" if isinstance(exc, _Expired) else str(exc)
                failures = self._pause(
                    scope, failures, text if isinstance(exc, KubeError | _Expired) else type(exc).__name__
                )

    def _pause(self, scope: str | None, failures: int, why: str) -> int:
        pause = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
        logger.warning(
            "the worker pods of %s are not watched (listed again in %.0f s): %s", scope or "the cluster", pause, why
        )
        self._stop.wait(pause)
        return failures + 1

    def _watch(self, scope: str | None, version: str) -> str:
        """One watch from `version`, its events applied on the event loop; the version to go on from. One that ends
        at once with nothing (a proxy closing it) is a failure: not opened again at full speed."""
        events, started = 0, time.monotonic()
        with contextlib.closing(self._api.watch_worker_pods(scope, version, WATCH_SECONDS)) as stream:
            for event in stream:
                kind, obj = event.get("type"), event.get("object")
                if not isinstance(obj, dict):
                    continue
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired
                    raise KubeError(f"the pods' watch ended: {obj.get('code')} {obj.get('reason')}")
                events += 1
                meta: Any = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or version)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._on_loop(self._change, kind, obj)
                if self._stop.is_set():
                    break
        if not events and time.monotonic() - started < WATCH_SECONDS / 2 and not self._stop.is_set():
            raise KubeError("the pods' watch ended at once, with nothing")
        return version

    def _on_loop(self, apply: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(apply, *args)

    def _replace(self, scope: str | None, objects: list[dict[str, Any]]) -> None:
        if self._stop.is_set():
            return  # closed: what comes after is nobody's
        for pod in self._pods.listed(scope, objects):
            self._gone(pod)
        self._unlisted.discard(scope)
        if not self._unlisted:
            self._listed.set()

    def _change(self, kind: str, obj: dict[str, Any]) -> None:
        if self._stop.is_set():
            return
        pod = self._pods.changed(kind, obj)
        if pod is not None:
            self._gone(pod)
