"""The worker side: a Celery app on the operator's topology (imports celery and kombu only).

    from celery_event_operator.runtime import events_app
    app = events_app()                     # settings injected by the operator into the pod

    @app.event("orders.order.created")
    def order_created(order_id: int) -> None:
        if order_id <= 0:                  # the body validates; firing publishes (with confirms)
            raise ValueError(order_id)

    @app.handler("orders.order.created")
    def on_order_created(order_id: int) -> None:
        ...                                # consumed from queue `<service>.orders.order.created`

    order_created(42)

A failing handler is retried **on the broker**: the message is re-published to retry level
min(attempt, maxRetries - 1), waits there 2^level seconds, and comes back through the recover
exchange; the worker keeps nothing in memory meanwhile. The attempt count travels in the message
(task protocol v2 `retries`), never in the worker. After maxRetries retries the message goes to the
archive with its attempt count and the exception. A message whose worker process dies on it every
time is archived once it has come back maxRetries times (its `x-death` history counts the passes).
The runtime never declares the operator's entities.
"""

from celery_event_operator.runtime.app import Event, EventsApp, EventsSettings, PoisonMessageError, events_app

__all__ = ["Event", "EventsApp", "EventsSettings", "PoisonMessageError", "events_app"]
