"""The real RabbitMQ of the test run: each test session works in a vhost of its own."""

from __future__ import annotations

import base64
import json
import secrets
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
# Queue depths in status come from the management API, whose figures are the broker's statistics,
# refreshed every collect_statistics_interval (RabbitMQ's default: 5 s): a change shows that much later.
STATS_LAG_SECONDS = 5.0


class BrokerUnavailableError(RuntimeError):
    pass


class Management:
    """RabbitMQ's HTTP API (the management plugin), with the broker URL's credentials."""

    def __init__(self, amqp_url: str, management_url: str | None = None) -> None:
        parts = urllib.parse.urlsplit(amqp_url)
        self.base = (management_url or f"http://{parts.hostname}:15672").rstrip("/")
        user = urllib.parse.unquote(parts.username or "guest")
        password = urllib.parse.unquote(parts.password or "guest")
        credentials = f"{user}:{password}"
        self._auth = "Basic " + base64.b64encode(credentials.encode()).decode()

    def request(self, method: str, path: str, body: Any = None, timeout: float = 10) -> Any:
        request = urllib.request.Request(
            self.base + "/api" + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": self._auth, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
            return json.loads(payload) if payload else None

    def vhost_path(self, vhost: str) -> str:
        return urllib.parse.quote(vhost, safe="")

    def connections(self, vhost: str, with_statistics: bool = False) -> list[dict[str, Any]]:
        """The vhost's connections; `with_statistics`: only those whose statistics have arrived. A new connection
        is listed before its first statistics (up to collect_statistics_interval later), without `channels`."""
        listed: list[dict[str, Any]] = self.request("GET", f"/vhosts/{self.vhost_path(vhost)}/connections")
        return [connection for connection in listed if not with_statistics or "channels" in connection]


def check_reachable(amqp_url: str) -> None:
    parts = urllib.parse.urlsplit(amqp_url)
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout=3).close()
    except OSError as exc:
        raise BrokerUnavailableError(
            f"no RabbitMQ answers at {parts.hostname}:{parts.port or 5672} (AMQP_URL). "
            "Run the tests with `./dev test`, which starts one, or point AMQP_URL at a broker."
        ) from exc


def create_vhost(management: Management, prefix: str = "ceo-test") -> str:
    vhost = f"{prefix}-{secrets.token_hex(4)}"
    user = management.request("GET", "/whoami")["name"]
    management.request("PUT", f"/vhosts/{management.vhost_path(vhost)}", {})
    management.request(
        "PUT",
        f"/permissions/{management.vhost_path(vhost)}/{urllib.parse.quote(user)}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    return vhost


def delete_vhost(management: Management, vhost: str) -> None:
    try:
        # A vhost of thousands of queues (the benchmarks') takes a while to go.
        management.request("DELETE", f"/vhosts/{management.vhost_path(vhost)}", timeout=300)
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise


def url_with_vhost(amqp_url: str, vhost: str) -> str:
    parts = urllib.parse.urlsplit(amqp_url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + urllib.parse.quote(vhost, safe="")))


# Arguments a broker reports that no client asked for, with the value that means "as if not given": RabbitMQ 4.x
# lists a classic queue's type among its arguments (3.10 does not). They are no part of what a client declared.
BROKER_REPORTED: dict[str, Any] = {"x-queue-type": "classic"}


def declared_arguments(reported: dict[str, Any]) -> dict[str, Any]:
    """A queue's arguments as declared: what the broker reports, less what it adds itself (BROKER_REPORTED)."""
    return {key: value for key, value in reported.items() if (key, value) not in BROKER_REPORTED.items()}


def snapshot(management: Management, vhost: str) -> dict[str, Any]:
    """What a vhost holds, as the management API reports it (the broker's own entities left out), each queue with
    the arguments it was declared with."""
    path = management.vhost_path(vhost)
    queues = {q["name"]: declared_arguments(q["arguments"]) for q in management.request("GET", f"/queues/{path}")}
    exchanges = {
        e["name"]: e["type"]
        for e in management.request("GET", f"/exchanges/{path}")
        if e["name"] and not e["name"].startswith("amq.")
    }
    bindings = {
        (b["source"], b["destination"], b["routing_key"])
        for b in management.request("GET", f"/bindings/{path}")
        if b["source"] and b["destination_type"] == "queue"
    }
    return {"queues": queues, "exchanges": exchanges, "bindings": bindings}
