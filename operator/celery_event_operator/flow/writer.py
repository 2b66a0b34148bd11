"""The one writer of a resource's status and remembered annotations, for services and replays alike: it sends only
what the resource does not show yet, so a resource at rest costs no API writes."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from celery_event_operator.core.errors import KubeError

# A field sent and not yet seen back in the body is sent again only after this long.
RESEND_SECONDS = 10.0

Annotate = Callable[[dict[str, str]], None]
# A resource's status patch, or its annotations' (namespace, name, what to send).
PatchStatus = Callable[[str, str, dict[str, Any]], Awaitable[None]]
PatchAnnotations = Callable[[str, str, dict[str, str]], Awaitable[None]]


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
    def __init__(
        self,
        patch_status: PatchStatus,
        patch_annotations: PatchAnnotations | None,
        namespace: str,
        name: str,
        logger: logging.Logger | Any,
    ) -> None:
        self._patch_status = patch_status
        self._patch_annotations = patch_annotations  # None: a kind whose writer remembers nothing in annotations
        self._namespace = namespace
        self._name = name
        self._logger = logger
        self._sent: dict[str, tuple[Any, float]] = {}  # status fields written: value, when
        self._annotations_sent: dict[str, tuple[Any, float]] = {}

    async def write(
        self,
        body: Mapping[str, Any],
        status: Mapping[str, Any],
        annotations: Mapping[str, str] | None = None,
        annotate: Annotate | None = None,
    ) -> bool:
        """Patch the status fields that differ from what the resource shows (and from what was just sent);
        annotations go to `annotate` when given (a change handler's own patch: one write less). False when the API
        refused the write (all is sent again next time)."""
        now = time.monotonic()
        changed = unseen(status, body.get("status") or {}, self._sent, now)
        annotations_changed = unseen(
            annotations or {}, (body.get("metadata") or {}).get("annotations") or {}, self._annotations_sent, now
        )
        try:
            if changed:
                await self._patch_status(self._namespace, self._name, changed)
                self._sent |= {field: (value, now) for field, value in changed.items()}
            if annotations_changed and annotate is not None:
                annotate(annotations_changed)
            elif annotations_changed:
                if self._patch_annotations is None:
                    raise TypeError(f"annotations of {self._namespace}/{self._name} have no writer")
                await self._patch_annotations(self._namespace, self._name, annotations_changed)
            self._annotations_sent |= {key: (value, now) for key, value in annotations_changed.items()}
        except KubeError as exc:
            self._logger.warning("status of %s/%s not written: %s", self._namespace, self._name, exc)
            self._sent.clear()
            return False
        return True
