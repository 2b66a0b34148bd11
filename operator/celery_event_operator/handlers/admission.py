"""The mutating admission webhook: worker pods of a service get its settings injected.

It never blocks pod creation: the webhook configuration says failurePolicy Ignore with a short
timeout, and a pod of an unknown service is admitted unchanged with a warning. The handlers are
registered only by an operator that serves the webhook (`register`): kopf refuses to start with
admission handlers and no server, and without the webhook pods are configured through the runtime.
"""

from __future__ import annotations

from typing import Any

import kopf

from celery_event_operator.core.api.metadata import HASH_ANNOTATION, SERVICE_LABEL, WARNING_ANNOTATION
from celery_event_operator.core.injection import pod
from celery_event_operator.flow.context import Context

WEBHOOK_ID = "inject-celery-settings"


async def inject_settings(
    body: kopf.Body, patch: kopf.Patch, warnings: list[str], logger: kopf.Logger, memo: kopf.Memo, **_: Any
) -> None:
    namespace = body.metadata.namespace
    service = body.metadata.labels[SERVICE_LABEL]
    context: Context = memo.context
    stamped = body.metadata.annotations.get(HASH_ANNOTATION)  # from the pod template, when the operator stamped it
    found = await context.injections.find(namespace or "", service, stamped)
    if not found:
        message = pod.unknown_service_warning(service, namespace or "")
        patch.metadata.annotations[WARNING_ANNOTATION] = message
        warnings.append(message)
        logger.warning(message)
        return
    changes = pod.changes(body, found)
    patch.spec["containers"] = changes.containers
    patch.spec["volumes"] = changes.volumes
    if changes.grace_seconds is not None:
        patch.spec["terminationGracePeriodSeconds"] = changes.grace_seconds
    for key, value in changes.annotations.items():
        patch.metadata.annotations[key] = value


def register(registry: kopf.OperatorRegistry) -> None:
    """The pod webhook."""
    kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operation="CREATE",
        labels={SERVICE_LABEL: kopf.PRESENT},
        registry=registry,
    )(inject_settings)
