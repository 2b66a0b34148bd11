"""/metrics: the metrics state of every monitored service, served on the operator's event loop (aiohttp).

The loop also serves the admission webhook and consumes the events, so a scrape never holds it for long:
each service's block is rendered only when the service changed since (exposition.py), and rendering,
compressing and checksumming give the loop back every slice of about a millisecond (`Pacer`). Scrapes
render one at a time (a second one, e.g. of a Prometheus HA pair, then finds the blocks fresh).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Generator, Sequence

from aiohttp import web

from celery_event_operator.core.monitoring import exposition
from celery_event_operator.core.monitoring.bounds import DEFAULT_SETTINGS, SeriesSettings, TaskBudget, series_settings
from celery_event_operator.core.monitoring.state import QUEUE_WAIT_BUCKETS, RUNTIME_BUCKETS, ServiceMetrics

SLICE_SECONDS = 0.001  # the longest the loop is held between two yields of a scrape (give or take a slice)
WRITE_BYTES = 256 * 1024  # the response is written in pieces of about this size


class MetricsRegistry:
    """The metrics state of every monitored service, and the operator's own counters."""

    def __init__(
        self,
        runtime_buckets: tuple[float, ...] = RUNTIME_BUCKETS,
        queue_wait_buckets: tuple[float, ...] = QUEUE_WAIT_BUCKETS,
        defaults: SeriesSettings = DEFAULT_SETTINGS,
        budget: TaskBudget | None = None,
    ) -> None:
        self.runtime_buckets = runtime_buckets
        self.queue_wait_buckets = queue_wait_buckets
        self.defaults = defaults  # the operator's flags; a service's spec.monitoring overrides them
        self.budget = budget if budget is not None else TaskBudget()
        self._services: dict[tuple[str, str], tuple[ServiceMetrics, exposition.ServiceBlock]] = {}
        self._lock = threading.Lock()  # for adding and removing services only, never on the event path
        self.reconciles: dict[str, int] = {"success": 0, "failure": 0}
        # (namespace, resource) → (wall-clock time of its last status pass, its interval): how fresh status is
        self.status_passes: dict[tuple[str, str], tuple[float, float]] = {}
        self._render_lock: asyncio.Lock | None = None
        self.server: web.AppRunner | None = None  # serving /metrics (serve_metrics)

    def service(
        self, namespace: str, service: str, per_pod: bool | None = None, max_task_names: int | None = None
    ) -> ServiceMetrics:
        """The service's metrics (made when new), with its spec's settings (None: the operator's defaults)."""
        settings = series_settings(per_pod, max_task_names, self.defaults)
        with self._lock:
            found = self._services.get((namespace, service))
            if found is None:
                metrics = ServiceMetrics(
                    namespace,
                    service,
                    self.runtime_buckets,
                    self.queue_wait_buckets,
                    settings=settings,
                    budget=self.budget,
                )
                self._services[(namespace, service)] = (metrics, exposition.ServiceBlock(namespace, service))
                return metrics
        found[0].configure(settings)
        return found[0]

    def find(self, namespace: str, service: str) -> ServiceMetrics | None:
        found = self._services.get((namespace, service))
        return found[0] if found is not None else None

    def remove(self, namespace: str, service: str) -> None:
        with self._lock:
            found = self._services.pop((namespace, service), None)
        if found is not None:
            found[0].close()

    def status_refreshed(self, namespace: str, name: str, interval: float) -> None:
        self.status_passes[(namespace, name)] = (time.time(), interval)

    def forget_status(self, namespace: str, name: str) -> None:
        self.status_passes.pop((namespace, name), None)

    def count_reconcile(self, succeeded: bool) -> None:
        with self._lock:  # kopf's handler threads (not the event path)
            self.reconciles["success" if succeeded else "failure"] += 1

    async def close(self) -> None:
        if self.server is not None:
            await self.server.cleanup()
            self.server = None

    async def scrape(self, gzip: bool) -> list[bytes]:
        """The exposition of every service, in pieces (a gzip member when `gzip`)."""
        if self._render_lock is None:
            self._render_lock = asyncio.Lock()
        pacer = Pacer(SLICE_SECONDS)
        async with self._render_lock:
            with self._lock:
                services = list(self._services.values())
            plain: list[Sequence[bytes]] = []
            deflated: list[Sequence[bytes]] = []
            for metrics, block in services:
                if block.stale(metrics):
                    await pacer.run(block.render(metrics))
                if gzip and block.deflated is None:
                    await pacer.run(block.deflate())
                plain.append(block.plain)  # this scrape's view of the service, whatever changes meanwhile
                if block.deflated is not None:
                    deflated.append(block.deflated)
                await pacer.tick()
        operator = exposition.operator_fragments(dict(self.reconciles), dict(self.status_passes))
        text = exposition.exposition(plain, operator)
        if not gzip:
            return text
        pieces: list[bytes] = []
        await pacer.run(exposition.gzip_member(text, exposition.compressed_exposition(deflated, operator), pieces))
        return pieces


class Pacer:
    """Gives the event loop back whenever the work since the last yield took `slice_seconds`."""

    def __init__(self, slice_seconds: float) -> None:
        self.slice_seconds = slice_seconds
        self._until = time.perf_counter() + slice_seconds

    async def tick(self) -> None:
        if time.perf_counter() >= self._until:
            await asyncio.sleep(0)
            self._until = time.perf_counter() + self.slice_seconds

    async def run(self, work: Generator[None, None, None]) -> None:
        """Run a generator of work that yields between its slices."""
        for _ in work:
            await self.tick()


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header takes gzip (and does not refuse it with q=0)."""
    for item in accept_encoding.split(","):
        coding, _, parameters = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "x-gzip"):
            quality = parameters.strip().removeprefix("q=")
            try:
                return not parameters or float(quality) > 0
            except ValueError:
                return True
    return False


async def _respond(registry: MetricsRegistry, request: web.Request) -> web.StreamResponse:
    gzip = accepts_gzip(request.headers.get("Accept-Encoding", ""))
    pieces = await registry.scrape(gzip)
    response = web.StreamResponse(headers={"Content-Type": exposition.CONTENT_TYPE})
    if gzip:
        response.headers["Content-Encoding"] = "gzip"
    response.content_length = sum(len(piece) for piece in pieces)
    await response.prepare(request)
    batch: list[bytes] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece)
        if size >= WRITE_BYTES:
            await response.write(b"".join(batch))  # waits while the client is slower than us
            batch, size = [], 0
    await response.write(b"".join(batch))
    await response.write_eof()
    return response


def serve_metrics(metrics: MetricsRegistry, port: int, addr: str) -> None:
    """Serve /metrics on the running event loop. The port is bound at once (a port in use fails the start)."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    listening = socket.create_server((addr, port), family=family, backlog=128)
    application = web.Application()

    async def respond(request: web.Request) -> web.StreamResponse:
        return await _respond(metrics, request)

    application.router.add_get("/metrics", respond)
    runner = metrics.server = web.AppRunner(application, access_log=None, handle_signals=False)

    async def start() -> None:
        await runner.setup()
        await web.SockSite(runner, listening).start()
        logging.getLogger(__name__).debug("serving /metrics on %s:%s", addr, port)

    _starting.add(task := asyncio.get_running_loop().create_task(start(), name="metrics server"))
    task.add_done_callback(_starting.discard)


_starting: set[asyncio.Task[None]] = set()  # the loop keeps weak references to tasks only
