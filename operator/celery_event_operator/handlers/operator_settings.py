"""How kopf itself behaves for this operator."""

from __future__ import annotations

import logging
import os
import pathlib
import tempfile
from typing import Any

import kopf
import prometheus_client

from celery_event_operator import certs
from celery_event_operator.api.models import GROUP
from celery_event_operator.broker.connections import BrokerRegistry
from celery_event_operator.kubeapi import KubeApi
from celery_event_operator.monitoring.collector import EventsCollector, MetricsRegistry

# kopf keeps its progress and diff-base in annotations under our group, so `status` holds only
# the fields of our schema (a strict status schema would prune kopf's own fields anyway).
ANNOTATION_PREFIX = GROUP
FINALIZER = f"{GROUP}/finalizer"


@kopf.on.startup()
def connect(memo: kopf.Memo, **_: Any) -> None:
    # Shared by every resource handler (kopf copies the memo per object, not these objects).
    memo.kube = KubeApi.from_environment()
    memo.brokers = BrokerRegistry()
    memo.metrics = MetricsRegistry()
    port = int(os.environ.get("CELERY_EVENT_OPERATOR_METRICS_PORT", "0") or 0)
    if port:
        registry = prometheus_client.CollectorRegistry()
        registry.register(EventsCollector(memo.metrics))
        prometheus_client.start_http_server(port, addr=os.environ.get("CELERY_EVENT_OPERATOR_METRICS_ADDR", "0.0.0.0"),
                                            registry=registry)


@kopf.on.cleanup()
def disconnect(memo: kopf.Memo, **_: Any) -> None:
    memo.brokers.close_all()


def webhook_server() -> kopf.WebhookServer | None:
    """From the `run` command's options (passed in the environment); None: no webhook served."""
    port = os.environ.get("CELERY_EVENT_OPERATOR_WEBHOOK_PORT", "")
    if not port:
        return None
    host = os.environ.get("CELERY_EVENT_OPERATOR_WEBHOOK_HOST", "localhost")
    certfile = os.environ.get("CELERY_EVENT_OPERATOR_WEBHOOK_CERT")
    keyfile = os.environ.get("CELERY_EVENT_OPERATOR_WEBHOOK_KEY")
    if not certfile or not keyfile:
        directory = pathlib.Path(tempfile.mkdtemp(prefix="celery-event-operator-webhook-"))
        certfile, keyfile = (str(path) for path in certs.self_signed(directory, [host, "localhost", "127.0.0.1"]))
    return kopf.WebhookServer(addr=os.environ.get("CELERY_EVENT_OPERATOR_WEBHOOK_ADDR", "0.0.0.0"),
                              port=int(port), host=host, certfile=certfile, pkeyfile=keyfile)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.persistence.finalizer = FINALIZER
    # Our own Events say what went wrong; kopf's per-handler chatter stays in the log.
    settings.posting.level = logging.WARNING
    # Namespaces are given explicitly (no globs), so kopf need not list them.
    settings.scanning.disabled = True
    # A watch that hangs silently (a dead connection) is replaced within a minute.
    settings.watching.server_timeout = 50
    settings.watching.client_timeout = 60
    settings.watching.connect_timeout = 10
    server = webhook_server()
    if server is not None:
        # The webhook configuration is the chart's (failurePolicy Ignore, short timeout); kopf serves.
        settings.admission.server = server
