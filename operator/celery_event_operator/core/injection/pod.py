"""What the admission webhook adds to a worker pod (pure).

Everything is appended: a user's env, volumes and mounts are never changed or removed. A variable the
user already set keeps the user's value, except PYTHONPATH, which is extended (a later entry that
refers to the earlier one: the kubelet expands `$(PYTHONPATH)` from it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.core.api.metadata import HASH_ANNOTATION
from celery_event_operator.core.injection.settings import LOADER_MODULE, MOUNT_PATH, SETTINGS_FILE
from celery_event_operator.core.naming import POD_NAME_ENV, POD_NAMESPACE_ENV, SOFT_SHUTDOWN_ENV

VOLUME_NAME = "celeryevents-settings"
DEFAULT_GRACE_SECONDS = 30  # Kubernetes' default terminationGracePeriodSeconds
SHUTDOWN_MARGIN_SECONDS = 5


@dataclasses.dataclass(frozen=True)
class Injection:
    """What a service's pods get: where the broker URL is, which settings, and how long they may take to stop."""

    service: str
    secret_name: str
    secret_key: str
    configmap: str
    config_hash: str
    grace_seconds: int | None = None  # the service's grace period for its tasks (its status; None: not known yet)


@dataclasses.dataclass(frozen=True)
class PodChanges:
    containers: list[dict[str, Any]]
    volumes: list[dict[str, Any]]
    annotations: dict[str, str]
    grace_seconds: int | None = None  # the pod's terminationGracePeriodSeconds raised to this (None: as it is)


def grace_seconds(pod: Mapping[str, Any]) -> int:
    """The pod's own grace period (Kubernetes' default when it sets none)."""
    grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return grace if isinstance(grace, int) and grace >= 0 else DEFAULT_GRACE_SECONDS


def soft_shutdown_seconds(grace: int) -> int:
    """How long a worker whose SIGTERM the pod maps to Celery's cold shutdown (REMAP_SIGTERM=SIGQUIT, the user's
    choice) lets running tasks finish: the grace period, less a margin for the cold shutdown to hand what is left
    back to the broker before the kubelet's SIGKILL."""
    return max(1, grace - SHUTDOWN_MARGIN_SECONDS) if grace > 1 else 0


def _environment(injection: Injection, grace: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "CELERY_BROKER_URL",
            "valueFrom": {"secretKeyRef": {"name": injection.secret_name, "key": injection.secret_key}},
        },
        # A plain Celery(...) app reads its settings from this module with the default loader.
        {"name": "CELERY_LOADER", "value": "default"},
        {"name": "CELERY_CONFIG_MODULE", "value": LOADER_MODULE},
        {"name": "CELERY_EVENTS_SETTINGS", "value": f"{MOUNT_PATH}/{SETTINGS_FILE}"},
        # `celery worker` reads its options from CELERY_* variables: no change to the command.
        # Mingle and gossip broadcast to every worker (N² messages); heartbeats stay on.
        {"name": "CELERY_WORKER_WITHOUT_MINGLE", "value": "1"},
        {"name": "CELERY_WORKER_WITHOUT_GOSSIP", "value": "1"},
        # A rollout, a scale-in or an eviction sends SIGTERM, then SIGKILL after the grace period: Celery's warm
        # shutdown takes no new task and exits once the ones it runs ended, and the grace period covers them. Only
        # where the pod maps SIGTERM to the cold shutdown itself, its soft shutdown lets them finish first.
        {"name": SOFT_SHUTDOWN_ENV, "value": str(soft_shutdown_seconds(grace))},
        # The loader names the worker's broker connections after its pod (see naming.pod_connection_name).
        {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": POD_NAMESPACE_ENV, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]


def _container(container: Mapping[str, Any], injection: Injection, grace: int) -> dict[str, Any]:
    result = copy.deepcopy(dict(container))
    env: list[dict[str, Any]] = result.setdefault("env", [])
    present = {variable.get("name") for variable in env}
    env.extend(variable for variable in _environment(injection, grace) if variable["name"] not in present)
    python_paths = [variable for variable in env if variable.get("name") == "PYTHONPATH"]
    if not python_paths:
        env.append({"name": "PYTHONPATH", "value": MOUNT_PATH})
    elif MOUNT_PATH not in str(python_paths[-1].get("value", "")):
        env.append({"name": "PYTHONPATH", "value": f"$(PYTHONPATH):{MOUNT_PATH}"})
    mounts: list[dict[str, Any]] = result.setdefault("volumeMounts", [])
    if not any(mount.get("mountPath") == MOUNT_PATH or mount.get("name") == VOLUME_NAME for mount in mounts):
        mounts.append({"name": VOLUME_NAME, "mountPath": MOUNT_PATH, "readOnly": True})
    return result


def changes(pod: Mapping[str, Any], injection: Injection) -> PodChanges:
    """The containers and volumes with the injection appended, the annotations to set, and the grace period raised
    to the service's (never lowered: a pod's own longer one stays)."""
    spec = pod.get("spec") or {}
    own = grace_seconds(pod)
    grace = max(own, injection.grace_seconds or 0)
    containers = [_container(container, injection, grace) for container in spec.get("containers") or []]
    volumes = copy.deepcopy(list(spec.get("volumes") or []))
    if not any(volume.get("name") == VOLUME_NAME for volume in volumes):
        volumes.append({"name": VOLUME_NAME, "configMap": {"name": injection.configmap, "defaultMode": 0o444}})
    return PodChanges(containers, volumes, {HASH_ANNOTATION: injection.config_hash}, grace if grace > own else None)


def unknown_service_warning(service: str, namespace: str) -> str:
    return f"no valid CeleryEventService with serviceName {service!r} in namespace {namespace!r}: nothing was injected"


def carried_hash(annotations: Mapping[str, str], volumes: Iterable[Mapping[str, Any]]) -> str | None:
    """The settings hash a pod runs with: its annotation, when it carries the settings volume the webhook adds. A pod
    admitted unchanged while the webhook did not answer (failurePolicy Ignore) has its template's stamp of the same
    annotation and none of the settings: it runs none (and is healed)."""
    if not any(volume.get("name") == VOLUME_NAME for volume in volumes):
        return None
    return annotations.get(HASH_ANNOTATION)
