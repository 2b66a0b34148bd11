"""A service app as a user writes it: events_app() and handlers, nothing else configured here.

Each handler call appends a JSON line to $HANDLER_LOG (the test's record of what ran).
"""

import json
import os
import time

from celery_event_operator.runtime import events_app

app = events_app()


def record(**fields):
    with open(os.environ["HANDLER_LOG"], "a") as log:
        log.write(json.dumps({**fields, "at": time.time()}) + "\n")


@app.event("orders.order.created")
def order_created(order_id, behaviour="ok"):
    """An order was created; `behaviour` tells the handler how to fail (tests only)."""


@app.handler("orders.order.created", bind=True)
def on_order_created(self, order_id, behaviour="ok"):
    if behaviour == "crash":
        os._exit(1)  # a poison message: the worker process dies on it every time
    if behaviour == "slow":
        time.sleep(0.02)  # the handler's own work (not a wait): a worker killed mid-run has tasks in flight
    if behaviour.startswith("hang-once:"):  # hangs on its first delivery only (the replacement runs it at once)
        marker = f"{os.environ['HANDLER_LOG']}.hung-{order_id}"
        behaviour = "ok" if os.path.exists(marker) else "long:" + behaviour[10:]
        open(marker, "a").close()
    if behaviour.startswith(("long:", "hold:")):  # a task that runs for seconds: a worker stopped meanwhile
        on = {"retries": self.request.retries, "exchange": None, "hostname": self.request.hostname}
        record(order_id=order_id, phase="started", **on)
        if behaviour.startswith("long:"):
            time.sleep(float(behaviour[5:]))
        else:  # runs until the test releases it (release(order_id)), at most the seconds given
            released_by = f"{os.environ['HANDLER_LOG']}.release-{order_id}"
            deadline = time.monotonic() + float(behaviour[5:])
            while not os.path.exists(released_by) and time.monotonic() < deadline:
                time.sleep(0.1)
        record(order_id=order_id, phase="done", **on)
        return
    record(
        order_id=order_id,
        retries=self.request.retries,
        exchange=self.request.delivery_info.get("exchange"),
        hostname=self.request.hostname,
    )
    if behaviour == "flaky" and self.request.retries < 3:
        raise ValueError(f"flaky, attempt {self.request.retries + 1}")
    if behaviour == "always":
        raise KeyError("always fails")
    if behaviour == "flaky-once" and self.request.retries == 0:
        raise ValueError("fails the first time")


if os.environ.get("ORDERS_PAID"):  # a second event, for a service that declares its queue too

    @app.event("orders.order.paid")
    def order_paid(order_id):
        """An order was paid."""

    @app.handler("orders.order.paid")
    def on_order_paid(order_id):
        record(order_id=order_id, paid=True)
