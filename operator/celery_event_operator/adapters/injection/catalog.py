"""What each service injects into its worker pods, kept current in the background for the admission webhook.

Every replica answers the webhook, also one whose kopf watches are paused behind a peer (kopf stops the watches
of a paused operator, so its indexes would stay empty): the catalog therefore lists the services of each namespace
it serves or was asked about itself, every REFRESH_SECONDS, in the background. The webhook answers from what it
holds and never waits on the API for a service it knows, so its latency does not follow the API server's; only
for a service not known yet (one created a moment ago) does it ask for a listing at once and wait for it, at most
MISS_WAIT_SECONDS. A failed listing keeps what was known.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from typing import Any

from celery_event_operator.adapters.kubeapi import AsyncKubeApi
from celery_event_operator.core.api import conditions
from celery_event_operator.core.errors import InvalidSpecError, KubeError
from celery_event_operator.core.injection import pod, settings
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.ownership import CONFLICT_REASON

REFRESH_SECONDS = 5.0
# A pod of a service not known yet: a listing at most this often per namespace, waited for at most this long (the
# webhook's own deadline is the chart's 5 s timeout).
MISS_REFRESH_SECONDS = 1.0
MISS_WAIT_SECONDS = 1.0
# A pod whose template carries a settings hash the catalog does not hold (a rollout's pod, created the moment the
# operator stamped its template) waits for one listing per such hash; the last this many hashes are remembered.
STAMPS_REMEMBERED = 32
# A namespace is kept current while its pods asked in this long (and the served ones from the start), at most this
# many at once: one listing per namespace and REFRESH_SECONDS, not for namespaces whose pods do not change.
IDLE_SECONDS = 600.0
MAX_NAMESPACES = 1000

logger = logging.getLogger(__name__)


def injection_of(body: dict[str, Any]) -> pod.Injection | None:
    """What a service's pods get; None for an invalid service, or one whose serviceName another resource owns (its
    pods are admitted unchanged: they must not consume the owner's queues)."""
    if conditions.find_written(body.get("status"), conditions.READY).get("reason") == CONFLICT_REASON:
        return None
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


def grace_of(body: dict[str, Any]) -> int | None:
    """The grace period the service's status asks of its new pods (None: none yet)."""
    grace = (body.get("status") or {}).get("gracePeriodSeconds")
    return grace if isinstance(grace, int) and not isinstance(grace, bool) and grace > 0 else None


@dataclasses.dataclass
class _Namespace:
    read_at: float = float("-inf")  # the last listing, answered or not
    asked_at: float = float("-inf")  # the last admission that asked about the namespace
    injections: dict[str, pod.Injection] = dataclasses.field(default_factory=dict)  # serviceName → injection
    listing: asyncio.Task[None] | None = None  # the listing under way
    stamps_listed: list[str] = dataclasses.field(default_factory=list)  # hashes of pods a listing was made for


class InjectionCatalog:
    def __init__(self, kube: AsyncKubeApi, served: tuple[str, ...] = ()) -> None:
        """`served`: the namespaces the operator serves, listed from the start (cluster-wide: none; namespaces are
        learnt from the pods)."""
        self._kube = kube
        self._namespaces: dict[str, _Namespace] = {
            namespace: _Namespace(asked_at=time.monotonic()) for namespace in served[:MAX_NAMESPACES]
        }
        # A generation's spec never changes: rendered once, however many pods and re-reads.
        self._by_generation = specs.GenerationCache[pod.Injection | None]()
        self._refresher: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Keep the catalog current in the background (on the running event loop), from now on."""
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        for known in self._namespaces.values():
            if known.listing is not None:
                known.listing.cancel()

    async def find(self, namespace: str, service: str, stamped: str | None = None) -> pod.Injection | None:
        """What the service's pods get: at once when known; else after a listing (waited for a short while).
        `stamped`: the settings hash the pod's template carries; one the catalog does not hold may be newer than
        its last listing (the operator stamps a template as soon as the settings changed): listed for once."""
        self.start()
        known = self._namespaces.get(namespace)
        if known is None:
            known = self._namespaces[namespace] = _Namespace()
            self._bound()
        now = time.monotonic()
        known.asked_at = now
        found = known.injections.get(service)
        if found is not None and (stamped in (None, found.config_hash) or stamped in known.stamps_listed):
            return found
        if found is not None and stamped is not None:
            known.stamps_listed = [*known.stamps_listed[-STAMPS_REMEMBERED + 1 :], stamped]
            with contextlib.suppress(TimeoutError):
                # A listing under way may have begun before the change: the one that counts begins after it.
                if known.listing is not None:
                    async with asyncio.timeout(MISS_WAIT_SECONDS):
                        await asyncio.shield(known.listing)
                async with asyncio.timeout(MISS_WAIT_SECONDS):
                    await asyncio.shield(self._list(namespace, known))
            return known.injections.get(service, found)
        if known.listing is None and now - known.read_at > MISS_REFRESH_SECONDS:
            self._list(namespace, known)
        if known.listing is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MISS_WAIT_SECONDS):
                    await asyncio.shield(known.listing)
        return known.injections.get(service)

    def _list(self, namespace: str, known: _Namespace) -> asyncio.Task[None]:
        """A listing of the namespace's services, one at a time per namespace."""
        if known.listing is None:
            known.listing = asyncio.get_running_loop().create_task(self._read(namespace, known))
        return known.listing

    async def _refresh_forever(self) -> None:
        while True:
            now = time.monotonic()
            for namespace, known in list(self._namespaces.items()):
                if now - known.asked_at > IDLE_SECONDS:
                    del self._namespaces[namespace]  # no pod of it asked for a long while: not listed, not kept
                elif now - known.read_at >= REFRESH_SECONDS:
                    await asyncio.shield(self._list(namespace, known))
            await asyncio.sleep(REFRESH_SECONDS / 5)

    def _bound(self) -> None:
        """At most MAX_NAMESPACES are kept current: those asked about longest ago go first."""
        while len(self._namespaces) > MAX_NAMESPACES:
            oldest = min(self._namespaces, key=lambda name: self._namespaces[name].asked_at)
            dropped = self._namespaces.pop(oldest)
            if dropped.listing is not None:
                dropped.listing.cancel()

    async def _read(self, namespace: str, known: _Namespace) -> None:
        try:
            bodies = await self._kube.call(self._kube.api.list_services, namespace)
        except KubeError as exc:
            logger.warning("the webhook could not list the services of %s (what was known is kept): %s", namespace, exc)
            return
        finally:
            known.read_at, known.listing = time.monotonic(), None
        injections = {}
        for body in bodies:
            found = self._by_generation.get(body, functools.partial(injection_of, body))
            if found is not None:  # the spec's part per generation; the grace period from the status as it is now
                injections[found.service] = dataclasses.replace(found, grace_seconds=grace_of(body))
        known.injections = injections
