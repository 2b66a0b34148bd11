"""The Celery settings every service's workers get (pure, no dependencies): the operator renders them
into each service's settings, and the worker runtime uses them alone when no settings were injected."""

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
