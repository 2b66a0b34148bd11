"""What each service injects into its worker pods, read from the API for the admission webhook.

Every replica answers the webhook, also one whose kopf watches are paused behind a peer (kopf stops the
watches of a paused operator, so its indexes would stay empty): the webhook therefore reads the services
of a pod's namespace itself, once per REFRESH_SECONDS, or after MISS_REFRESH_SECONDS when a pod names a
service not known yet (one created a moment ago). A failed read keeps what was known.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from typing import Any

from celery_event_operator.errors import InvalidSpecError, KubeError
from celery_event_operator.injection import pod, settings
from celery_event_operator.kubeapi import AsyncKubeApi
from celery_event_operator.service import spec as specs

REFRESH_SECONDS = 5.0
MISS_REFRESH_SECONDS = 1.0

logger = logging.getLogger(__name__)


def injection_of(body: dict[str, Any]) -> pod.Injection | None:
    """What a service's pods get; None for an invalid service (its pods are admitted unchanged)."""
    try:
        validated = specs.validate(body)
    except InvalidSpecError:
        return None
    ref = validated.spec.broker.secret_ref
    rendered = settings.render(validated.service_name, validated.spec)
    return pod.Injection(
        service=validated.service_name,
        secret_name=ref.name,
        secret_key=ref.key,
        configmap=settings.configmap_name(validated.service_name),
        config_hash=settings.config_hash(rendered),
    )


@dataclasses.dataclass
class _Namespace:
    read_at: float = float("-inf")
    injections: dict[str, pod.Injection] = dataclasses.field(default_factory=dict)  # serviceName → injection
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class InjectionCatalog:
    def __init__(self, kube: AsyncKubeApi) -> None:
        self._kube = kube
        self._namespaces: dict[str, _Namespace] = {}
        # A generation's spec never changes: rendered once, however many pods and re-reads.
        self._by_generation = specs.GenerationCache[pod.Injection | None]()

    async def find(self, namespace: str, service: str) -> pod.Injection | None:
        known = self._namespaces.setdefault(namespace, _Namespace())
        if self._stale(known, service):
            async with known.lock:  # a burst of pods waits for one read
                if self._stale(known, service):
                    await self._read(namespace, known)
        return known.injections.get(service)

    @staticmethod
    def _stale(known: _Namespace, service: str) -> bool:
        age = time.monotonic() - known.read_at
        return age > REFRESH_SECONDS or (service not in known.injections and age > MISS_REFRESH_SECONDS)

    async def _read(self, namespace: str, known: _Namespace) -> None:
        try:
            bodies = await self._kube.call(self._kube.api.list_services, namespace)
        except KubeError as exc:
            logger.warning("the webhook could not read the services of %s: %s", namespace, exc)
            known.read_at = time.monotonic()  # tried: not again for every pod of a burst
            return
        injections = {}
        for body in bodies:
            found = self._by_generation.get(body, functools.partial(injection_of, body))
            if found is not None:
                injections[found.service] = found
        known.injections, known.read_at = injections, time.monotonic()
