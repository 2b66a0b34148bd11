"""Events about a resource, posted through kopf (and logged): one definition for every handler module."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import kopf

from celery_event_operator.core.service.conclusion import EventNote


def events_poster(body: kopf.Body, logger: kopf.Logger) -> Callable[[Iterable[EventNote]], None]:
    def post(notes: Iterable[EventNote]) -> None:
        for note in notes:
            kopf.event(body, type=note.type, reason=note.reason, message=note.message)
            (logger.warning if note.type == "Warning" else logger.info)("%s: %s", note.reason, note.message)

    return post
