"""What others can send: text of any code point (lone surrogates included: valid in JSON, no UTF-8), numbers beyond
float64, JSON of any shape, AMQP field values of every type py-amqp decodes (with the runtime's and the operator's
adapter, adapters/broker/amqp_tables.py), and AMQP field tables as any client may send them (bytes)."""

from __future__ import annotations

import datetime
import functools
import struct
from typing import Any

from hypothesis import strategies as st

from celery_event_operator.adapters.broker import amqp_tables
from tests.support.raw_headers import LAST_DATETIME_SECOND, nested_item

# Every code point, surrogates included (hypothesis leaves them out of text by default).
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
# A few characters that mean something to a parser, beside any text.
SYNTAX = st.sampled_from(['"', "\\", "\n", "{", "}", "[", "]", ",", "=", "@", ":", "/", "?", "#", "%", "\ud800", "é"])
TEXT = st.one_of(ANY_TEXT, st.lists(SYNTAX, max_size=6).map("".join))
# Text that valid UTF-8 decodes to (a Secret's value, a resource's JSON as the API server sends it): no lone surrogate.
UTF8_TEXT = st.one_of(st.text(max_size=40), st.lists(SYNTAX.filter(str.isprintable), max_size=6).map("".join))
HUGE_INTEGERS = st.one_of(st.integers(min_value=2**63, max_value=10**400), st.integers(max_value=-(2**63)))
NUMBERS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    HUGE_INTEGERS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
SCALARS = st.one_of(st.none(), NUMBERS, TEXT)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=12,
)


def nested(depth: int) -> bytes:
    """JSON nested `depth` lists deep (past the recursion limit when large)."""
    return b"[" * depth + b"]" * depth


# What py-amqp's field-table decoding gives (serialization._read_item): text, or bytes when it is no UTF-8; every
# integer width; floats and doubles (infinities and NaN included); decimals; booleans; timestamps; void; arrays and
# tables (whose keys may be bytes too); with the adapter, timestamps after year 9999 (their seconds) and what is nested
# deeper than it reads (its bytes).
AMQP_SCALARS = st.one_of(
    st.none(),
    TEXT,
    st.binary(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True, places=None),
    st.booleans(),
    st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(9999, 12, 31)),
    st.integers(min_value=LAST_DATETIME_SECOND + 1, max_value=2**64 - 1).map(amqp_tables.OutOfRangeTimestamp),
    st.binary(max_size=20).map(amqp_tables.NestedTooDeep),
)
AMQP_VALUES: st.SearchStrategy[Any] = st.recursive(
    AMQP_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(TEXT, st.binary(max_size=8)), inner, max_size=3)
    ),
    max_leaves=8,
)


def written(value: Any) -> bytes:
    """A field value as py-amqp's own encoder writes it (type letter and content)."""
    parts: list[bytes] = []
    amqp_tables.PY_AMQP_WRITE_ITEM(value, parts.append, [])
    return b"".join(parts)


@functools.cache
def deep(depth: int) -> bytes:
    """A table holding a table ... `depth` tables in all (type letter and content)."""
    return nested_item("", depth)[1:]


def field_table(entries: list[tuple[bytes, bytes]]) -> bytes:
    content = b"".join(bytes([len(key)]) + key + value for key, value in entries)
    return struct.pack(">I", len(content)) + content


def field_array(values: list[bytes]) -> bytes:
    return struct.pack(">I", len(b"".join(values))) + b"".join(values)


# Field tables as any client may send them, as bytes: values py-amqp's encoder writes (and so writes back the same way
# once decoded), timestamps of any 64-bit value, and tables nested around the adapter's limit and past py-amqp's
# recursion, anywhere (in tables and arrays).
_WRITTEN = st.one_of(
    st.none(),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
).map(written)
_TIMESTAMPS = st.integers(min_value=0, max_value=2**64 - 1).map(lambda seconds: b"T" + struct.pack(">Q", seconds))
_DEEP = st.one_of(st.integers(min_value=1, max_value=amqp_tables.MAX_NESTING + 2), st.sampled_from([1000, 3000])).map(
    deep
)
_KEYS = st.text(max_size=4).map(str.encode)
_FIELD_VALUES: st.SearchStrategy[bytes] = st.recursive(
    st.one_of(_WRITTEN, _TIMESTAMPS, _DEEP),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda values: b"A" + field_array(values)),
        st.lists(st.tuples(_KEYS, inner), max_size=3, unique_by=lambda entry: entry[0]).map(
            lambda entries: b"F" + field_table(entries)
        ),
    ),
    max_leaves=6,
)
FIELD_TABLES = st.lists(st.tuples(_KEYS, _FIELD_VALUES), max_size=6, unique_by=lambda entry: entry[0]).map(field_table)
