"""Unacknowledged counts from RabbitMQ's management API (I/O, stdlib HTTP).

A passive declare counts only ready messages; a queue whose messages are all being worked on looks
empty, and scaling on that stops workers mid-task (a known KEDA pitfall). The management API knows
the unacknowledged ones too.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from celery_event_operator.broker.urls import BrokerAddress, redact

TIMEOUT_SECONDS = 5.0


class ManagementUnavailableError(Exception):
    """The management API did not answer; the message is safe to show."""


def base_url(address: BrokerAddress, configured: str | None) -> str:
    if configured:
        return configured.rstrip("/")
    host = urllib.parse.urlsplit(address.urls[0]).hostname
    return f"http://{host}:15672"


def unacknowledged(address: BrokerAddress, configured_url: str | None) -> dict[str, int]:
    """Messages delivered and not yet acknowledged, per queue of the vhost."""
    parts = urllib.parse.urlsplit(address.urls[0])
    credentials = f"{urllib.parse.unquote(parts.username or 'guest')}:{urllib.parse.unquote(parts.password or 'guest')}"
    url = (f"{base_url(address, configured_url)}/api/queues/{urllib.parse.quote(address.vhost, safe='')}"
           "?columns=name,messages_unacknowledged")
    request = urllib.request.Request(url, headers={"Authorization": "Basic " + base64.b64encode(
        credentials.encode()).decode()})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as response:
            queues = json.loads(response.read())
    except (OSError, ValueError) as exc:
        reason = redact(f"{type(exc).__name__}: {exc}", address)
        raise ManagementUnavailableError(f"management API at {base_url(address, configured_url)}: {reason}") from None
    return {queue["name"]: int(queue.get("messages_unacknowledged") or 0) for queue in queues}
