"""Queue depths and consumers from RabbitMQ's management API: one listing of a vhost serves every service on
it (I/O).

A passive declare counts only ready messages: a queue whose messages are all being worked on looks empty,
and scaling on that stops workers mid-task (a known KEDA pitfall). The management API knows the
unacknowledged ones too, and one listing of the vhost (`columns=` keeps it small) answers for a
thousand services at once, so the status pass costs O(vhosts) per interval, not O(services). The API's
figures are the broker's statistics, refreshed every few seconds (RabbitMQ's collect_statistics_interval,
5 s by default): they lag by that much. The consumers (for the workers' lifecycle) are listed the same way:
the vhost's consumers and its connections, each once per interval, whatever the number of services; and so are
the broker's resource alarms (`/api/health/checks/alarms`), which a consumer-only connection is never told of;
and the vhost's queues, exchanges and bindings with what a redeclare compares (core/topology/listed.py), so that a
resync declares only what the listing does not show as planned.

A broker set up as RabbitMQ advises for production from 4.x has the API's statistics off
(`management_agent.disable_metrics_collector = true`): its queue listing then carries no counts and its consumer
listing answers 400. The queue counts are then listed from the queues themselves (`enable_queue_totals`: ready and
unacknowledged, no consumers); what cannot be listed says why, and nothing missing is read as a zero.

The credentials go to the management URL only after `BrokerAddress.management_url` checked that it names
the broker's own host (https when the broker speaks TLS).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import aiohttp

from celery_event_operator.adapters.broker.tls import TlsFiles, client_context
from celery_event_operator.core.broker.address import BrokerAddress
from celery_event_operator.core.broker.alarms import Alarm, alarms_of
from celery_event_operator.core.errors import ArchiveNotFoundError, ManagementUnavailableError
from celery_event_operator.core.lifecycle.consumers import ByConnection, Consumer, Holding
from celery_event_operator.core.topology.listed import (
    BINDING_COLUMNS,
    EXCHANGE_COLUMNS,
    QUEUE_COLUMNS,
    ListedEntities,
    entities_of,
)

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 10.0
# No answer of the API is read past this (a listing of 100,000 bindings is about 12 MB).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
COLUMNS = "name,messages_ready,messages_unacknowledged,consumers"
# Counts taken from the queues themselves, not from the statistics (which may be off).
TOTALS = "disable_stats=true&enable_queue_totals=true"
STATISTICS_OFF = (
    "its statistics are off on the broker (management_agent.disable_metrics_collector = true, as RabbitMQ advises "
    "from 4.x)"
)
CONSUMER_COLUMNS = "queue.name,channel_details.connection_name,channel_details.peer_host"
CONNECTION_COLUMNS = "name,user_provided_name"
CHANNEL_COLUMNS = "connection_details.name,connection_details.peer_host,messages_unacknowledged"


@dataclasses.dataclass(frozen=True)
class QueueCounts:
    ready: int
    unacknowledged: int
    consumers: int | None  # None: the broker's statistics are off


T = TypeVar("T")


class _Cached(Generic[T]):
    """One listing of the vhost, made at most once per `max_age` whatever the number of callers; a failure is
    remembered as long as a listing would be."""

    def __init__(self, fetch: Callable[[], Awaitable[T]], empty: T) -> None:
        self._fetch = fetch
        self._found = empty
        self._error: ManagementUnavailableError | None = None
        self._listed_at = -float("inf")
        self._refreshing: asyncio.Task[None] | None = None

    async def get(self, max_age: float) -> T:
        refreshing = self._refreshed_if_older(max_age)
        if refreshing is not None:
            await asyncio.shield(refreshing)
        if self._error is not None:
            raise self._error
        return self._found

    def fresh(self, max_age: float) -> T | None:
        """The listing when it is no older than `max_age`, without waiting: else None, and a new one under way."""
        if self._refreshed_if_older(max_age) is not None:
            return None
        return self._found if self._error is None else None

    def _refreshed_if_older(self, max_age: float) -> asyncio.Task[None] | None:
        """The listing under way (started now unless one already is) when the last is older than `max_age`."""
        if time.monotonic() - self._listed_at <= max_age:
            return None
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        return self._refreshing

    async def _refresh(self) -> None:
        try:
            found = await self._fetch()
        except ManagementUnavailableError as exc:
            self._error = exc
        except Exception as exc:  # a bug of ours: no listing, and not asked again back to back
            logger.exception("a management listing failed unexpectedly")
            self._error = ManagementUnavailableError(f"the listing failed unexpectedly ({type(exc).__name__})")
        else:
            self._found, self._error = found, None
        self._listed_at = time.monotonic()

    def cancel(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()


class QueueListing:
    """The queues and consumers of one vhost, each listed at most once per `max_age`."""

    def __init__(self, address: BrokerAddress, base_url: str, tls: TlsFiles | None) -> None:
        self.base_url = base_url
        self._address = address
        self._tls = tls
        endpoint = address.endpoints[0]
        self._authorization = aiohttp.encode_basic_auth(endpoint.user, endpoint.password)
        self._vhost = urllib.parse.quote(address.vhost, safe="")
        self._queues = _Cached[dict[str, QueueCounts]](self._guarded(self._list_queues), {})
        self._consumers = _Cached[ByConnection[Consumer]](self._guarded(self._list_consumers), ByConnection(()))
        self._alarms = _Cached[tuple[Alarm, ...]](self._guarded(self._list_alarms), ())
        self._holdings = _Cached[ByConnection[Holding]](self._guarded(self._list_holdings), ByConnection(()))
        self._entities = _Cached[ListedEntities](self._guarded(self._list_entities), entities_of([], [], []))
        self._session: aiohttp.ClientSession | None = None

    async def queues(self, max_age: float) -> dict[str, QueueCounts]:
        """Every queue of the vhost, listed no longer than `max_age` seconds ago (or now)."""
        return await self._queues.get(max_age)

    async def consumers(self, max_age: float) -> ByConnection[Consumer]:
        """Every consumer of the vhost with its connection's peer address and client-provided name."""
        return await self._consumers.get(max_age)

    async def alarms(self, max_age: float) -> tuple[Alarm, ...]:
        """The broker's resource alarms in effect (memory, disk), checked no longer than `max_age` seconds ago."""
        return await self._alarms.get(max_age)

    async def holdings(self, max_age: float) -> ByConnection[Holding]:
        """Every channel of the vhost with the deliveries it holds unacknowledged, and its connection's peer address
        and client-provided name (listed only when a judgement needs it)."""
        return await self._holdings.get(max_age)

    def entities(self, max_age: float) -> ListedEntities | None:
        """The vhost's queues, exchanges and bindings as a redeclare compares them, when listed no longer than
        `max_age` seconds ago; else None, and a listing is made meanwhile (never waited for: a resync that finds
        none declares, rather than hold its service's passes behind a listing of the whole vhost)."""
        return self._entities.fresh(max_age)

    async def exchange_arguments(self, name: str) -> dict[str, Any] | None:
        """The arguments an exchange of the vhost was declared with (None: there is no such exchange); read when
        asked, never cached (a claim's holder changes hands)."""

        async def read() -> dict[str, Any] | None:
            status, body = await self._answer(f"/api/exchanges/{self._vhost}/{urllib.parse.quote(name, safe='')}")
            if status == 404:
                return None
            if status != 200:
                raise ManagementUnavailableError(f"management API at {self.base_url}: HTTP {status}")
            return dict(body.get("arguments") or {})

        return await self._guarded(read)()

    async def queue(self, name: str) -> QueueCounts:
        """One queue's counts, asked now (not cached: a replay asks before it reports an end); ManagementUnavailable-
        Error when the API does not answer, ArchiveNotFoundError when the queue is not there."""

        async def fetch() -> QueueCounts:
            path = f"/api/queues/{self._vhost}/{urllib.parse.quote(name, safe='')}?columns={COLUMNS}"
            status, body = await self._answer(path)
            if status == 404:
                raise ArchiveNotFoundError(f"there is no queue {name!r} on this broker")
            if status != 200 or not isinstance(body, dict):
                raise ManagementUnavailableError(f"management API at {self.base_url}: HTTP {status}")
            if "messages_ready" not in body and await self._statistics_off():
                return _counts(await self._get(f"{path}&{TOTALS}"), consumers=False)
            return _counts(body, consumers=True)

        return await self._guarded(fetch)()

    async def _list_alarms(self) -> tuple[Alarm, ...]:
        status, body = await self._answer("/api/health/checks/alarms")
        found = alarms_of(status, body)
        if found is None:
            raise ManagementUnavailableError(f"management API at {self.base_url}: HTTP {status} on the alarms check")
        return found

    async def _list_queues(self) -> dict[str, QueueCounts]:
        items = await self._listed(f"/api/queues/{self._vhost}?columns={COLUMNS}")
        # A queue declared a moment ago has no statistics yet; none of them having any is a broker with them off.
        statistics = not (
            items and all("messages_ready" not in item for item in items) and await self._statistics_off()
        )
        if not statistics:
            items = await self._listed(f"/api/queues/{self._vhost}?columns={COLUMNS}&{TOTALS}")
        return {str(item["name"]): _counts(item, consumers=statistics) for item in items}

    async def _list_entities(self) -> ListedEntities:
        return entities_of(
            await self._listed(f"/api/queues/{self._vhost}?columns={QUEUE_COLUMNS}"),
            await self._listed(f"/api/exchanges/{self._vhost}?columns={EXCHANGE_COLUMNS}"),
            await self._listed(f"/api/bindings/{self._vhost}?columns={BINDING_COLUMNS}"),
        )

    async def _listed(self, path: str) -> list[Any]:
        """A listing in one answer (bounded by MAX_ANSWER_BYTES), never in pages: RabbitMQ builds the whole
        listing again for each page asked (13,000 queues: 2.3 to 2.6 s of its CPU in 26 pages of 500, 0.7 to 1.2 s
        in one answer; their entity columns 1.5 to 1.9 s against 0.3 s). Anything but a list (a proxy's `null`) is
        no listing, never an empty one: no consumers would read as workers holding nothing."""
        listed = await self._get(path)
        if not isinstance(listed, list):
            raise TypeError(f"the answer to {path.partition('?')[0]} is no list")
        return listed

    async def _statistics_off(self) -> bool:
        """Whether the broker says its statistics are off; any other answer (a proxy's page, an error) is no."""
        status, overview = await self._answer("/api/overview?columns=disable_stats")
        return status == 200 and isinstance(overview, dict) and overview.get("disable_stats") is True

    def _unseen(self) -> ManagementUnavailableError:
        return ManagementUnavailableError(
            f"management API at {self.base_url}: {STATISTICS_OFF}: it lists neither consumers nor the deliveries "
            "channels hold"
        )

    async def _list_consumers(self) -> ByConnection[Consumer]:
        # Two listings: a consumer names its connection, the connection's listing has the name its client gave it.
        consumers = await self._listed(f"/api/consumers/{self._vhost}?columns={CONSUMER_COLUMNS}")
        given = await self._connection_names()
        found = []
        for item in consumers:
            channel = item.get("channel_details") or {}
            found.append(
                Consumer(
                    str((item.get("queue") or {}).get("name")),
                    str(channel["peer_host"]) if channel.get("peer_host") else None,
                    given.get(str(channel.get("connection_name"))),
                )
            )
        return ByConnection(found)

    async def _list_holdings(self) -> ByConnection[Holding]:
        channels = await self._listed(f"/api/vhosts/{self._vhost}/channels?columns={CHANNEL_COLUMNS}")
        # Without statistics a channel's listing has no count: never read as "holds nothing" (an eviction's proof).
        if any("messages_unacknowledged" not in item for item in channels) and await self._statistics_off():
            raise self._unseen()
        given = await self._connection_names()
        found = []
        for item in channels:
            connection = item.get("connection_details") or {}
            found.append(
                Holding(
                    int(item.get("messages_unacknowledged") or 0),
                    str(connection["peer_host"]) if connection.get("peer_host") else None,
                    given.get(str(connection.get("name"))),
                )
            )
        return ByConnection(found)

    async def _connection_names(self) -> dict[str, str]:
        """The vhost's connections: the broker's name of each → the name its client gave it."""
        connections = await self._listed(f"/api/vhosts/{self._vhost}/connections?columns={CONNECTION_COLUMNS}")
        return {
            str(item.get("name")): item["user_provided_name"]
            for item in connections
            if isinstance(item.get("user_provided_name"), str)
        }

    async def _get(self, path: str) -> Any:
        status, body = await self._answer(path)
        if status == 400 and await self._statistics_off():  # the consumers' and channels' listings
            raise self._unseen()
        if status != 200:
            raise ManagementUnavailableError(f"management API at {self.base_url}: HTTP {status}")
        return body

    def _guarded(self, listing: Callable[[], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        """`listing`, whose failures — the connection's, or an answer of another shape than the API's (a proxy's
        page) — are the management API's being unavailable, with no secret in the message."""

        async def fetch() -> T:
            try:
                return await listing()
            except (  # RecursionError: JSON nested past the parser's depth; OverflowError: a count of 1e999
                aiohttp.ClientError,
                TimeoutError,
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
                OverflowError,
                RecursionError,
            ) as exc:
                reason = self._address.redact(f"{type(exc).__name__}: {exc}")
                raise ManagementUnavailableError(f"management API at {self.base_url}: {reason}") from None

        return fetch

    async def _answer(self, path: str) -> tuple[int, Any]:
        """The status and the JSON body of a GET (a body that is no JSON: None)."""
        url = f"{self.base_url}{path}"
        async with self._client().get(url, allow_redirects=False) as response:  # credentials stay on that host
            read, size = [], 0
            async for chunk in response.content.iter_any():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:  # a proxy's endless page, a vhost of millions: never all in memory
                    raise ValueError(f"an answer longer than {MAX_ANSWER_BYTES} bytes")
                read.append(chunk)
        try:
            return response.status, json.loads(b"".join(read))
        except ValueError:
            return response.status, None

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
        self._queues.cancel()
        self._consumers.cancel()
        self._alarms.cancel()
        self._holdings.cancel()
        self._entities.cancel()
        if self._session is not None:
            await self._session.close()


def _counts(item: dict[str, Any], *, consumers: bool) -> QueueCounts:
    """A queue's counts from its listing; `consumers`: the listing has them (not when the statistics are off)."""
    return QueueCounts(
        int(item.get("messages_ready") or 0),
        int(item.get("messages_unacknowledged") or 0),
        int(item.get("consumers") or 0) if consumers else None,
    )
