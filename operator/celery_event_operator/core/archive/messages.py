"""What an archived message is, for people (pure): Celery task messages (protocol v2), raw JSON
events, and anything else, which is shown as unparseable and never dropped.

Anyone who may publish to a service's events exchange writes what the archive holds (undecodable and unknown-task
messages are archived at once, with their headers as published), so any body and any header of any type is
described: what cannot be read is said in the description, never raised — an exception would stop every list,
replay and purge at that message.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from celery_event_operator.core.naming import (
    ARCHIVED_AT_HEADER,
    EXCEPTION_HEADER,
    EXCEPTION_TYPE_HEADER,
    PUBLISHED_AT_HEADER,
)

RESET_HEADERS = frozenset(
    {
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        EXCEPTION_HEADER,
        EXCEPTION_TYPE_HEADER,
        ARCHIVED_AT_HEADER,
        PUBLISHED_AT_HEADER,  # a replayed copy's wait begins at its replay, not at the original's publish
        "x-delivery-count",
    }
)


@dataclasses.dataclass(frozen=True)
class Archived:
    position: int  # 0 = the oldest, as the queue holds them
    event: str  # the routing key the message was archived with = the event name
    kind: str  # "celery", "json" or "unparseable"
    task_id: str | None
    attempts: int | None
    exception: str | None
    exception_type: str | None  # the exception's class name, as the runtime records it
    archived_at: float | None  # unix time
    summary: str  # arguments, or what the body is

    def age(self, now: float) -> float | None:
        return None if self.archived_at is None else max(0.0, now - self.archived_at)

    def as_json(self, now: float) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "age_seconds": self.age(now)}


def _archived_at(headers: Mapping[str, Any]) -> float | None:
    if ARCHIVED_AT_HEADER in headers:
        return _seconds(headers[ARCHIVED_AT_HEADER])
    for death in _deaths(headers) or ():  # dead-lettered by the broker (quorum delivery limit)
        moment = death.get("time")
        if isinstance(moment, datetime.datetime):
            try:
                return _seconds(moment.timestamp())
            except (OverflowError, ValueError, OSError):  # a naive time beyond the platform's
                return None
    return None


def _seconds(value: Any) -> float | None:
    """A unix time, when `value` is a finite one."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) else None


def _deaths(headers: Mapping[str, Any]) -> list[Mapping[str, Any]] | None:
    """The broker's x-death records (a list of tables); None when the header holds something else."""
    deaths = headers.get("x-death") or []
    if isinstance(deaths, list) and all(isinstance(death, Mapping) for death in deaths):
        return deaths
    return None


def _exception(headers: Mapping[str, Any]) -> str | None:
    if EXCEPTION_HEADER in headers:
        return _shown(headers[EXCEPTION_HEADER])
    deaths = _deaths(headers)
    if deaths is None:
        return "unreadable x-death header"
    if deaths:
        return f"dead-lettered by the broker: {_shown(deaths[0].get('reason'))} from {_shown(deaths[0].get('queue'))}"
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _shown(value: Any) -> str:
    """Text for people (a terminal, JSON, a status): UTF-8 can carry it (a lone surrogate, valid in JSON, becomes
    U+FFFD), and any value has one (an integer of more digits than Python converts is named by its type)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except ValueError:
        text = f"<{type(value).__name__}>"
    return _SURROGATE.sub("\ufffd", text)


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, default=str, separators=(",", ":"))
    except (ValueError, RecursionError):  # an integer beyond Python's conversion limit; nesting at the limit
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe(
    position: int, body: bytes, headers: Mapping[str, Any], properties: Mapping[str, Any], routing_key: str
) -> Archived:
    headers = dict(headers or {})

    def archived(kind: str, task_id: Any, attempts: int | None, summary: str) -> Archived:
        return Archived(
            position=position,
            event=_shown(routing_key),
            kind=kind,
            task_id=_text(task_id),
            attempts=attempts,
            exception=_exception(headers),
            exception_type=_text(headers.get(EXCEPTION_TYPE_HEADER)),
            archived_at=_archived_at(headers),
            summary=_shown(summary),
        )

    content_type = _shown(properties.get("content_type") or "unknown content type")
    try:
        decoded = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return archived("unparseable", properties.get("message_id"), None, f"<{len(body)} bytes of {content_type}>")
    except RecursionError:
        return archived(
            "unparseable",
            properties.get("message_id"),
            None,
            f"<{len(body)} bytes of {content_type}: nested too deep to read>",
        )
    if "task" in headers and "id" in headers and isinstance(decoded, list) and len(decoded) == 3:
        args, kwargs, _embed = decoded
        if isinstance(args, list) and isinstance(kwargs, dict):
            arguments = ", ".join([*(_short(arg) for arg in args), *(f"{k}={_short(v)}" for k, v in kwargs.items())])
        else:
            arguments = f"<unreadable arguments: {_short(decoded, 60)}>"
        return archived(
            "celery", headers["id"], _int(headers.get("retries")), f"{_shown(headers['task'])}({arguments})"
        )
    task_id = properties.get("message_id") or (decoded.get("id") if isinstance(decoded, dict) else None)
    return archived("json", task_id, None, _short(decoded, 120))


def _text(value: Any) -> str | None:
    return None if value is None else _shown(value)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite float
        return None


def replay_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """The headers of a replayed copy: attempt count reset, death and failure history and the original's publish
    time dropped."""
    cleaned = {key: value for key, value in (headers or {}).items() if key not in RESET_HEADERS}
    if "task" in cleaned:
        cleaned["retries"] = 0
    return cleaned


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which archived messages an action takes. Times are unix times; empty sets select everything.

    An age window (`archived_since`, `archived_until`, inclusive) leaves out messages whose archive time is
    unknown. `started_at` leaves out what was archived once the action started (a replayed event that fails
    again is archived again, and must not be taken a second time); a message of unknown time passes it.
    """

    events: frozenset[str] = frozenset()
    exception_types: frozenset[str] = frozenset()
    task_ids: frozenset[str] = frozenset()
    archived_since: float | None = None
    archived_until: float | None = None
    started_at: float | None = None

    @classmethod
    def relative(
        cls,
        *,
        events: Iterable[str] = (),
        exception_types: Iterable[str] = (),
        task_ids: Iterable[str] = (),
        older_than: float | None = None,
        newer_than: float | None = None,
        now: float,
    ) -> Selection:
        """The command line's filter: ages in seconds before `now`."""
        return cls(
            events=frozenset(events),
            exception_types=frozenset(exception_types),
            task_ids=frozenset(task_ids),
            archived_until=None if older_than is None else now - older_than,
            archived_since=None if newer_than is None else now - newer_than,
        )

    @property
    def everything(self) -> bool:
        return self == Selection()

    def before_start(self, item: Archived) -> bool:
        """Archived before the action started (or at an unknown time), whether the filter takes it or not."""
        moment = item.archived_at
        return self.started_at is None or moment is None or moment < self.started_at

    def matches(self, item: Archived) -> bool:
        if self.events and item.event not in self.events:
            return False
        if self.exception_types and item.exception_type not in self.exception_types:
            return False
        if self.task_ids and item.task_id not in self.task_ids:
            return False
        if not self.before_start(item):
            return False
        moment = item.archived_at
        if self.archived_since is not None and (moment is None or moment < self.archived_since):
            return False
        return not (self.archived_until is not None and (moment is None or moment > self.archived_until))


def table(items: list[Archived], now: float) -> str:
    columns = ("#", "EVENT", "TASK ID", "ATTEMPTS", "AGE", "EXCEPTION", "CONTENT")
    rows = [
        (
            str(item.position),
            item.event,
            item.task_id or "-",
            "-" if item.attempts is None else str(item.attempts),
            _human(item.age(now)),
            (item.exception or "-")[:60],
            item.summary,
        )
        for item in items
    ]
    widths = [max([len(column), *(len(row[i]) for row in rows)]) for i, column in enumerate(columns)]
    lines = ["  ".join(column.ljust(width) for column, width in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)


def _human(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
