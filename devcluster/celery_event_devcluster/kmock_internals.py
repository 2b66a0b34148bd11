"""Everything the emulator takes from kmock beyond its public API, in one place.

kmock is pinned exactly (pyproject). tests/unit/devcluster/test_kmock_internals.py checks each of these
against the installed kmock and names what in dev mode breaks when one changes; the emulator's only other
tie to kmock's internals is the method it overrides, `_handle` (kmock's dispatch of one parsed request).
"""

from __future__ import annotations

from typing import Any

import aiohttp.web
import kmock
from kmock._internal.aiobus import Bus

__all__ = ["Bus", "aiohttp_request", "change_bus", "forget_served_requests", "serve_by_kmock"]


def forget_served_requests(emulator: kmock.KubernetesEmulator) -> None:
    """kmock keeps every request for assertions and re-scans them all on each new one; an API server
    for an operator that runs for hours must forget them (else latency grows without bound)."""
    emulator._requests.clear()
    for payload in emulator._payloads:
        payload._requests.clear()


def change_bus(emulator: kmock.KubernetesEmulator, resource: kmock.resource) -> Bus[Any]:
    """kmock's per-resource bus of object changes, which the emulator's watch streams follow."""
    bus: Bus[Any] = emulator._buses[resource]
    return bus


def aiohttp_request(request: kmock.Request) -> aiohttp.web.BaseRequest:
    """The aiohttp request under kmock's parsed one: a watch streams its response on it."""
    raw = request._raw_request
    if raw is None:
        raise RuntimeError("kmock served a request without its aiohttp request")
    return raw


async def serve_by_kmock(emulator: kmock.KubernetesEmulator, request: kmock.Request) -> aiohttp.web.StreamResponse:
    """kmock's own handling (discovery, reactions) of a request the emulator does not take itself."""
    return await kmock.KubernetesEmulator._handle(emulator, request)
