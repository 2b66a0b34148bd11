"""EventsApp: events, handlers and broker-side retries on top of a plain Celery app."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from celery import Celery, Task
from celery.exceptions import Ignore, NotRegistered, Reject, Retry
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from kombu.entity import Exchange, Queue

from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.core import naming
from celery_event_operator.core.broker import versions
from celery_event_operator.core.broker.address import with_vhost
from celery_event_operator.core.worker_settings import ROBUST_CELERY_SETTINGS
from celery_event_operator.runtime import heart

logger = logging.getLogger(__name__)

# A header py-amqp cannot decode (a timestamp after year 9999, a table nested too deep) raised out of the worker's
# drain_events: the worker reconnected five times a second and the message came back first, for ever (classic), or
# to the archive after the delivery limit (quorum). Decoded now as any other value: see amqp_tables.
amqp_tables.install()

SETTINGS_ENV = "CELERY_EVENTS_SETTINGS"
DEFAULT_SETTINGS_PATH = "/etc/celery-events/settings.json"
EXCEPTION_HEADER = naming.EXCEPTION_HEADER
EXCEPTION_TYPE_HEADER = naming.EXCEPTION_TYPE_HEADER
MAX_EXCEPTION_TEXT = 2000
SLOTS_HEART_STEP = f"{heart.__name__}:{heart.SlotsHeart.__name__}"


class UnknownMessageError(Exception):
    """A message on a handler queue that is no Celery task message."""


class PoisonMessageError(Exception):
    """A message that came back too often after its worker process died on it."""


@dataclasses.dataclass(frozen=True)
class EventsSettings:
    """The service's entity names, as the operator declared them (the `celery_events` settings)."""

    service: str
    events_exchange: str = "events"
    handler_queues: Mapping[str, str] = dataclasses.field(default_factory=dict)
    retry_exchanges: tuple[str, ...] = ()
    archive_exchange: str | None = None
    queue_type: str = "classic"
    vhost: str | None = None
    consumer_timeout_seconds: int | None = None  # how long a delivery may stay unacknowledged (asked per consumer)

    @property
    def max_retries(self) -> int:
        return len(self.retry_exchanges)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EventsSettings:
        return cls(
            service=data["service"],
            events_exchange=data.get("events_exchange", "events"),
            handler_queues=dict(data.get("handler_queues") or {}),
            retry_exchanges=tuple(data.get("retry_exchanges") or ()),
            archive_exchange=data.get("archive_exchange"),
            queue_type=data.get("queue_type", "classic"),
            vhost=data.get("vhost"),
            consumer_timeout_seconds=data.get("consumer_timeout_seconds"),
        )

    @classmethod
    def defaults(
        cls, service: str, *, max_retries: int = 10, archive: bool = True, events_exchange: str = "events"
    ) -> EventsSettings:
        """The operator's defaults, for running without injected settings."""
        return cls(
            service=service,
            events_exchange=events_exchange,
            retry_exchanges=tuple(naming.retry_name(service, level) for level in range(max_retries)),
            archive_exchange=naming.archive_name(service) if archive else None,
        )

    def queue_of(self, event: str) -> str:
        return self.handler_queues.get(event) or naming.handler_queue_name(self.service, event)


def load_settings(path: str | None = None) -> dict[str, Any]:
    """The injected settings file, or {} when there is none (not running under the operator)."""
    path = path or os.environ.get(SETTINGS_ENV, DEFAULT_SETTINGS_PATH)
    try:
        with open(path) as file:
            loaded: dict[str, Any] = json.load(file)
    except FileNotFoundError:
        return {}
    return loaded


def rejected_passes(request: Any, queue: str) -> int:
    """How often the message was rejected from `queue` and came back (its x-death history)."""
    headers = dict(getattr(request, "headers", None) or {})
    deaths = vars(request).get("x-death") or headers.get("x-death") or []
    return sum(
        int(death.get("count", 1))
        for death in deaths
        if death.get("queue") == queue and death.get("reason") == "rejected"
    )


def published_at(headers: Mapping[str, Any], delivery_info: Mapping[str, Any]) -> float | None:
    """When the task was published, by its producer's stamp, if this delivery began its first wait: not a retry (it
    waited in a retry level on purpose), not a message dead-lettered or delivered again (its wait includes a run that
    did not end)."""
    stamp = headers.get(naming.PUBLISHED_AT_HEADER)
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool) or not math.isfinite(stamp):
        return None
    if headers.get("retries") or headers.get("x-death") or delivery_info.get("redelivered"):
        return None
    return float(stamp)


class WaitMeasuredRequest(Request):  # type: ignore[misc]  # Celery is untyped
    """Celery's request of a handler task, whose task-started event carries when the task was published (as its
    producer stamped it), for the wait the operator measures."""

    def send_event(self, type: str, **fields: Any) -> None:
        if type == "task-started":
            published = published_at(self._request_dict, self.delivery_info)
            if published is not None:
                fields[naming.PUBLISHED_AT_FIELD] = published
        super().send_event(type, **fields)


class EventHandler(Task):  # type: ignore[misc]  # Celery is untyped
    """A handler task whose failures are retried through the broker's retry levels.

    A failure the runtime has handled (retried or archived) ends the task acknowledged; a worker
    process that died is not a handled failure: Celery then rejects the message (acks on failure
    stay off), which dead-letters it (classic) or requeues it (quorum), and nothing is lost.
    """

    Request = f"{WaitMeasuredRequest.__module__}:{WaitMeasuredRequest.__qualname__}"
    acks_late = True
    acks_on_failure_or_timeout = False
    default_retry_delay = 0  # retries wait on the broker, never in the worker (no ETA)
    max_retries = None  # the runtime counts attempts from the message (`retries`), not Celery
    # The arguments are checked against the handler before it runs (below); the copies for the retry levels
    # and the archive are published as they came, so Celery must not check them again on the way out (a
    # TypeError there made an event with a wrong argument loop forever, never archived).
    typing = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        events: EventsSettings = self.app.events_settings
        queue = events.queue_of(self.name)
        passes = rejected_passes(self.request, queue)
        if events.max_retries and passes >= events.max_retries:
            self._fail_for_good(PoisonMessageError(f"came back {passes} times after its worker died on it"))
        try:
            inspect.signature(self.run).bind(*args, **kwargs)
        except TypeError as exc:  # arguments that do not fit the handler: no retry can fix it
            self._fail_for_good(exc)
        try:
            return self.run(*args, **kwargs)
        except (Retry, Ignore, Reject):
            raise
        except Exception as exc:
            self._retry_or_archive(exc)
            self._report_failure(exc)
            raise Ignore from exc  # archived (or dropped by configuration): acknowledge the original

    def _fail_for_good(self, error: Exception) -> NoReturn:
        """Archived at once (no retry can help), reported, and the original acknowledged."""
        self._archive(error)
        self._report_failure(error)
        raise Ignore from error

    def _report_failure(self, exc: Exception) -> None:
        # Ignore sends no event of its own; monitoring must still see the final failure.
        self.send_event("task-failed", exception=repr(exc)[:MAX_EXCEPTION_TEXT], traceback="")

    def _retry_or_archive(self, exc: Exception) -> None:
        events: EventsSettings = self.app.events_settings
        attempt = self.request.retries
        if attempt < events.max_retries:
            level = min(attempt, events.max_retries - 1)
            # Publishes (with confirms) a copy with retries + 1, then raises Retry: the worker acks.
            raise self.retry(exc=exc, exchange=events.retry_exchanges[level], routing_key=self.name, declare=[])
        self._archive(exc)

    def _archive(self, exc: Exception) -> None:
        events: EventsSettings = self.app.events_settings
        if events.archive_exchange is None:
            logger.error(
                "%s[%s] failed for good and the archive is disabled: dropped (%r)", self.name, self.request.id, exc
            )
            return
        headers = {key: value for key, value in (self.request.headers or {}).items() if key != "x-death"}
        headers[EXCEPTION_TYPE_HEADER] = type(exc).__name__
        headers[EXCEPTION_HEADER] = f"{type(exc).__name__}: {exc}"[:MAX_EXCEPTION_TEXT]
        headers[naming.ARCHIVED_AT_HEADER] = time.time()
        try:
            # `retries` in the copy = the attempts made; throw=False: publish without raising Retry.
            self.retry(
                exc=exc,
                exchange=events.archive_exchange,
                routing_key=self.name,
                declare=[],
                headers=headers,
                throw=False,
            )
        except Exception as publish_error:
            # Not archived: dead-letter the original instead of acknowledging it, so nothing is lost.
            logger.exception("%s[%s]: archiving failed", self.name, self.request.id)
            raise Reject(publish_error, requeue=False) from publish_error
        logger.error("%s[%s] archived after %d attempts: %r", self.name, self.request.id, self.request.retries + 1, exc)


class Event:
    """Calling it runs its body (to validate), then publishes the event with publisher confirms."""

    def __init__(self, app: EventsApp, name: str, function: Callable[..., Any]) -> None:
        self.app = app
        self.name = name
        self.function = function
        self.__doc__ = function.__doc__

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        self.function(*args, **kwargs)
        # declare=[]: Celery would otherwise declare its default queue; the topology is the operator's. The publish
        # time lets the handlers' workers say how long the task waited (their task-started events).
        result = self.app.send_task(
            self.name,
            args=args,
            kwargs=kwargs,
            routing_key=self.name,
            declare=[],
            exchange=self.app.events_settings.events_exchange,
            headers={naming.PUBLISHED_AT_HEADER: time.time()},
        )
        task_id: str = result.id
        return task_id


class EventsApp(Celery):  # type: ignore[misc]  # Celery is untyped
    task_cls = EventHandler

    def __init__(self, main: str, *, events: EventsSettings, **kwargs: Any) -> None:
        super().__init__(main, **kwargs)
        self.events_settings = events
        self._handled: list[str] = []
        self.on_after_finalize.connect(self._consume_handler_queues, weak=False)

    def event(self, name: str) -> Callable[[Callable[..., Any]], Event]:
        def register(function: Callable[..., Any]) -> Event:
            return Event(self, name, function)

        return register

    def handler(self, name: str, *, bind: bool = False, **options: Any) -> Callable[[Callable[..., Any]], Any]:
        """The task name is the event name, as celery-amqp-events does: any service's message for the
        event runs this service's handler, from this service's own queue."""
        if name in self._handled:
            raise ValueError(f"a handler for {name!r} is already registered")

        def register(function: Callable[..., Any]) -> Any:
            self._handled.append(name)
            return self.task(function, name=name, bind=bind, base=EventHandler, **options)

        return register

    def _consume_handler_queues(self, **_: Any) -> None:
        events = self.events_settings
        exchange = Exchange(events.events_exchange, type="topic", no_declare=True)
        queues = []
        for name in self._handled:
            if events.handler_queues and name not in events.handler_queues:
                # The operator declared no queue for it: consuming would fail. Say so and go on.
                logger.warning(
                    "handler %r is not in spec.events.handlers of service %r: not consumed", name, events.service
                )
                continue
            queues.append(
                Queue(
                    events.queue_of(name),
                    exchange=exchange,
                    routing_key=name,
                    no_declare=True,
                    # Never declared from here; the type tells Celery to use per-consumer QoS, which is all a
                    # quorum queue supports (global QoS: 540 NOT_IMPLEMENTED on basic.consume).
                    queue_arguments={"x-queue-type": "quorum"} if events.queue_type == "quorum" else None,
                    # The acknowledgement timeout asked per consumer depends on the broker reached:
                    # EventsConsumer.connect sets it.
                )
            )
        self.conf.task_queues = queues


class EventsConsumer(Consumer):  # type: ignore[misc]  # Celery is untyped
    """Celery's worker consumer, with three changes.

    No native delayed delivery, which Celery >= 5.5 switches on for quorum queues: it would declare its own
    `celery_delayed_*` exchanges and queues and bind ours to them. Retries wait on the broker in the
    operator's retry levels instead, for both queue types, and nothing is declared beyond the plan.

    A message that can never be run — a body that does not decode, a task no handler is registered for, a
    message that is no task — is archived at once with the reason, where Celery would drop it (decode
    errors) or reject it (a loop through the retry levels on classic queues).

    Its heartbeats say how many tasks the worker runs at once (runtime/heart.py), for the operator's autoscaling.
    """

    class Blueprint(Consumer.Blueprint):  # type: ignore[misc]
        default_steps = [
            SLOTS_HEART_STEP if step == heart.CELERY_HEART_STEP else step
            for step in Consumer.Blueprint.default_steps
            if not step.endswith(":DelayedDelivery")
        ]

    def connect(self) -> Any:
        """Celery's connection, and the handler queues' consumer arguments for the broker it reached (each connect:
        a failover may reach another version). A long task keeps its delivery unacknowledged (late acks): the broker
        must not give it to another worker meanwhile, so the workers ask for a timeout longer than their tasks
        where the broker honours it — and nothing where it would ignore it or refuse to consume (RabbitMQ 4.3's
        classic queues)."""
        connection = super().connect()
        events: EventsSettings = self.app.events_settings
        version = (connection.connection.server_properties or {}).get("version")
        arguments = versions.consumer_arguments(
            version.decode() if isinstance(version, bytes) else version,
            events.queue_type,
            events.consumer_timeout_seconds,
        )
        for queue in self.app.amqp.queues.values():
            queue.consumer_arguments = arguments or None
        return connection

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._archive_unrunnable(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._archive_unrunnable(message, UnknownMessageError("the message is no Celery task"))

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        # Celery passes the KeyError of its lookup; what it reports is NotRegistered(name), and so do we.
        self._archive_unrunnable(message, NotRegistered((message.headers or {}).get("task", "?")))

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._archive_unrunnable(message, exc)

    def _archive_unrunnable(self, message: Any, exc: Exception) -> None:
        events: EventsSettings = self.app.events_settings
        routing_key = (message.delivery_info or {}).get("routing_key", "")
        if events.archive_exchange is None:
            logger.error("a message on %r cannot be run and the archive is disabled: dropped (%r)", routing_key, exc)
            message.ack()
            return
        headers = {key: value for key, value in (message.headers or {}).items() if key != "x-death"}
        headers[EXCEPTION_TYPE_HEADER] = type(exc).__name__
        headers[EXCEPTION_HEADER] = f"{type(exc).__name__}: {exc}"[:MAX_EXCEPTION_TEXT]
        headers[naming.ARCHIVED_AT_HEADER] = time.time()
        try:
            with self.app.producer_or_acquire() as producer:
                producer.publish(
                    message.body,  # as it came: bytes with its own content type and encoding
                    exchange=events.archive_exchange,
                    routing_key=routing_key,
                    headers=headers,
                    content_type=message.content_type or "application/octet-stream",
                    content_encoding=message.content_encoding or "binary",
                    declare=[],
                )
        except Exception:
            logger.exception("a message on %r cannot be run and archiving it failed: rejected", routing_key)
            message.reject(requeue=False)  # dead-lettered rather than lost
            return
        logger.error("a message on %r cannot be run: archived (%r)", routing_key, exc)
        message.ack()


def _named_after_pod(transport_options: dict[str, Any]) -> dict[str, Any]:
    """The worker's broker connections named after its pod (set by the webhook), as the injected loader does: the
    operator tells by it which pod holds which consumer."""
    pod = os.environ.get(naming.POD_NAME_ENV)
    if not pod:
        return transport_options
    name = naming.pod_connection_name(os.environ.get(naming.POD_NAMESPACE_ENV, ""), pod)
    return {**transport_options, "client_properties": {"connection_name": name}}


def events_app(service_name: str | None = None, **overrides: Any) -> EventsApp:
    """A Celery app with the injected settings (or the operator's defaults without them)."""
    settings = load_settings()
    injected = settings.get("celery_events")
    if injected is not None:
        events = EventsSettings.from_mapping(injected)
        if service_name is not None and service_name != events.service:
            raise ValueError(f"this pod was configured for service {events.service!r}, not {service_name!r}")
    elif service_name is not None:
        events = EventsSettings.defaults(service_name)
    else:
        raise ValueError(f"no injected settings at ${SETTINGS_ENV}: pass the service name")
    if events.vhost is not None and os.environ.get("CELERY_BROKER_URL"):
        # Celery takes CELERY_BROKER_URL over any setting: the vhost override must go there.
        os.environ["CELERY_BROKER_URL"] = with_vhost(os.environ["CELERY_BROKER_URL"], events.vhost)
    app = EventsApp(events.service, events=events)
    celery = {**ROBUST_CELERY_SETTINGS, **settings.get("celery", {})}
    app.config_from_object(
        {
            **celery,
            "broker_transport_options": _named_after_pod(celery.get("broker_transport_options") or {}),
            "task_default_exchange": events.events_exchange,
            "worker_consumer": f"{EventsConsumer.__module__}:{EventsConsumer.__qualname__}",
            # Per pod (its grace period, set by the webhook): how long running tasks may finish after SIGTERM.
            "worker_soft_shutdown_timeout": float(os.environ.get(naming.SOFT_SHUTDOWN_ENV) or 0),
        }
    )
    app.conf.update(overrides)
    return app
