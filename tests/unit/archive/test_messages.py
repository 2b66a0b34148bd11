"""What the archive tools show of each kind of archived message (pure)."""

from __future__ import annotations

import datetime
import json

import pytest

from celery_event_operator import cli
from celery_event_operator.core import naming
from celery_event_operator.core.archive import messages

NOW = 1_800_000_000.0


def test_celery_task_message() -> None:
    headers = {
        "task": "orders.order.created",
        "id": "t-1",
        "retries": 4,
        naming.EXCEPTION_HEADER: "KeyError: 'sku'",
        naming.ARCHIVED_AT_HEADER: NOW - 120,
    }
    body = json.dumps([[42], {"amount": 5}, {"callbacks": None}]).encode()
    item = messages.describe(3, body, headers, {"content_type": "application/json"}, "orders.order.created")
    assert (item.kind, item.task_id, item.attempts, item.event) == ("celery", "t-1", 4, "orders.order.created")
    assert item.summary == "orders.order.created(42, amount=5)"
    assert item.exception == "KeyError: 'sku'"
    assert item.age(NOW) == 120


def test_broker_dead_lettered_message_tells_why() -> None:
    moment = datetime.datetime.fromtimestamp(NOW - 60, tz=datetime.UTC)
    headers = {
        "task": "e",
        "id": "t",
        "retries": 0,
        "x-death": [{"reason": "delivery_limit", "queue": "billing.e", "time": moment, "count": 1}],
    }
    item = messages.describe(0, b"[[], {}, {}]", headers, {}, "e")
    assert item.exception == "dead-lettered by the broker: delivery_limit from billing.e"
    assert item.age(NOW) == 60


def test_raw_json_event_and_unparseable_message_are_shown_not_dropped() -> None:
    raw = messages.describe(0, b'{"id": "e-7", "order": 1}', {}, {}, "orders.order.created")
    assert (raw.kind, raw.task_id, raw.attempts) == ("json", "e-7", None)
    assert raw.age(NOW) is None
    garbage = messages.describe(1, b"\x00\xff\x10", {}, {"content_type": "application/x-msgpack"}, "x")
    assert garbage.kind == "unparseable"
    assert garbage.summary == "<3 bytes of application/x-msgpack>"
    assert "?" in messages.table([raw, garbage], NOW)


def test_replayed_copy_has_its_attempts_history_and_publish_time_reset() -> None:
    headers = {
        "task": "e",
        "id": "t",
        "retries": 4,
        "x-death": [{}],
        naming.EXCEPTION_HEADER: "x",
        naming.EXCEPTION_TYPE_HEADER: "X",
        naming.ARCHIVED_AT_HEADER: 1.0,
        naming.PUBLISHED_AT_HEADER: 0.5,  # the copy's wait counts from its receipt, not the original's publish
        "custom": "kept",
    }
    assert messages.replay_headers(headers) == {"task": "e", "id": "t", "retries": 0, "custom": "kept"}
    assert messages.replay_headers({"x-death": [{}]}) == {}, "a raw event gets no Celery header"


@pytest.mark.parametrize(
    ("event", "older", "newer", "expected"),
    [
        pytest.param(None, None, None, True, id="everything"),
        pytest.param("e", None, None, True, id="this-event"),
        pytest.param("other", None, None, False, id="other-event"),
        pytest.param(None, 60, None, True, id="older-than-a-minute"),
        pytest.param(None, 600, None, False, id="not-older-than-ten-minutes"),
        pytest.param(None, None, 60, False, id="not-newer-than-a-minute"),
    ],
)
def test_selection(event: str | None, older: float | None, newer: float | None, expected: bool) -> None:
    item = messages.describe(0, b"{}", {naming.ARCHIVED_AT_HEADER: NOW - 120}, {}, "e")
    selection = messages.Selection.relative(
        events=[event] if event else [], older_than=older, newer_than=newer, now=NOW
    )
    assert selection.matches(item) is expected


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("2h", 7200), ("1d", 86400)])
def test_durations(text: str, seconds: float) -> None:
    assert cli._duration(text) == seconds


def _archived(
    event: str = "e", exception_type: str | None = "TypeError", at: float | None = NOW - 120
) -> messages.Archived:
    headers: dict[str, object] = {"task": event, "id": f"id-{event}"}
    if exception_type is not None:
        headers[naming.EXCEPTION_TYPE_HEADER] = exception_type
    if at is not None:
        headers[naming.ARCHIVED_AT_HEADER] = at
    return messages.describe(0, b"[[], {}, {}]", headers, {}, event)


@pytest.mark.parametrize(
    ("selection", "item", "expected"),
    [
        pytest.param(messages.Selection(), _archived(), True, id="everything"),
        pytest.param(messages.Selection(events=frozenset({"e", "f"})), _archived("f"), True, id="one-of-the-events"),
        pytest.param(messages.Selection(exception_types=frozenset({"TypeError"})), _archived(), True, id="exception"),
        pytest.param(
            messages.Selection(exception_types=frozenset({"KeyError"})), _archived(), False, id="other-exception"
        ),
        pytest.param(
            messages.Selection(exception_types=frozenset({"KeyError"})),
            _archived(exception_type=None),
            False,
            id="no-exception-recorded",
        ),
        pytest.param(messages.Selection(task_ids=frozenset({"id-e"})), _archived(), True, id="task-id"),
        pytest.param(messages.Selection(task_ids=frozenset({"id-x"})), _archived(), False, id="other-task-id"),
        pytest.param(messages.Selection(started_at=NOW - 121), _archived(), False, id="archived-after-the-start"),
        pytest.param(messages.Selection(started_at=NOW - 120), _archived(), False, id="archived-as-it-started"),
        pytest.param(messages.Selection(started_at=NOW - 119), _archived(), True, id="archived-before-the-start"),
        pytest.param(messages.Selection(started_at=NOW), _archived(at=None), True, id="unknown-time-passes-start"),
        pytest.param(messages.Selection(archived_until=NOW), _archived(at=None), False, id="unknown-time-no-window"),
        pytest.param(
            messages.Selection(archived_since=NOW - 120, archived_until=NOW - 120), _archived(), True, id="inclusive"
        ),
    ],
)
def test_selection_of_a_replay(selection: messages.Selection, item: messages.Archived, expected: bool) -> None:
    assert selection.matches(item) is expected


def test_the_exception_class_is_read() -> None:
    assert _archived().exception_type == "TypeError"
    assert _archived(exception_type=None).exception_type is None


TASK_HEADERS = {"task": "orders.order.created", "id": "t-1", "retries": 2}


@pytest.mark.parametrize(
    ("body", "headers", "field", "shown"),
    [
        pytest.param(b"[" * 100_000 + b"]" * 100_000, {}, "summary", "nested too deep to read", id="deep-body"),
        pytest.param(
            b"[5, {}, {}]",
            TASK_HEADERS,
            "summary",
            "orders.order.created(<unreadable arguments: [5,{},{}]>)",
            id="args-not-a-list",
        ),
        pytest.param(
            b"[[], [1], {}]",
            TASK_HEADERS,
            "summary",
            "orders.order.created(<unreadable arguments: [[],[1],{}]>)",
            id="kwargs-not-an-object",
        ),
        pytest.param(b"[[], {}, {}]", {**TASK_HEADERS, "retries": float("inf")}, "attempts", None, id="retries-inf"),
        pytest.param(
            b"[[], {}, {}]", {**TASK_HEADERS, "x-death": "x"}, "exception", "unreadable x-death", id="x-death-text"
        ),
        pytest.param(
            b"[[], {}, {}]", {**TASK_HEADERS, "x-death": 7}, "exception", "unreadable x-death", id="x-death-number"
        ),
        pytest.param(
            b"[[], {}, {}]", {**TASK_HEADERS, "x-death": [1, "x"]}, "exception", "unreadable x-death", id="x-death-list"
        ),
        pytest.param(b"{}", {naming.ARCHIVED_AT_HEADER: "inf"}, "archived_at", None, id="archived-at-infinite"),
        pytest.param(b'{"id": "\\ud800"}', {}, "task_id", "\ufffd", id="lone-surrogate-id"),
    ],
)
def test_any_archived_message_is_described_and_what_cannot_be_read_is_said(
    body: bytes, headers: dict[str, object], field: str, shown: object
) -> None:
    """Each of these raised out of describe (RecursionError, TypeError, AttributeError, OverflowError): the walk put
    the message back, so every later list, replay and purge stopped at it again."""
    item = messages.describe(0, body, headers, {"content_type": "application/json"}, "orders.order.created")
    found = getattr(item, field)
    assert shown in found if isinstance(shown, str) else found == shown
    assert json.dumps(item.as_json(NOW), allow_nan=False).encode()
    assert messages.table([item], NOW).encode()
