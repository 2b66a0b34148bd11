"""The mutating admission webhook: worker pods of a service get its settings injected.

It never blocks pod creation: the webhook configuration says failurePolicy Ignore with a short
timeout, and a pod of an unknown service is admitted unchanged with a warning. The handlers are
registered only by an operator that serves the webhook (`register`): kopf refuses to start with
admission handlers and no server, and without the webhook pods are configured through the runtime.
"""

from __future__ import annotations

from typing import Any

import kopf

from celery_event_operator import service_status
from celery_event_operator.api.models import GROUP, PLURAL, VERSION
from celery_event_operator.errors import InvalidSpecError
from celery_event_operator.injection import pod, settings

WEBHOOK_ID = "inject-celery-settings"


# kopf calls the index on every event of a resource (status writes included): what a generation of a
# resource injects is worked out once.
_injections_by_generation = service_status.GenerationCache[pod.Injection | None]()


def _injection(body: kopf.Body) -> pod.Injection | None:
    try:
        validated = service_status.validate(body)
    except InvalidSpecError:
        return None
    ref = validated.spec.broker.secret_ref
    rendered = settings.render(validated.service_name, validated.spec)
    return pod.Injection(
        service=validated.service_name,
        secret_name=ref.name,
        secret_key=ref.key,
        configmap=settings.configmap_name(validated.service_name),
        config_hash=settings.config_hash(rendered),
    )


def injections(body: kopf.Body, namespace: str | None, **_: Any) -> dict[tuple[str | None, str], pod.Injection]:
    """(namespace, serviceName) → what its pods get; invalid services are not indexed."""
    found = _injections_by_generation.get(body, lambda: _injection(body))
    return {} if found is None else {(namespace, found.service): found}


def inject_settings(
    body: kopf.Body,
    patch: kopf.Patch,
    warnings: list[str],
    logger: kopf.Logger,
    injections: kopf.Index[Any, Any] | None = None,
    **_: Any,
) -> None:
    # `injections` is the index above: kopf passes it by name (the default only satisfies the typing).
    namespace = body.metadata.namespace
    service = body.metadata.labels[settings.SERVICE_LABEL]
    found = list(injections.get((namespace, service), [])) if injections is not None else []
    if not found:
        message = pod.unknown_service_warning(service, namespace or "")
        patch.metadata.annotations[pod.WARNING_ANNOTATION] = message
        warnings.append(message)
        logger.warning(message)
        return
    changes = pod.changes(body, found[-1])
    patch.spec["containers"] = changes.containers
    patch.spec["volumes"] = changes.volumes
    for key, value in changes.annotations.items():
        patch.metadata.annotations[key] = value


def register(registry: kopf.OperatorRegistry) -> None:
    """The index of what each service injects and the pod webhook that uses it."""
    kopf.index(GROUP, VERSION, PLURAL, registry=registry)(injections)
    kopf.on.mutate(
        "v1",
        "pods",
        id=WEBHOOK_ID,
        operation="CREATE",
        labels={settings.SERVICE_LABEL: kopf.PRESENT},
        registry=registry,
    )(inject_settings)
