"""Queue depths from RabbitMQ's management API: one listing of a vhost serves every service on it (I/O).

A passive declare counts only ready messages: a queue whose messages are all being worked on looks empty,
and scaling on that stops workers mid-task (a known KEDA pitfall). The management API knows the
unacknowledged ones too, and one paged listing of the vhost (`columns=` keeps it small) answers for a
thousand services at once, so the status pass costs O(vhosts) per interval, not O(services). The API's
figures are the broker's statistics, refreshed every few seconds (RabbitMQ's collect_statistics_interval,
5 s by default): they lag by that much.

The credentials go to the management URL only after `BrokerAddress.management_url` checked that it names
the broker's own host (https when the broker speaks TLS).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.parse

import aiohttp

from celery_event_operator.broker.address import BrokerAddress
from celery_event_operator.broker.tls import TlsFiles, client_context
from celery_event_operator.errors import ManagementUnavailableError

TIMEOUT_SECONDS = 10.0
PAGE_SIZE = 500
COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    ready: int
    unacknowledged: int
    consumers: int


class QueueListing:
    """The queues of one vhost, listed at most once per `max_age` whatever the number of callers."""

    def __init__(self, address: BrokerAddress, base_url: str, tls: TlsFiles | None) -> None:
        self.base_url = base_url
        self._address = address
        self._tls = tls
        endpoint = address.endpoints[0]
        self._authorization = aiohttp.encode_basic_auth(endpoint.user, endpoint.password)
        self._listed_at = -float("inf")
        self._queues: dict[str, QueueCounts] = {}
        self._error: ManagementUnavailableError | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def queues(self, max_age: float) -> dict[str, QueueCounts]:
        """Every queue of the vhost, listed no longer than `max_age` seconds ago (or now)."""
        if time.monotonic() - self._listed_at > max_age:
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._refresh())
            await asyncio.shield(self._refreshing)
        if self._error is not None:
            raise self._error
        return self._queues

    async def _refresh(self) -> None:
        try:
            queues = await self._list()
        except ManagementUnavailableError as exc:
            self._error = exc
        else:
            self._queues, self._error = queues, None
        self._listed_at = time.monotonic()  # a failure is remembered as long as a listing would be

    async def _list(self) -> dict[str, QueueCounts]:
        vhost = urllib.parse.quote(self._address.vhost, safe="")
        queues: dict[str, QueueCounts] = {}
        page, pages = 1, 1
        try:
            session = self._client()
            while page <= pages:
                url = f"{self.base_url}/api/queues/{vhost}?page={page}&page_size={PAGE_SIZE}&columns={COLUMNS}"
                async with session.get(url, allow_redirects=False) as response:  # credentials stay on that host
                    if response.status != 200:
                        raise ManagementUnavailableError(
                            f"management API at {self.base_url}: HTTP {response.status} {response.reason}"
                        )
                    listed = await response.json(content_type=None)
                pages = int(listed.get("page_count") or 1)
                for item in listed.get("items") or ():
                    queues[str(item["name"])] = QueueCounts(
                        int(item.get("messages_ready") or 0),
                        int(item.get("messages_unacknowledged") or 0),
                        int(item.get("consumers") or 0),
                    )
                page += 1
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError, AttributeError) as exc:
            reason = self._address.redact(f"{type(exc).__name__}: {exc}")
            raise ManagementUnavailableError(f"management API at {self.base_url}: {reason}") from None
        return queues

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            tls = client_context(self._tls) if self.base_url.startswith("https:") else None
            self._session = aiohttp.ClientSession(
                headers={"Authorization": self._authorization},
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS),
                connector=aiohttp.TCPConnector(ssl=tls if tls is not None else False, limit=2),
            )
        return self._session

    async def close(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
        if self._session is not None:
            await self._session.close()
