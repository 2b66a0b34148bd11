"""The webhook's catalog of what each service injects: read per namespace, a burst of pods costs one read, a
failed read keeps what was known, an invalid service injects nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from celery_event_operator.adapters.injection import catalog
from celery_event_operator.adapters.kubeapi import AsyncKubeApi
from celery_event_operator.core.errors import KubeError
from tests.unit.flow.fakes import resource


class _Services:
    def __init__(self, bodies: list[dict[str, Any]]) -> None:
        self.bodies = bodies
        self.failure: KubeError | None = None
        self.reads = 0

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        self.reads += 1
        if self.failure is not None:
            raise self.failure
        return self.bodies


class _Kube:
    """AsyncKubeApi's shape, answering from memory."""

    def __init__(self, api: _Services) -> None:
        self.api = api

    async def call(self, method: Callable[..., Any], *args: Any) -> Any:
        return method(*args)


def _catalog(services: _Services) -> catalog.InjectionCatalog:
    kube: Any = _Kube(services)
    found: AsyncKubeApi = kube
    return catalog.InjectionCatalog(found)


async def test_a_service_is_found_once_read_and_an_invalid_one_injects_nothing(monkeypatch: Any) -> None:
    invalid = resource(retry={"maxRetries": 99})
    invalid["metadata"] = {**invalid["metadata"], "name": "broken", "uid": "u2"}
    services = _Services([resource(), invalid])
    found = _catalog(services)
    try:
        injection = await found.find("shop", "billing")
        assert injection is not None
        assert (injection.service, injection.secret_name, injection.configmap) == (
            "billing",
            "rabbitmq",
            "billing-celery-events",
        )
        assert await found.find("shop", "broken") is None
        assert services.reads == 1, "a burst of pods waits for one read"

        later = catalog.time.monotonic() + catalog.REFRESH_SECONDS * 10
        monkeypatch.setattr(catalog.time, "monotonic", lambda: later)
        services.failure = KubeError("cannot list the CeleryEventServices of shop: HTTP 500")
        await found._list("shop", found._namespaces["shop"])
        assert services.reads == 2
        assert await found.find("shop", "billing") == injection, "a failed read keeps what was known"
    finally:
        found.close()


async def test_a_known_service_is_answered_without_waiting_on_the_api() -> None:
    """The webhook's latency does not follow the API server's: a known service is answered from memory while a
    listing hangs; a service not known yet waits for a listing at most MISS_WAIT_SECONDS."""
    services = _Services([resource()])
    found = _catalog(services)
    try:
        assert await found.find("shop", "billing") is not None
        hanging = asyncio.Event()
        kube: Any = found._kube

        async def slow(method: Callable[..., Any], *args: Any) -> Any:
            await hanging.wait()
            return method(*args)

        kube.call = slow
        found._list("shop", found._namespaces["shop"])  # the background listing, stuck on the API
        started = time.monotonic()
        assert await found.find("shop", "billing") is not None
        assert time.monotonic() - started < 0.05
        started = time.monotonic()
        assert await found.find("shop", "shipping") is None
        assert catalog.MISS_WAIT_SECONDS <= time.monotonic() - started < catalog.MISS_WAIT_SECONDS + 0.5
    finally:
        found.close()


async def test_the_catalog_is_kept_current_in_the_background(monkeypatch: Any) -> None:
    monkeypatch.setattr(catalog, "REFRESH_SECONDS", 0.05)
    services = _Services([])
    found = catalog.InjectionCatalog(_Kube(services), ("shop",))  # type: ignore[arg-type]
    try:
        found.start()
        services.bodies = [resource()]
        for _ in range(100):
            await asyncio.sleep(0.01)
            if found._namespaces["shop"].injections:
                break
        assert "billing" in found._namespaces["shop"].injections, "listed without any admission asking"
    finally:
        found.close()


def test_a_resource_refused_its_service_name_injects_nothing() -> None:
    """Its pods must not consume the owner's queues (docs/user-guide/ownership.md)."""
    refused = resource()
    refused["status"] = {"conditions": [{"type": "Ready", "status": "False", "reason": "ServiceNameConflict"}]}
    assert catalog.injection_of(refused) is None
    refused["status"]["conditions"][0] |= {"status": "True", "reason": "Reconciled"}  # took the name over
    assert catalog.injection_of(refused) is not None


async def test_a_pod_stamped_with_settings_newer_than_known_waits_for_a_listing() -> None:
    """A rollout's pods come from a template the operator stamped with the new settings' hash, a moment after the
    spec changed (the real Deployment controller creates them within milliseconds): they must get those settings,
    not the catalog's of up to REFRESH_SECONDS ago."""
    services = _Services([resource()])
    found = _catalog(services)
    try:
        old = await found.find("shop", "billing")
        assert old is not None
        changed = resource(retry={"maxRetries": 3})
        changed["metadata"]["generation"] = 2
        services.bodies = [changed]
        assert await found.find("shop", "billing", stamped=old.config_hash) == old, "current: no listing"
        assert services.reads == 1
        new = await found.find("shop", "billing", stamped="the hash of the new settings")
        assert new is not None
        assert new.config_hash != old.config_hash
        assert services.reads == 2
        assert await found.find("shop", "billing", stamped="an old hash, of an old ReplicaSet") == new
        assert services.reads == 3
        assert await found.find("shop", "billing", stamped="an old hash, of an old ReplicaSet") == new
        assert services.reads == 3, "a stamp not current after a listing is not listed for again"
    finally:
        found.close()
