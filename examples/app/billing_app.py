"""The sample service's Celery app, written with the operator's runtime.

Everything it needs (broker URL, queue names, retry levels, Celery settings) is injected by the
operator into pods labelled `celeryevents.io/service: billing`; run it with the plain command
`celery -A billing_app worker`. Without the operator, `events_app("billing")` uses the defaults.
"""

import logging
import os
import time

from celery_event_operator.runtime import events_app

logger = logging.getLogger(__name__)
# How long invoicing takes (0 by default); the e2e suite makes it long, to see a busy pod outlive a scale-down.
INVOICE_SECONDS = float(os.environ.get("BILLING_INVOICE_SECONDS") or 0)
app = events_app()  # settings injected by the operator (see examples/billing-worker.yaml)


@app.event("orders.order.created")
def order_created(order_id: int, amount_cents: int) -> None:
    """Fired by the shop when an order is placed; the body checks the payload before publishing."""
    if amount_cents < 0:
        raise ValueError(f"negative amount for order {order_id}")


@app.event("orders.order.cancelled")
def order_cancelled(order_id: int) -> None:
    """Fired by the shop when an order is cancelled."""


class PaymentProviderTimeout(Exception):
    """The payment provider did not answer in time (it recovers: a retry succeeds)."""


@app.handler("orders.order.created", bind=True)
def invoice_order(self, order_id: int, amount_cents: int) -> None:
    # A failure here is retried on the broker after 1, 2, 4 … s, then archived. The sample's payment
    # provider is slow for every third order: its first three attempts fail (so `kubectl get ces -o wide`
    # shows events RETRYING), the fourth succeeds.
    if order_id % 3 == 0 and self.request.retries < 3:
        raise PaymentProviderTimeout(f"order {order_id}, attempt {self.request.retries + 1}")
    logger.info("invoicing order %s: %s cents", order_id, amount_cents)
    time.sleep(INVOICE_SECONDS)


@app.handler("orders.order.cancelled")
def refund_order(order_id: int) -> None:
    if os.environ.get("BILLING_REFUNDS_DISABLED"):
        raise RuntimeError("refunds are disabled")
    logger.info("refunding order %s", order_id)
