"""The Celery settings of a service's workers, rendered from its spec (pure).

They reach the pods as data (a JSON file in a ConfigMap) beside a fixed loader module: nothing
executable is generated from user input. The `celery` part is plain Celery configuration (a plain
`Celery(...)` app reads it through CELERY_CONFIG_MODULE); the `celery_events` part tells the runtime
(`celery_event_operator.runtime`) the names of the service's entities, so it needs no naming rules of
its own.
"""

from __future__ import annotations

import hashlib
import json
import string
from typing import Any

from celery_event_operator.core import naming
from celery_event_operator.core.api.models import CeleryEventServiceSpec
from celery_event_operator.core.lifecycle import long_tasks
from celery_event_operator.core.topology import plan
from celery_event_operator.core.worker_settings import ROBUST_CELERY_SETTINGS

MOUNT_PATH = "/etc/celery-events"
SETTINGS_FILE = "settings.json"
LOADER_MODULE = "celeryevents_settings"

# The fixed loader: a config module for CELERY_CONFIG_MODULE that reads the JSON beside it.
LOADER_SOURCE = string.Template(
    '''\
"""Celery settings injected by celery-event-operator (generated data lives in settings.json)."""
import json as _json
import os as _os

with open(_os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "settings.json")) as _file:
    globals().update(_json.load(_file)["celery"])
# Per pod (its grace period), so from the pod's env, not from the service's settings.
worker_soft_shutdown_timeout = float(_os.environ.get("$soft_shutdown") or 0)
# The worker's broker connections are named after its pod: the operator finds which pod holds which consumer.
if _os.environ.get("$pod_name"):
    broker_transport_options = dict(
        broker_transport_options,
        client_properties={
            "connection_name": "$prefix" + _os.environ.get("$pod_namespace", "") + "/" + _os.environ["$pod_name"]
        },
    )
'''
).substitute(
    soft_shutdown=naming.SOFT_SHUTDOWN_ENV,
    pod_name=naming.POD_NAME_ENV,
    pod_namespace=naming.POD_NAMESPACE_ENV,
    prefix=naming.POD_CONNECTION_PREFIX,
)


def configmap_name(service: str) -> str:
    return f"{service}-celery-events"


def render(service: str, spec: CeleryEventServiceSpec) -> dict[str, Any]:
    quorum = spec.queue_type == "quorum"
    levels = spec.retry.max_retries
    celery: dict[str, Any] = {
        **ROBUST_CELERY_SETTINGS,
        # A task whose worker process died: quorum queues requeue it and count deliveries up to the
        # delivery limit; classic queues cannot count requeues, so the message is dead-lettered
        # through retry level 0 and comes back with an x-death count the runtime reads.
        # (Without retry levels a classic queue has no dead-letter exchange: requeue instead.)
        "task_reject_on_worker_lost": quorum or levels == 0,
        "broker_failover_strategy": spec.broker.failover_strategy,
        "task_default_exchange": spec.events.exchange,
        # Per-service monitoring and remote-control exchanges: services on a vhost stay apart.
        "event_exchange": naming.event_exchange_name(service),
        "event_queue_prefix": naming.event_exchange_name(service),
        "control_exchange": naming.control_exchange_name(service),
    }
    tuning = spec.workers.celery if spec.workers is not None else None
    if tuning is not None:
        celery["worker_prefetch_multiplier"] = tuning.prefetch_multiplier
        if tuning.concurrency is not None:
            celery["worker_concurrency"] = tuning.concurrency
        if tuning.time_limit_seconds is not None:
            celery["task_time_limit"] = tuning.time_limit_seconds
        if tuning.soft_time_limit_seconds is not None:
            celery["task_soft_time_limit"] = tuning.soft_time_limit_seconds
    events: dict[str, Any] = {
        "service": service,
        "events_exchange": spec.events.exchange,
        "handler_queues": {
            handler.name: plan.handler_queue_name(service, handler.name) for handler in spec.events.handlers
        },
        "retry_exchanges": [plan.retry_name(service, level) for level in range(levels)],
        "archive_exchange": plan.archive_name(service) if spec.archive.enabled else None,
        "queue_type": spec.queue_type,
        "vhost": spec.broker.vhost,
        # Asked of the broker per consumer of the handler queues where it honours it (core/broker/versions.py).
        "consumer_timeout_seconds": long_tasks.consumer_timeout_seconds(spec.workers),
    }
    return {"celery": celery, "celery_events": events}


def settings_json(settings: dict[str, Any]) -> str:
    return json.dumps(settings, indent=2, sort_keys=True) + "\n"


def configmap_data(settings: dict[str, Any]) -> dict[str, str]:
    return {SETTINGS_FILE: settings_json(settings), f"{LOADER_MODULE}.py": LOADER_SOURCE}


def config_hash(settings: dict[str, Any]) -> str:
    """Changes whenever what the workers load changes (data or loader)."""
    return data_hash(configmap_data(settings))


def data_hash(data: dict[str, str]) -> str:
    """The hash of a settings ConfigMap's data (so of what its pods load)."""
    digest = hashlib.sha256()
    for name, content in sorted(data.items()):
        digest.update(name.encode() + b"\0" + content.encode() + b"\0")
    return digest.hexdigest()[:16]
