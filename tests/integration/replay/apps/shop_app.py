"""A service of three events, written with the runtime; every handler call appends a JSON line to $HANDLER_LOG
(the test's record of what ran: event, order and Celery task id)."""

import json
import os

from celery_event_operator.runtime import events_app

app = events_app()


def record(event, order_id, task_id):
    with open(os.environ["HANDLER_LOG"], "a") as log:
        log.write(json.dumps({"event": event, "order_id": order_id, "task_id": task_id}) + "\n")


@app.handler("orders.order.created", bind=True)
def on_created(self, order_id):
    record("orders.order.created", order_id, self.request.id)


@app.handler("orders.order.cancelled", bind=True)
def on_cancelled(self, order_id):
    record("orders.order.cancelled", order_id, self.request.id)


@app.handler("orders.order.shipped", bind=True)
def on_shipped(self, order_id):
    record("orders.order.shipped", order_id, self.request.id)
