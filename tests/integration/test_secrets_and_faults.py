"""Secrets written by an adversary, rotated credentials, failures that repeat (issue #12), against the real
operator on the emulated API and the real RabbitMQ."""

from __future__ import annotations

import base64
import http.server
import json
import pathlib
import secrets
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu.connection import Connection

from celery_event_operator.adapters.broker.control import LINE_IDLE_SECONDS
from celery_event_operator.core import naming
from tests.conftest import billing_sample
from tests.support import rabbitmq
from tests.support.kube import EmulatedApi, condition, eventually
from tests.support.operator_process import OperatorProcess, free_port
from tests.support.waiting import stays

CES = "/apis/celeryevents.io/v1alpha1/namespaces/default/celeryeventservices"
SECRETS = "/api/v1/namespaces/default/secrets"
SENTINEL = "Sentinel-Pw-7731"


def service(name: str, secret: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = billing_sample()
    body["metadata"] = {"name": name}
    body["spec"]["broker"]["secretRef"] = {"name": secret, "key": "url"}
    body["spec"].pop("workers", None)
    body["spec"] |= spec
    return body


def create_secret(api: EmulatedApi, name: str, **values: str | bytes) -> None:
    data = {
        key: base64.b64encode(value if isinstance(value, bytes) else value.encode()).decode()
        for key, value in values.items()
    }
    api.client.create(SECRETS, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data})


def everything_shown(api: EmulatedApi, operator: OperatorProcess) -> str:
    """All a reader could see: the operator's log, every resource (status, annotations), every Event."""
    return "\n".join(
        [
            operator.log(),
            json.dumps(api.client.get(CES)),
            json.dumps(api.client.get("/api/v1/namespaces/default/events")),
        ]
    )


@pytest.fixture
def running(kube_api: EmulatedApi, crd_installed: dict[str, Any], tmp_path: pathlib.Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(kube_api.kubeconfig, tmp_path / "operator.log", resync_seconds=1).start()
    yield process
    process.stop()


HOSTILE_URLS = {
    "slash": f"amqp://guest:{SENTINEL}/x@127.0.0.1:5672/",
    "hash": f"amqp://guest:{SENTINEL}#x@127.0.0.1:5672/",
    "question": f"amqp://guest:{SENTINEL}?x@127.0.0.1:5672/",
    "at": f"amqp://guest:{SENTINEL}@x@127.0.0.1:5672/",
    "percent": f"amqp://guest:{SENTINEL}%zz@127.0.0.1:5672/",
    "port": f"amqp://guest:guest@127.0.0.1:{SENTINEL}/",
    "scheme": f"redis://guest:{SENTINEL}@127.0.0.1/",
    "huge": f"amqp://guest:{SENTINEL}{'x' * 200_000}/@127.0.0.1/",
    "garbage": SENTINEL * 3,
}


def test_hostile_secret_values_are_reported_and_never_shown(kube_api: EmulatedApi, running: OperatorProcess) -> None:
    """Issue #12, finding 2: a password with an unescaped '/' raised in every handler and showed its first part in
    the log and in kopf's annotations."""
    cases: dict[str, str] = {}
    for case, url in HOSTILE_URLS.items():
        create_secret(kube_api, f"s-{case}", url=url)
        cases[f"svc-{case}"] = "BrokerSecretInvalid"
    create_secret(kube_api, "s-binary", url=b"amqp://guest:" + SENTINEL.encode() + b"\xff\xfe@127.0.0.1/")
    cases["svc-binary"] = "BrokerSecretInvalid"
    create_secret(kube_api, "s-half-tls", url="amqps://guest:guest@127.0.0.1/", **{"tls.crt": SENTINEL})
    cases["svc-half-tls"] = "BrokerSecretInvalid"
    create_secret(kube_api, "s-bad-tls", url="amqps://guest:guest@127.0.0.1/", **{"ca.crt": SENTINEL})
    cases["svc-bad-tls"] = "BrokerSecretInvalid"
    create_secret(
        kube_api, "s-management", url=f"amqp://guest:{SENTINEL}@localhost:5672/", managementURL="http://evil.example/"
    )
    cases["svc-management"] = "ManagementURLRejected"
    for name in cases:
        kube_api.client.create(CES, service(name, name.replace("svc-", "s-")))

    for name, reason in cases.items():
        ready = eventually(
            lambda name=name: (
                condition(kube_api, "Ready", name).get("status") == "False" and condition(kube_api, "Ready", name)
            ),
            timeout=30,
            message=f"{name} was not reported",
        )
        assert ready["reason"] == reason, name
    # A few resyncs: nothing escapes a handler, nothing is retried in a loop.
    stays(lambda: running.alive() and "Traceback" not in running.log(), seconds=3, message="a handler failed")
    shown = everything_shown(kube_api, running)
    assert SENTINEL not in shown
    assert "Traceback" not in running.log()


class _Recorder(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, str]] = []

    def do_GET(self) -> None:
        _Recorder.requests.append(dict(self.headers))
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *_: Any) -> None:
        pass


def test_a_management_url_of_the_authors_choosing_gets_no_credentials(
    kube_api: EmulatedApi, running: OperatorProcess, test_vhost_url: str
) -> None:
    """Issue #12, finding 1: `spec.broker.managementURL` sent `Authorization: Basic …` to any listener."""
    listener = http.server.HTTPServer(("127.0.0.1", free_port()), _Recorder)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    try:
        # The broker is `localhost`; the listener, another host as far as names go.
        url = test_vhost_url.replace("127.0.0.1", "localhost")
        create_secret(kube_api, "rabbitmq", url=url)
        body = service(
            "billing",
            "rabbitmq",
            statusIntervalSeconds=1,
            broker={"secretRef": {"name": "rabbitmq"}, "managementURL": f"http://127.0.0.1:{listener.server_port}"},
        )
        kube_api.client.create(CES, body)
        ready = eventually(
            lambda: condition(kube_api, "Ready").get("status") == "False" and condition(kube_api, "Ready"), timeout=20
        )
        assert ready["reason"] == "ManagementURLRejected"
        assert "none of the broker's hosts" in ready["message"]
        stays(lambda: _Recorder.requests == [], seconds=4, message="the listener was sent a request")
    finally:
        listener.shutdown()


def make_user(management: rabbitmq.Management, vhost: str, password: str) -> str:
    user = f"ceo-rotation-{secrets.token_hex(3)}"
    management.request("PUT", f"/users/{user}", {"password": password, "tags": ""})
    management.request(
        "PUT", f"/permissions/{management.vhost_path(vhost)}/{user}", {"configure": ".*", "write": ".*", "read": ".*"}
    )
    return user


def connections_of(management: rabbitmq.Management, user: str) -> list[dict[str, Any]]:
    return [c for c in management.request("GET", "/connections") if c.get("user") == user]


def received(scrape: str) -> float:
    total = 0.0
    for line in scrape.splitlines():
        if line.startswith("celery_event_operator_events_consumed_total{") and 'service_name="billing"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def publish_event(url: str) -> None:
    with Connection(url) as connection:
        connection.channel().basic_publish(
            amqp.Message(b'{"type": "worker-heartbeat", "hostname": "celery@w1"}', content_type="application/json"),
            naming.event_exchange_name("billing"),
            "worker.heartbeat",
        )


def test_rotated_credentials_are_followed_and_old_connections_closed(
    kube_api: EmulatedApi,
    running: OperatorProcess,
    rabbitmq_management: rabbitmq.Management,
    test_vhost: str,
    test_vhost_url: str,
) -> None:
    """Issue #12, finding 4: the consumer read the Secret once and retried the old password for good."""
    parts = urllib.parse.urlsplit(test_vhost_url)
    user = make_user(rabbitmq_management, test_vhost, "first-password")

    def url_for(password: str) -> str:
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{parts.hostname}:{parts.port}"))

    try:
        create_secret(kube_api, "rabbitmq", url=url_for("first-password"))
        kube_api.client.create(CES, service("billing", "rabbitmq", statusIntervalSeconds=1))
        eventually(lambda: condition(kube_api, "MonitoringReady").get("status") == "True", timeout=30)
        for rotation, password in enumerate(("second-password", "third-password"), start=1):
            before = received(running.scrape())
            rabbitmq_management.request("PUT", f"/users/{user}", {"password": password, "tags": ""})
            for connection in connections_of(rabbitmq_management, user):
                rabbitmq_management.request("DELETE", f"/connections/{urllib.parse.quote(connection['name'], safe='')}")
            kube_api.client.merge_patch(
                f"{SECRETS}/rabbitmq", {"data": {"url": base64.b64encode(url_for(password).encode()).decode()}}
            )
            publish_event(test_vhost_url)

            eventually(
                lambda b=before: received(running.scrape()) > b,
                timeout=40,
                message=f"metrics froze after rotation {rotation}",
            )
        # The management API lists connections from its statistics: give it a moment (and control's extra
        # connections, if a burst opened any, their idle time).
        eventually(
            lambda: len(connections_of(rabbitmq_management, user)) <= 2,
            timeout=20 + LINE_IDLE_SECONDS,
            message="connections of replaced passwords linger",
        )
        assert condition(kube_api, "Ready")["status"] == "True"
        assert "password" not in everything_shown(kube_api, running).replace("Password", "")
    finally:
        rabbitmq_management.request("DELETE", f"/users/{user}")


def test_one_warning_event_per_failure_not_one_per_retry(
    kube_api: EmulatedApi, running: OperatorProcess, test_vhost_url: str
) -> None:
    """Issue #12, finding 5: a new Warning every few seconds, its message carrying the retry countdown."""
    parts = urllib.parse.urlsplit(test_vhost_url)
    wrong = urllib.parse.urlunsplit(parts._replace(netloc=f"guest:wrong@{parts.hostname}:{parts.port}"))
    create_secret(kube_api, "rabbitmq", url=wrong)
    kube_api.client.create(CES, service("billing", "rabbitmq", statusIntervalSeconds=1))
    eventually(lambda: condition(kube_api, "BrokerReachable").get("status") == "False", timeout=20)

    def warnings() -> list[dict[str, Any]]:
        items = kube_api.client.get("/api/v1/namespaces/default/events")["items"]
        return [e for e in items if e.get("type") == "Warning"]

    eventually(warnings, timeout=10, message="no Warning Event")
    # A dozen resyncs and status passes, connection attempts after 1, 2, 4 and 8 s of backoff: still one Warning.
    stays(
        lambda: [e["reason"] for e in warnings()] == ["BrokerUnreachable"],
        seconds=12,
        message="a second Warning was posted (or the first went)",
    )
    found = warnings()
    assert "next attempt" not in found[0]["message"]
    assert "ACCESS_REFUSED" in found[0]["message"]
