"""The consumer of one service's Celery events (I/O, a thread per service).

Its queue is the operator's own and part of the service's plan (topology/plan.py), bounded so that a
stopped operator leaves nothing growing on the broker. Events are taken without acknowledgement (metrics
tolerate losing the in-flight ones when the operator dies; acks would halve the throughput).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import amqp
from kombu.connection import Connection

from celery_event_operator import naming
from celery_event_operator.broker.connections import CONNECT_TIMEOUT_SECONDS, CONNECTION_ERRORS
from celery_event_operator.broker.urls import BrokerAddress, redact
from celery_event_operator.monitoring.state import ServiceMetrics
from celery_event_operator.topology import plan

PREFETCH = 5000
BACKOFF_MAX_SECONDS = 60.0


def _consume_once(address: BrokerAddress, service: str, metrics: ServiceMetrics, stop: threading.Event,
                  on_ready: Any) -> None:
    with Connection(";".join(address.urls), failover_strategy=address.failover_strategy,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS, heartbeat=0,
                    transport_options={"client_properties": {"connection_name": f"celery-event-operator {service}"}},
                    ) as connection:
        connection.ensure_connection(max_retries=len(address.urls) - 1, interval_start=0, interval_step=0)
        client = connection.connection  # py-amqp: the raw consumer is the fast one
        channel = client.channel()
        exchange, queue = naming.event_exchange_name(service), naming.monitor_queue_name(service)
        # Celery declares its event exchange the same way (a durable topic exchange).
        channel.exchange_declare(exchange, "topic", durable=True, auto_delete=False)
        # As planned (topology/plan.py), so that the applier and the consumer agree on the arguments.
        channel.queue_declare(queue, durable=True, auto_delete=False, arguments=dict(plan.MONITOR_QUEUE_ARGUMENTS))
        channel.queue_bind(queue, exchange, "#")
        channel.basic_qos(0, PREFETCH, False)
        ingest, clock = metrics.ingest_message, time.monotonic
        channel.basic_consume(queue, callback=lambda message: ingest(message.body, clock()), no_ack=True)
        on_ready()
        while not stop.is_set():
            try:
                client.drain_events(timeout=1.0)
            except TimeoutError:
                continue


def consume(address: BrokerAddress, service: str, metrics: ServiceMetrics, stop: threading.Event,
            logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """Consume until `stop` is set, reconnecting with exponential backoff after failures."""
    backoff = 1.0

    def ready() -> None:
        nonlocal backoff
        backoff = 1.0
        logger.info("consuming the Celery events of %r from %s", service, address.display)

    while not stop.is_set():
        try:
            _consume_once(address, service, metrics, stop, ready)
        except (*CONNECTION_ERRORS, amqp.exceptions.AMQPError) as exc:
            logger.warning("events of %r: %s; reconnecting in %.0fs", service,
                           redact(f"{type(exc).__name__}: {exc}", address), backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)
