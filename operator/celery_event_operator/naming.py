"""Names of a service's RabbitMQ entities and the Celery settings every worker gets (pure, no
dependencies): shared by the operator and the worker runtime, which imports nothing but celery and
kombu."""

from __future__ import annotations

from typing import Any

# The settings that keep messages safe, for every service's workers (the operator adds the
# service-specific ones; the runtime uses these alone when no settings were injected).
ROBUST_CELERY_SETTINGS: dict[str, Any] = {
    # Nothing is lost: acknowledge after the task ran, confirm every publish, retry connecting.
    "task_acks_late": True,
    "task_acks_on_failure_or_timeout": False,
    "broker_transport_options": {"confirm_publish": True},
    "broker_connection_retry_on_startup": True,
    "worker_prefetch_multiplier": 1,
    # Events feed the metrics; heartbeats tell live workers from gone ones.
    "worker_send_task_events": True,
    "task_send_sent_event": True,
    # No result backend: events are fire-and-forget.
    "result_backend": None,
    "task_ignore_result": True,
    # Routing: every publish goes to the events exchange by routing key (the event name).
    "task_default_exchange_type": "topic",
}

# Headers the runtime puts on an archived copy: why and when it was archived.
EXCEPTION_HEADER = "x-celery-events-exception"
EXCEPTION_TYPE_HEADER = "x-celery-events-exception-type"
ARCHIVED_AT_HEADER = "x-celery-events-archived-at"


def handler_queue_name(service: str, event: str) -> str:
    return f"{service}.{event}"


def retry_name(service: str, level: int) -> str:
    return f"{service}:retry" if level == 0 else f"{service}:retry.{level}"


def recover_name(service: str) -> str:
    return f"{service}:recover"


def archive_name(service: str) -> str:
    return f"{service}:archived"


def event_exchange_name(service: str) -> str:
    """Where the service's workers send their Celery events (its `event_exchange` setting)."""
    return f"{service}:celeryev"


def monitor_queue_name(service: str) -> str:
    """The operator's own queue of the service's Celery events (an event may not be named `celeryev`)."""
    return f"{service}.celeryev"
