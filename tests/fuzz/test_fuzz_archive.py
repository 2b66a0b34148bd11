"""Any archived message — any body, content type, and headers of every type py-amqp decodes — is described, so that
archive list, replay and purge pass over it and can still act on it: describe returns, its text is what UTF-8, JSON
and a terminal carry, and a replay's headers and a selection take it."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.core import naming
from celery_event_operator.core.archive import messages
from tests.fuzz.strategies import AMQP_VALUES, JSON, TEXT, nested

NOW = 1_800_000_000.0
KNOWN_HEADERS = st.sampled_from(
    [
        "task",
        "id",
        "retries",
        "x-death",
        naming.EXCEPTION_HEADER,
        naming.EXCEPTION_TYPE_HEADER,
        naming.ARCHIVED_AT_HEADER,
    ]
)
HEADERS = st.dictionaries(st.one_of(KNOWN_HEADERS, TEXT), AMQP_VALUES, max_size=6)
# The broker's own x-death: a list of tables, which a producer may imitate with any values.
X_DEATH = st.lists(
    st.dictionaries(st.sampled_from(["reason", "queue", "time", "count"]), AMQP_VALUES, max_size=4), max_size=2
)
TASK_HEADERS = st.fixed_dictionaries(
    {"task": AMQP_VALUES, "id": AMQP_VALUES}, optional={"retries": AMQP_VALUES, "x-death": X_DEATH}
)
BODIES = st.one_of(
    st.binary(max_size=80),
    JSON.map(lambda value: json.dumps(value).encode()),
    st.tuples(JSON, JSON, JSON).map(lambda parts: json.dumps(list(parts)).encode()),  # protocol 2's shape
    st.integers(min_value=500, max_value=100_000).map(nested),
)
PROPERTIES = st.fixed_dictionaries(
    {}, optional={"content_type": AMQP_VALUES, "message_id": AMQP_VALUES, "application_headers": AMQP_VALUES}
)


@given(
    body=BODIES,
    headers=st.one_of(HEADERS, TASK_HEADERS, st.builds(lambda a, b: {**a, **b}, HEADERS, TASK_HEADERS)),
    properties=PROPERTIES,
    routing_key=TEXT,
)
def test_any_archived_message_is_described_and_can_be_acted_on(
    body: bytes, headers: dict[Any, Any], properties: dict[str, Any], routing_key: str
) -> None:
    item = messages.describe(0, body, headers, properties, routing_key)
    for field in dataclasses.fields(item):
        value = getattr(item, field.name)
        if isinstance(value, str):
            value.encode("utf-8")  # what a terminal, a log and the API carry: no lone surrogate
    json.dumps(item.as_json(NOW), allow_nan=False)  # archive list --json, a replay's status
    messages.table([item], NOW).encode("utf-8")
    replayed = messages.replay_headers(headers)
    assert not messages.RESET_HEADERS & replayed.keys()
    messages.Selection(
        events=frozenset({routing_key}), exception_types=frozenset({"E"}), archived_since=0.0, started_at=NOW
    ).matches(item)
