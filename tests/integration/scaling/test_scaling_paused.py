"""When the workers' /scale cannot be read: a ScalingPaused Warning only when something is to be scaled, once
per distinct problem (issue #16: every dev-mode start showed ScalingPaused with autoscaling off).

An API server that refuses every request (403, as one whose RBAC lacks deployments/scale) stands in for the
cluster; the queue lengths come from the real broker."""

from __future__ import annotations

import datetime
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest

from celery_event_operator.adapters.broker.brokers import Broker
from celery_event_operator.adapters.cluster import Cluster
from celery_event_operator.adapters.kubeapi import AsyncKubeApi, KubeApi
from celery_event_operator.core.api.models import CeleryEventServiceStatus
from celery_event_operator.core.broker import address as broker_address
from celery_event_operator.core.broker.settings import BrokerSettings, TlsMaterial
from celery_event_operator.core.service import spec as specs
from celery_event_operator.core.service.conclusion import Announced, conclude
from celery_event_operator.core.service.next_steps import Rhythm
from celery_event_operator.core.service.observations import Observations
from celery_event_operator.flow import steps
from tests.conftest import billing_sample
from tests.support.operator_process import free_port


class _Forbidding(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403}
        self.send_response(403, "Forbidden")
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def forbidding_kube() -> Iterator[AsyncKubeApi]:
    listener = http.server.HTTPServer(("127.0.0.1", free_port()), _Forbidding)
    threading.Thread(target=listener.serve_forever, daemon=True).start()
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{listener.server_port}")
    kube = AsyncKubeApi(KubeApi(kubernetes.client.ApiClient(configuration)))
    yield kube
    kube.close()
    listener.shutdown()


async def paused_events(kube: AsyncKubeApi, url: str, passes: int, **spec: Any) -> list[str]:
    """The ScalingPaused messages of `passes` status passes of one service, as the keeper runs them."""
    body = billing_sample()
    body["metadata"]["namespace"] = "default"
    body["spec"].update(spec)
    understood = specs.understand(body)
    assert isinstance(understood, specs.Understood)
    address = broker_address.parse(url)
    broker = Broker(BrokerSettings(address, TlsMaterial(), address.management_url()))
    memory, announced, status = steps.ScalerMemory(), Announced(), CeleryEventServiceStatus()
    found = []
    try:
        for number in range(passes):
            queues = await steps.queues(broker, understood.topology, 0.0)
            scaling = await steps.scale_workers(
                Cluster(kube),
                "default",
                understood,
                queues=queues,
                running=0,
                memory=memory,
                now=float(number),
                scale_max_age=0.0,
            )
            seen = Observations(1, understood.spec, queues=queues, scaling=scaling)
            rhythm = Rhythm(resync_seconds=30, status_seconds=15)
            conclusion = conclude(status, seen, announced, datetime.datetime.now(tz=datetime.UTC), rhythm)
            status, announced = conclusion.status, conclusion.announced
            found += [note.message for note in conclusion.events if note.reason == "ScalingPaused"]
    finally:
        await broker.close()
    return found


async def test_no_scaling_paused_when_nothing_is_to_be_scaled(
    forbidding_kube: AsyncKubeApi, test_vhost_url: str
) -> None:
    assert await paused_events(forbidding_kube, test_vhost_url, 3) == []


async def test_scaling_paused_once_per_problem_when_autoscaling(
    forbidding_kube: AsyncKubeApi, test_vhost_url: str
) -> None:
    [message] = await paused_events(forbidding_kube, test_vhost_url, 3, autoscaling={"enabled": True})
    assert "HTTP 403" in message
    assert "Deployment default/billing-worker" in message
