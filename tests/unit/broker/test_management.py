"""The management API's listings: an answer of another shape than the API's is the API being unavailable."""

from __future__ import annotations

import asyncio

import aiohttp.web
import pytest
from aiohttp.test_utils import TestServer

from celery_event_operator.adapters.broker import management
from celery_event_operator.adapters.broker.management import QueueListing
from celery_event_operator.core.broker.address import parse
from celery_event_operator.core.errors import ManagementUnavailableError


@pytest.mark.parametrize(
    "answer",
    [["a list of texts where the API lists objects"], {"items": [], "page_count": 1}, "text", 7, None],
    ids=["texts", "object", "string", "number", "null"],
)
async def test_a_page_that_is_not_the_apis_answer_is_the_api_unavailable_and_shows_no_secret(answer: object) -> None:
    async def proxy_page(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response(answer)

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", proxy_page)
    async with TestServer(app) as server:
        listing = QueueListing(parse("amqp://user:s3cret@127.0.0.1:5672/shop"), str(server.make_url("")), None)
        try:
            for listed in (listing.queues, listing.consumers, listing.holdings):
                with pytest.raises(ManagementUnavailableError) as raised:
                    await listed(0)
                assert "s3cret" not in str(raised.value)
        finally:
            await listing.close()


async def test_an_api_that_answers_400_everywhere_is_unavailable_once_not_asked_for_ever() -> None:
    """A proxy's 400 (plain HTTP on a TLS port): the overview asked to tell statistics off answers 400 as well."""
    asked: list[str] = []

    async def bad_request(request: aiohttp.web.Request) -> aiohttp.web.Response:
        asked.append(request.path)
        return aiohttp.web.Response(status=400, text="The plain HTTP request was sent to HTTPS port")

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", bad_request)
    async with TestServer(app) as server:
        listing = QueueListing(parse("amqp://user:s3cret@127.0.0.1:5672/shop"), str(server.make_url("")), None)
        try:
            for listed in (listing.queues, listing.consumers, listing.holdings):
                with pytest.raises(ManagementUnavailableError, match="HTTP 400"):
                    await listed(0)
        finally:
            await listing.close()
    assert len(asked) <= 6, asked


async def test_an_answer_past_the_bound_is_the_api_unavailable_never_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy's endless page, or a vhost of millions of bindings: the resync then declares, as without the API."""
    monkeypatch.setattr(management, "MAX_ANSWER_BYTES", 1000)

    async def long_answer(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response([{"source": "x" * 100}] * 50)

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", long_answer)
    async with TestServer(app) as server:
        listing = QueueListing(parse("amqp://user:s3cret@127.0.0.1:5672/shop"), str(server.make_url("")), None)
        try:
            with pytest.raises(ManagementUnavailableError, match="longer than 1000 bytes"):
                await listing.consumers(0)
        finally:
            await listing.close()


async def test_the_entities_are_never_waited_for_and_a_listing_that_fails_shows_none() -> None:
    """A resync asks and goes on (declaring) while the listing is made; a failed listing is no listing."""
    answers = {
        "queues": [
            {
                "name": "q",
                "durable": True,
                "auto_delete": False,
                "exclusive": False,
                "state": "running",
                "arguments": {},
            }
        ],
        "exchanges": [],
        "bindings": [],
    }
    failing = False

    async def api(request: aiohttp.web.Request) -> aiohttp.web.Response:
        await asyncio.sleep(0.2)
        if failing:
            return aiohttp.web.Response(status=503)
        return aiohttp.web.json_response(answers[request.path.split("/")[2]])

    app = aiohttp.web.Application()
    app.router.add_get("/{tail:.*}", api)
    async with TestServer(app) as server:
        listing = QueueListing(parse("amqp://user:s3cret@127.0.0.1:5672/shop"), str(server.make_url("")), None)
        try:
            assert listing.entities(10) is None, "none at hand: asked, not waited for"
            await asyncio.sleep(1)
            listed = listing.entities(10)
            assert listed is not None
            assert dict(listed.queues) == {"q": {}}
            assert listing.entities(10) is listed, "young enough: the same, nothing asked"
            failing = True
            assert listing.entities(0) is None, "older than asked: none, a new one under way"
            await asyncio.sleep(1)
            assert listing.entities(10) is None, "the listing failed"
        finally:
            await listing.close()
