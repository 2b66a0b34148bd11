"""An HTTP proxy between the operator and the emulated Kubernetes API that makes the API have a bad minute.

While a fault window is open it answers a share of requests with 500, a share with 429 (with `Retry-After`),
every status patch with 409, and cuts every watch after a few seconds; outside the window it forwards everything
as it is. The operator talks to it through a kubeconfig of its own; the tests talk to the emulator directly, so
what they check is never faulted. Served from a thread with its own event loop, as the emulator is.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import pathlib
import random
import threading
import time

import aiohttp
import aiohttp.web

from celery_event_devcluster.server import write_kubeconfig

# Request and response headers a proxy does not pass on (hop by hop, or recomputed).
_HOP_HEADERS = frozenset(
    {"connection", "content-length", "content-encoding", "host", "keep-alive", "transfer-encoding", "upgrade"}
)


@dataclasses.dataclass
class Faults:
    server_errors: float = 0.30  # share of requests answered 500
    too_many_requests: float = 0.20  # share answered 429
    retry_after: int = 1  # seconds, in the 429's Retry-After
    watch_seconds: float = 5.0  # a watch is cut after this long
    conflict_on_status: bool = True  # every PATCH of a /status subresource answered 409


def _status(code: int, reason: str, message: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }


class FaultProxy:
    def __init__(self, upstream: str, faults: Faults | None = None, seed: int = 26) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = faults or Faults()
        self.counts: collections.Counter[str] = collections.Counter()  # what was done to requests
        self._random = random.Random(seed)
        self._since = self._until = 0.0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self.url = ""
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)

    # --- the window -----------------------------------------------------------------------------

    def open_window(self, seconds: float) -> None:
        """Faults from now on, for `seconds`."""
        self._since = time.monotonic()
        self._until = self._since + seconds

    @property
    def faulting(self) -> bool:
        return time.monotonic() < self._until

    def write_kubeconfig(self, path: pathlib.Path) -> pathlib.Path:
        return write_kubeconfig(path, self.url)

    # --- serving --------------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fault proxy did not start")
        return self

    def __exit__(self, *_: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
            self._session = session
            app = aiohttp.web.Application(client_max_size=16 * 1024 * 1024)
            app.router.add_route("*", "/{path:.*}", self._handle)
            runner = aiohttp.web.AppRunner(app, access_log=None)
            await runner.setup()
            site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            self._ready.set()
            try:
                await self._stop.wait()
            finally:
                await runner.cleanup()

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.StreamResponse:
        watch = request.query.get("watch") in ("true", "1")
        faulting = self.faulting
        if faulting:
            fault = self._fault(request, watch)
            if fault is not None:
                return fault
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        try:
            upstream = await self._session.request(
                request.method, self.upstream + request.path_qs, headers=headers, data=body or None
            )
        except aiohttp.ClientError:
            self.counts["upstream failed"] += 1
            return aiohttp.web.json_response(_status(502, "BadGateway", "upstream failed"), status=502)
        async with upstream:
            response = aiohttp.web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_HEADERS:
                    response.headers.add(key, value)
            await response.prepare(request)
            started = time.monotonic()
            while True:
                if watch and self._cut_due(started):
                    self.counts["watch cut"] += 1
                    if request.transport is not None:
                        request.transport.close()  # as a broken connection: no orderly end of the stream
                    return response
                try:
                    # A watch is looked at every half second: one made before the window is cut in it too.
                    async with asyncio.timeout(0.5 if watch else None):
                        chunk = await upstream.content.readany()
                except TimeoutError:
                    continue
                except aiohttp.ClientError:
                    break
                if not chunk:
                    break
                with contextlib.suppress(ConnectionResetError):
                    await response.write(chunk)
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
            return response

    def _cut_due(self, started: float) -> bool:
        """A watch is cut `watch_seconds` after it started in the window, or after the window opened."""
        now = time.monotonic()
        return now < self._until and now >= max(started, self._since) + self.faults.watch_seconds

    def _fault(self, request: aiohttp.web.Request, watch: bool) -> aiohttp.web.Response | None:
        faults = self.faults
        if faults.conflict_on_status and request.method == "PATCH" and request.path.endswith("/status"):
            self.counts["409"] += 1
            message = "Operation cannot be fulfilled: the object has been modified; please apply your changes"
            return aiohttp.web.json_response(_status(409, "Conflict", message), status=409)
        draw = self._random.random()
        if draw < faults.server_errors:
            self.counts["500"] += 1
            return aiohttp.web.json_response(_status(500, "InternalError", "injected fault"), status=500)
        if draw < faults.server_errors + faults.too_many_requests:
            self.counts["429"] += 1
            return aiohttp.web.json_response(
                _status(429, "TooManyRequests", "injected fault"),
                status=429,
                headers={"Retry-After": str(faults.retry_after)},
            )
        return None
