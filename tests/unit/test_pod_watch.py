"""The pods' list-and-watch loop against a scripted API: a watch too old to resume lists again (and a listing says
which pods went meanwhile), any failure is listed again after a pause, the first pass waits for the first listing.
(The API is scripted here because a real API server cannot be made to forget a watch's version on demand;
tests/integration/cluster/test_pod_watch_on_cluster.py watches a real one.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator
from typing import Any

import pytest

from celery_event_operator.adapters import pods as pod_watch
from celery_event_operator.adapters.pods import PodsApi, PodWatch
from celery_event_operator.core.api.metadata import SERVICE_LABEL
from celery_event_operator.core.errors import KubeUnavailableError
from celery_event_operator.core.service.watched import Labelled


def pod(name: str, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {SERVICE_LABEL: "billing"},
            "resourceVersion": version,
        }
    }


class ScriptedApi:
    def __init__(self) -> None:
        self.listings = [([pod("a"), pod("b")], "10"), ([pod("c")], "20"), ([pod("c")], "30")]
        self.watched: list[str] = []
        self.released = threading.Event()
        self.first_listing = threading.Event()

    def list_worker_pods(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        assert namespace == "shop"
        self.first_listing.wait(5)  # held until the test has seen a pass wait for it
        return self.listings.pop(0)

    def watch_worker_pods(
        self, namespace: str | None, since: str, seconds: int
    ) -> Generator[dict[str, Any], None, None]:
        self.watched.append(since)
        if since == "10":
            yield {"type": "ADDED", "object": pod("c", "11")}
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}
        elif since == "15":
            yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
        elif since == "20":
            raise KubeUnavailableError("cannot watch the worker pods of shop: no answer (ProtocolError)")
        else:
            self.released.wait(10)


async def eventually(check: Any, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the time")


async def test_a_watch_too_old_lists_again_and_a_failure_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pod_watch, "RETRY_SECONDS", (0.01,))
    api = ScriptedApi()
    typed: PodsApi = api
    gone: list[Labelled] = []
    watch = PodWatch(typed, ("shop",), gone.append)
    watch.start()
    waiting = asyncio.ensure_future(watch.listed())
    await asyncio.sleep(0.1)
    assert not waiting.done(), "a pass must not read the pods before they were listed"
    api.first_listing.set()
    async with asyncio.timeout(5):
        await waiting
    pods_of = watch.of("shop")
    await eventually(lambda: api.watched == ["10", "15", "20", "30"])
    await eventually(lambda: [found.name for found in pods_of("billing")] == ["c"])
    assert sorted(found.name for found in gone) == ["a", "b"], "gone while the watch was too old: found by the listing"
    watch.close()
    api.released.set()


class RefusedWatches:
    """Listings answer; every watch is refused (an API server behind a balancer whose replica's cache lags)."""

    def __init__(self, watch: list[PodWatch]) -> None:
        self.listings = 0
        self.watch = watch

    def list_worker_pods(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        self.listings += 1
        if self.listings == 7:
            self.watch[0].close()
        return [pod("a")], str(self.listings)

    def watch_worker_pods(
        self, namespace: str | None, since: str, seconds: int
    ) -> Generator[dict[str, Any], None, None]:
        yield {"type": "ERROR", "object": {"kind": "Status", "code": 500, "reason": "Too large resource version"}}


async def test_a_listing_that_answers_does_not_reset_the_pause_of_watches_that_fail() -> None:
    holder: list[PodWatch] = []
    api = RefusedWatches(holder)
    typed: PodsApi = api
    watch = PodWatch(typed, ("shop",), lambda _: None)
    holder.append(watch)
    pauses: list[float] = []

    def waited(timeout: float | None = None) -> bool:
        pauses.append(timeout or 0.0)
        return watch._stop.is_set()

    watch._stop.wait = waited  # type: ignore[method-assign]  # the pauses recorded, not slept
    watch.start()
    await eventually(lambda: api.listings == 7)
    assert pauses[:6] == [1.0, 2.0, 5.0, 10.0, 30.0, 30.0]
