"""Names of a service's RabbitMQ entities and of the headers on archived messages (pure, no
dependencies): shared by the operator and the worker runtime, which imports nothing but celery and
kombu."""

from __future__ import annotations

# Headers the runtime puts on an archived copy: why and when it was archived.
EXCEPTION_HEADER = "x-celery-events-exception"
EXCEPTION_TYPE_HEADER = "x-celery-events-exception-type"
ARCHIVED_AT_HEADER = "x-celery-events-archived-at"
# Set per worker pod by the webhook (from its grace period); read by the injected settings and the runtime.
SOFT_SHUTDOWN_ENV = "CELERY_EVENTS_SOFT_SHUTDOWN_SECONDS"
# The field the runtime adds to its worker-online and worker-heartbeat events (Celery's carry no pool size): the most
# tasks the worker runs at once, which the operator's autoscaling needs.
CONCURRENCY_FIELD = "concurrency"
# When an event was published (unix time), stamped by the runtime's producers, and the field its worker's task-started
# event carries it in on the task's first delivery: the operator measures the wait from it, where producers of other
# services send no task-sent to this service's events exchange.
PUBLISHED_AT_HEADER = "x-celery-events-published-at"
PUBLISHED_AT_FIELD = "published_at"


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


def control_exchange_name(service: str) -> str:
    """The service's remote-control exchange (its `control_exchange` setting): its own, so that a broadcast to the
    workers of one service reaches no other's."""
    return f"{service}:control"


def pidbox_queue_suffix(control_exchange: str) -> str:
    """How the remote-control queue of each worker ends: Celery (kombu's Mailbox) names it
    `<hostname>.<control exchange>.pidbox`."""
    return f".{control_exchange}.pidbox"


def monitor_queue_name(service: str) -> str:
    """The operator's own queue of the service's Celery events (an event may not be named `celeryev`)."""
    return f"{service}.celeryev"


# Set per worker pod by the webhook (the downward API): the loader names the worker's broker connections after its
# pod, so the operator can tell which pod holds which consumer (many pods may share an address the broker sees).
POD_NAME_ENV = "CELERY_EVENTS_POD_NAME"
POD_NAMESPACE_ENV = "CELERY_EVENTS_POD_NAMESPACE"
POD_CONNECTION_PREFIX = "celeryevents.io/pod="


def pod_connection_name(namespace: str, pod: str) -> str:
    """The client-provided name of a worker pod's broker connections."""
    return f"{POD_CONNECTION_PREFIX}{namespace}/{pod}"


def owner_exchange_name(service: str) -> str:
    """The exchange whose `alternate-exchange` argument names the one resource that owns the service's topology
    (core/service/ownership.py): the claim lives on the broker, next to what it owns."""
    return f"{service}:owner"
