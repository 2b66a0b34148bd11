"""The labelled pods of the namespaces the operator watches (pure): what a listing and each watch event change,
and which pods are gone."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.core.api.metadata import DELETION_COST_ANNOTATION, SERVICE_LABEL
from celery_event_operator.core.injection.pod import carried_hash
from celery_event_operator.core.service.pods import WorkerPod, template_of


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A pod labelled with a service, as an API object says it: `pod` None while it terminates (no longer one of
    the service's workers)."""

    namespace: str
    name: str
    service: str
    pod: WorkerPod | None


def labelled(obj: Mapping[str, Any]) -> Labelled | None:
    """A listed or watched pod object read (None: not a service's pod, or not a pod object at all)."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    labels, name, namespace = meta.get("labels") or {}, meta.get("name"), meta.get("namespace") or ""
    service = labels.get(SERVICE_LABEL) if isinstance(labels, Mapping) else None
    if not isinstance(name, str) or not isinstance(service, str) or not isinstance(namespace, str):
        return None
    if meta.get("deletionTimestamp"):
        return Labelled(namespace, name, service, None)
    annotations, spec, status = meta.get("annotations") or {}, obj.get("spec") or {}, obj.get("status") or {}
    pod = WorkerPod(
        name,
        carried_hash(annotations, spec.get("volumes") or []),
        ip=status.get("podIP") or None,
        running=status.get("phase") == "Running",
        deletion_cost=annotations.get(DELETION_COST_ANNOTATION),
        template=template_of(labels),
    )
    return Labelled(namespace, name, service, pod)


class WatchedPods:
    """The labelled pods of the namespaces listed and watched: a listing replaces a namespace's (or every, for a
    cluster-wide watch) pods; each event changes one. Each change says which pods are gone (their metric series go)."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, str], Labelled] = {}  # (namespace, pod) → it
        self._of: dict[tuple[str, str], dict[str, WorkerPod]] = {}  # (namespace, service) → its live pods

    def of(self, namespace: str, service: str) -> list[WorkerPod]:
        return list(self._of.get((namespace, service), {}).values())

    def listed(self, namespace: str | None, objects: Iterable[Mapping[str, Any]]) -> list[Labelled]:
        """A listing of `namespace` (None: of every namespace) replaces what was known of it; the pods gone."""
        now = {(found.namespace, found.name): found for obj in objects if (found := labelled(obj)) is not None}
        gone = [known for key, known in self._found.items() if key not in now and namespace in (None, known.namespace)]
        for known in gone:
            self._forget(known)
        for found in now.values():
            self._keep(found)
        return gone

    def changed(self, kind: str, obj: Mapping[str, Any]) -> Labelled | None:
        """A watch event (ADDED, MODIFIED, DELETED); the pod when it is gone. A label-selected watch also says
        DELETED, with the object as it was, when a pod loses its label: the API server tells it from a deletion in
        no way, so such a pod is taken as gone too (its series go; its worker, if it runs on, is no longer counted)."""
        if kind == "DELETED":
            meta = obj.get("metadata")
            key = (str(meta.get("namespace") or ""), str(meta.get("name"))) if isinstance(meta, Mapping) else None
            known = self._found.get(key) if key is not None else None
            if known is not None:
                self._forget(known)
            return known
        found = labelled(obj)
        if found is not None:
            self._keep(found)
        return None

    def _keep(self, found: Labelled) -> None:
        known = self._found.get((found.namespace, found.name))
        if known is not None and known.service != found.service:
            self._forget(known)  # relabelled: no longer the other service's
        self._found[(found.namespace, found.name)] = found
        if found.pod is not None:
            self._of.setdefault((found.namespace, found.service), {})[found.name] = found.pod
        else:
            self._drop(found)

    def _drop(self, known: Labelled) -> None:
        pods = self._of.get((known.namespace, known.service))
        if pods is not None:
            pods.pop(known.name, None)
            if not pods:
                del self._of[(known.namespace, known.service)]

    def _forget(self, known: Labelled) -> None:
        self._found.pop((known.namespace, known.name), None)
        self._drop(known)
