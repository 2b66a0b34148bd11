"""A service written with celery-amqp-events 0.1.0, run unchanged against the operator's topology.

Runs in its own virtualenv (Celery 5.0.1, kombu 5.0.2: the versions that library behaves on), so it
imports nothing of this repository. Each handler call appends a JSON line to $HANDLER_LOG.
"""

import json
import os

from amqp_events.celery import events_app

app = events_app("billing", broker_url=os.environ["BROKER_URL"])


def fire(event, *args):
    """What `order_created(42)` is meant to do; the library's own Event.__call__ fails on Celery 5.0.1
    (it passes task_type twice to send_task), so publish the same task message directly."""
    return app.send_task(event, args=args, routing_key=event)


def record(**fields):
    with open(os.environ["HANDLER_LOG"], "a") as log:
        log.write(json.dumps(fields) + "\n")


@app.event("orders.order.created")
def order_created(order_id):
    """An order was created."""


@app.event("orders.order.cancelled")
def order_cancelled(order_id):
    """An order was cancelled."""


@order_created.handler(bind=True)
def on_order_created(self, order_id):
    record(event="created", order_id=order_id, retries=self.request.retries)


@order_cancelled.handler(bind=True)
def on_order_cancelled(self, order_id):
    record(
        event="cancelled",
        order_id=order_id,
        retries=self.request.retries,
        exchange=self.request.delivery_info.get("exchange"),
    )
    raise ValueError("cancellations always fail here")
