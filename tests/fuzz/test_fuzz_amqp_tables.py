"""Any field table an AMQP client can send in a message's headers — timestamps of any 64-bit value, tables and arrays
nested to any depth, anywhere in it — decodes with the adapter around py-amqp (adapters/broker/amqp_tables.py), and
encodes back to the bytes it came as, so a retried, archived or replayed copy carries its headers unchanged."""

from __future__ import annotations

import contextlib
import struct

from amqp import serialization
from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.adapters.broker import amqp_tables
from tests.fuzz.strategies import FIELD_TABLES


@given(headers=FIELD_TABLES, cut=st.one_of(st.none(), st.integers(min_value=1, max_value=40)))
def test_any_headers_decode_and_encode_back_to_their_bytes_and_cut_short_are_refused_as_py_amqp_does(
    headers: bytes, cut: int | None
) -> None:
    """A table cut short (its sizes say more than there is) is refused as py-amqp refuses one, never for a timestamp's
    range or the nesting (which raised ValueError, OverflowError, OSError or RecursionError)."""
    amqp_tables.install()
    if cut is None:
        [decoded], end = serialization.loads("F", headers, 0)
        assert end == len(headers)
        assert serialization.dumps("F", [decoded]) == headers
        return
    with contextlib.suppress(struct.error, IndexError):
        serialization.loads("F", headers[: max(4, len(headers) - cut)], 0)
