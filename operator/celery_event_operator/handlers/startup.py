"""Start-up and shutdown: how kopf behaves for this operator; the shared clients opened and closed."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from celery_event_operator.core.api.metadata import KOPF_ANNOTATION_PREFIX
from celery_event_operator.core.options import PEERING_LIFETIME_SECONDS, OperatorOptions, WebhookOptions
from celery_event_operator.flow.context import Context, webhook_certificate

CONSISTENCY_TIMEOUT_SECONDS = 60.0


@kopf.on.startup()
async def connect(memo: kopf.Memo, **_: Any) -> None:
    # Shared by every resource's keeper (kopf copies the memo per object, not the objects in it).
    try:
        memo.context = Context.open(memo.options)
    except OSError as exc:  # e.g. the /metrics port is taken: trying again in a minute would not free it
        raise kopf.PermanentError(f"the operator cannot start: {exc}") from exc
    if memo.options.webhook is not None:
        memo.context.injections.start()  # the webhook answers from it, kept current in the background
    memo.context.pods.start()  # the services' first passes wait for its first listing
    await memo.context.ensure_peering()
    memo.context.freeze_heap_later()


@kopf.on.cleanup()
async def disconnect(memo: kopf.Memo, **_: Any) -> None:
    context: Context = memo.context
    await context.close()


def webhook_server(options: WebhookOptions) -> kopf.WebhookServer:
    certfile, keyfile = webhook_certificate(options)
    return kopf.WebhookServer(
        addr=options.addr, port=options.port, host=options.host, certfile=certfile, pkeyfile=keyfile
    )


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf keeps its progress and diff-base in annotations under our group, so `status` holds only
    # the fields of our schema (a strict status schema would prune kopf's own fields anyway).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    options: OperatorOptions = memo.options
    settings.persistence.finalizer = options.finalizer
    # After its own patch kopf waits for the patched version to come back through the watch before it runs change
    # handlers again; past this it assumes it came. A thousand resources applied at once kept the watch behind by
    # more than kopf's 5 s: the body without the handled mark made a third of them "created" twice (a second full
    # reconcile each). A watch resumed brings every version, in order, so the wait ends as soon as it comes; a watch
    # listed afresh (410 Gone) may skip it, and then that resource's change and deletion handlers wait out the 60 s.
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT_SECONDS
    # Our own Events say what went wrong; kopf's per-handler chatter stays in the log.
    settings.posting.level = logging.WARNING
    # Namespaces are given explicitly (no globs), so kopf need not list them.
    settings.scanning.disabled = True
    # A watch that hangs silently (a dead connection) is replaced within a minute.
    settings.watching.server_timeout = 50
    settings.watching.client_timeout = 60
    settings.watching.connect_timeout = 10
    if options.peering is not None:
        settings.peering.mandatory = True  # never run unpeered beside a replica that is peered
        settings.peering.lifetime = PEERING_LIFETIME_SECONDS
        settings.peering.stealth = True  # no keep-alive log lines
    if options.webhook is not None:
        # The webhook configuration is the chart's (failurePolicy Ignore, short timeout); kopf serves.
        settings.admission.server = webhook_server(options.webhook)
