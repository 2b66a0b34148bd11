"""Replays of one service share its read: those that ask while it is under way wait for it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from celery_event_operator.core.errors import KubeUnavailableError
from celery_event_operator.flow.replays import ServiceReads


class CountingKube:
    def __init__(self, answer: dict[str, Any] | Exception) -> None:
        self.answer, self.reads = answer, 0

    async def read_service(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        await asyncio.sleep(0.01)  # the API's round trip
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_a_thousand_replays_asking_at_once_cost_one_read() -> None:
    kube = CountingKube({"metadata": {"name": "billing"}})
    reads = ServiceReads()
    found = await asyncio.gather(*(reads.read(kube, ("shop", "billing")) for _ in range(1000)))
    assert kube.reads == 1
    assert all(body == {"metadata": {"name": "billing"}} for body in found)


async def test_a_failed_read_is_every_askers_failure() -> None:
    kube = CountingKube(KubeUnavailableError("the API did not answer"))
    reads = ServiceReads()
    for _ in range(3):
        with pytest.raises(KubeUnavailableError):
            await reads.read(kube, ("shop", "billing"))
    assert kube.reads == 1
