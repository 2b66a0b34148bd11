"""A service's broker settings read from the Secret its spec names (I/O; what the data means: broker/settings.py).

Whoever may create a CeleryEventService in a namespace makes the operator read a Secret
there on their behalf: what it reads is used only to talk to the broker the Secret names, and nothing of
it is ever shown (errors name the Secret and the key, never a value).

`SecretReader` reads through the Kubernetes API with a short cache, so
that a thousand services sharing one Secret cost one read, and a rotated Secret is seen within seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from celery_event_operator.adapters.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.broker.settings import BrokerSettings, settings_from_secret
from celery_event_operator.core.errors import KubeUnavailableError, OperatorError

CACHE_SECONDS = 10.0
# While the Kubernetes API does not answer, a Secret is read again after 1, 2, 4 … s (at most CACHE_SECONDS) and
# its last good data served; only after this long without an answer is that reported.
UNAVAILABLE_BACKOFF_SECONDS = 1.0
UNAVAILABLE_GRACE_SECONDS = 60.0
# What is known of a Secret no service asked for this long is forgotten.
FORGET_SECONDS = 600.0

logger = logging.getLogger(__name__)


def read_settings(kube: KubeApi, namespace: str, spec: CeleryEventServiceSpec) -> BrokerSettings:
    """For the command line: one read, no cache."""
    name = spec.broker.secret_ref.name
    return settings_from_secret(kube.read_secret_data(namespace, name), namespace=namespace, secret=name, spec=spec)


@dataclasses.dataclass
class _Read:
    """What is known of one Secret: its last good data, or why it is unusable, and when to read it again."""

    data: dict[str, str] | None = None  # as last read (kept through the API's passing faults)
    failure: OperatorError | None = None  # the Secret is absent or unusable (the user's to fix)
    next_read: float = -float("inf")
    unavailable_since: float | None = None  # the API has not answered since then
    unavailable: KubeUnavailableError | None = None
    attempts: int = 0  # reads the API did not answer in a row
    asked_at: float = -float("inf")  # a service last asked for it


class SecretReader:
    """Secrets' data for a few seconds, shared by the services that name the same Secret.

    When the Kubernetes API does not answer (a 5xx, a 429, a timeout), the last good data is served and the Secret
    is read again with backoff; only when no answer came for UNAVAILABLE_GRACE_SECONDS (or nothing was ever read) is
    that said, as KubeUnavailableError: the API's fault, never the Secret's."""

    def __init__(self, kube: AsyncKubeApi, cache_seconds: float = CACHE_SECONDS) -> None:
        self._kube = kube
        self._cache_seconds = cache_seconds
        self._read: dict[tuple[str, str], _Read] = {}
        self._reading: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._swept_at = time.monotonic()

    async def settings(self, namespace: str, spec: CeleryEventServiceSpec) -> BrokerSettings:
        name = spec.broker.secret_ref.name
        data = await self._data(namespace, name)
        return settings_from_secret(data, namespace=namespace, secret=name, spec=spec)

    def forget(self, namespace: str, name: str) -> None:
        """Read it again next time (a login was refused: the Secret may have been rotated)."""
        known = self._read.get((namespace, name))
        if known is not None:
            known.next_read = -float("inf")

    async def _data(self, namespace: str, name: str) -> dict[str, str]:
        key = (namespace, name)
        self._sweep()
        known = self._read.setdefault(key, _Read())
        known.asked_at = time.monotonic()
        if time.monotonic() >= known.next_read:
            reading = self._reading.get(key)
            if reading is None:
                reading = self._reading[key] = asyncio.ensure_future(self._fetch(key, known))
                reading.add_done_callback(lambda _: self._reading.pop(key, None))
            await asyncio.shield(reading)
        if known.failure is not None:
            raise known.failure
        if known.unavailable is not None and known.unavailable_since is not None:
            lasting = time.monotonic() - known.unavailable_since >= UNAVAILABLE_GRACE_SECONDS
            if known.data is None or lasting:
                raise KubeUnavailableError(
                    f"cannot read Secret {namespace}/{name}: the Kubernetes API does not answer"
                    + (f" (for {UNAVAILABLE_GRACE_SECONDS:.0f} s; the settings last read are kept)" if lasting else "")
                )
        assert known.data is not None
        return known.data

    def _sweep(self) -> None:
        """Secrets no service asked for in FORGET_SECONDS are forgotten (a service moved to another, or is gone)."""
        now = time.monotonic()
        if now - self._swept_at < FORGET_SECONDS / 10:
            return
        self._swept_at = now
        for key, known in list(self._read.items()):
            if now - known.asked_at > FORGET_SECONDS and key not in self._reading:
                del self._read[key]

    async def _fetch(self, key: tuple[str, str], known: _Read) -> None:
        try:
            data = await self._kube.read(self._kube.api.read_secret_data, *key)
        except KubeUnavailableError as exc:
            known.attempts += 1
            known.unavailable = exc
            if known.unavailable_since is None:
                known.unavailable_since = time.monotonic()
            pause = min(UNAVAILABLE_BACKOFF_SECONDS * 2 ** (known.attempts - 1), self._cache_seconds)
            known.next_read = time.monotonic() + max(pause, exc.retry_after or 0.0)
            logger.warning("%s; %s", exc, "the settings last read are kept" if known.data else "read again soon")
            return
        except OperatorError as exc:
            known.data, known.failure = None, exc
        else:
            known.data, known.failure = data, None
        known.unavailable = known.unavailable_since = None
        known.attempts = 0
        known.next_read = time.monotonic() + self._cache_seconds
