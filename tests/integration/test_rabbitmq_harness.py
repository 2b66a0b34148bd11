"""The harness itself: the session's vhost is real, ours alone, and reachable with kombu."""

from __future__ import annotations

import urllib.parse

import kombu
import pytest

from tests.support.rabbitmq import Management

pytestmark = pytest.mark.every_broker  # its behaviour depends on the broker's version


def test_session_vhost_isolates_entities(vhost: str, vhost_url: str, rabbitmq_management: Management) -> None:
    with kombu.Connection(vhost_url, connect_timeout=5) as connection:
        channel = connection.channel()
        kombu.Queue("harness-probe", channel=channel, auto_delete=False).declare()
        try:
            in_vhost = rabbitmq_management.request("GET", f"/queues/{rabbitmq_management.vhost_path(vhost)}")
            assert "harness-probe" in {queue["name"] for queue in in_vhost}
            in_default = rabbitmq_management.request("GET", "/queues/%2F")
            assert "harness-probe" not in {queue["name"] for queue in in_default}
        finally:
            channel.queue_delete("harness-probe")
    assert urllib.parse.urlsplit(vhost_url).path == "/" + urllib.parse.quote(vhost, safe="")
