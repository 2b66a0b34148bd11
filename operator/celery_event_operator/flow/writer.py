"""The one writer of a resource's status and remembered annotations: it sends only what the resource does not
show yet, so a service at rest costs no API writes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from celery_event_operator.core.errors import KubeError
from celery_event_operator.flow.ports import ClusterAccess

# A field sent and not yet seen back in the body is sent again only after this long.
RESEND_SECONDS = 10.0

Annotate = Callable[[dict[str, str]], None]


def unseen(
    wanted: Mapping[str, Any], observed: Mapping[str, Any], sent: dict[str, tuple[Any, float]], now: float
) -> dict[str, Any]:
    """The fields of `wanted` the resource does not show, except those sent a moment ago (the watch has not
    brought them back yet); what the resource shows is forgotten from `sent`."""
    changed = {}
    for field, value in wanted.items():
        if observed.get(field) == value:
            sent.pop(field, None)
            continue
        previous = sent.get(field)
        if previous is not None and previous[0] == value and now - previous[1] < RESEND_SECONDS:
            continue
        changed[field] = value
    return changed


class StatusWriter:
    def __init__(self, cluster: ClusterAccess, namespace: str, name: str, logger: logging.Logger | Any) -> None:
        self._cluster = cluster
        self._namespace = namespace
        self._name = name
        self._logger = logger
        self._sent: dict[str, tuple[Any, float]] = {}  # status fields written: value, when
        self._annotations_sent: dict[str, tuple[Any, float]] = {}

    async def write(
        self,
        body: Mapping[str, Any],
        status: Mapping[str, Any],
        annotations: Mapping[str, str],
        annotate: Annotate | None = None,
    ) -> None:
        """Patch the status fields that differ from what the resource shows (and from what was just sent);
        annotations go to `annotate` when given (a change handler's own patch: one write less)."""
        now = time.monotonic()
        changed = unseen(status, body.get("status") or {}, self._sent, now)
        annotations_changed = unseen(
            annotations, (body.get("metadata") or {}).get("annotations") or {}, self._annotations_sent, now
        )
        try:
            if changed:
                await self._cluster.patch_status(self._namespace, self._name, changed)
                self._sent |= {field: (value, now) for field, value in changed.items()}
            if annotations_changed and annotate is not None:
                annotate(annotations_changed)
            elif annotations_changed:
                await self._cluster.annotate(self._namespace, self._name, annotations_changed)
            self._annotations_sent |= {key: (value, now) for key, value in annotations_changed.items()}
        except KubeError as exc:
            self._logger.warning("status of %s/%s not written: %s", self._namespace, self._name, exc)
            self._sent.clear()
