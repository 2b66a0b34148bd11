"""What a kubelet would give a container of an injected pod: its env and its ConfigMap volume.

The dev mode runs a sample worker on the local machine with it, and the tests run their workers
with it: no kubelet runs without a cluster. Env values are resolved (values, `secretKeyRef`s, the
downward API's `fieldRef`s, `$(VAR)` references) and the settings volume is written to a local
directory that stands in for the mount path.
"""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable
from typing import Any

from celery_event_operator.core.injection.settings import MOUNT_PATH

_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")

SecretReader = Callable[[str, str, str], str]  # namespace, name, key → value
ConfigMapReader = Callable[[str, str], dict[str, str]]  # namespace, name → data


def _field(pod: dict[str, Any], path: str) -> str:
    """The downward API's `metadata.name`, `metadata.namespace`, `status.podIP` and the like."""
    value: Any = pod
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "metadata.namespace" and value is None:
        value = "default"
    return str(value) if value is not None else ""


def container_environment(
    pod: dict[str, Any], read_secret: SecretReader, read_configmap: ConfigMapReader, mount_root: pathlib.Path
) -> dict[str, str]:
    namespace = pod["metadata"].get("namespace") or "default"
    container = pod["spec"]["containers"][0]
    volumes = {volume["name"]: volume for volume in pod["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        configmap = volumes.get(mount["name"], {}).get("configMap")
        if configmap is None or mount["mountPath"] != MOUNT_PATH:
            continue
        mount_root.mkdir(parents=True, exist_ok=True)
        for name, content in read_configmap(namespace, configmap["name"]).items():
            (mount_root / name).write_text(content)
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        source = variable.get("valueFrom") or {}
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = read_secret(namespace, ref["name"], ref["key"])
        elif "fieldRef" in source:
            value = _field(pod, source["fieldRef"]["fieldPath"])
        else:
            value = _REFERENCE.sub(lambda match: env.get(match.group(1), match.group(0)), variable.get("value", ""))
        env[variable["name"]] = value.replace(MOUNT_PATH, str(mount_root))
    return env
