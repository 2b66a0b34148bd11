"""What others can send: text of any code point (lone surrogates included: valid in JSON, no UTF-8), numbers beyond
float64, JSON of any shape, and AMQP field values of every type py-amqp decodes."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import strategies as st

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
# tables (whose keys may be bytes too).
AMQP_SCALARS = st.one_of(
    st.none(),
    TEXT,
    st.binary(max_size=20),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True, places=None),
    st.booleans(),
    st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(9999, 12, 31)),
)
AMQP_VALUES: st.SearchStrategy[Any] = st.recursive(
    AMQP_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(TEXT, st.binary(max_size=8)), inner, max_size=3)
    ),
    max_leaves=8,
)
