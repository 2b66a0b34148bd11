"""The adapter around py-amqp's table decoding (adapters/broker/amqp_tables.py), and what it relies on in py-amqp.

The first tests check py-amqp itself on the raw bytes: when one of them fails, py-amqp changed underneath — it decodes
such values now (the adapter may go), or it no longer looks its item functions up by name (the adapter no longer
reaches every table: wrap what replaced them).
"""

from __future__ import annotations

import datetime
import struct
import subprocess
import sys

import amqp.channel
import amqp.connection
import pytest
from amqp import serialization

from celery_event_operator.adapters.broker import amqp_tables
from tests.support.raw_headers import LAST_DATETIME_SECOND, OUT_OF_RANGE, headers_table, nested_item, timestamp_item

OUT_OF_RANGE_PARAMS = [pytest.param(seconds, id=name) for name, seconds in OUT_OF_RANGE.items()]
DEEP = 3000  # a header's nesting that RabbitMQ 4.3 routed as it came (a few kilobytes)


@pytest.fixture
def py_amqp_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-amqp's functions alone (another test's imports may have installed the adapter in this process: py-amqp's
    recursion then goes through it)."""
    monkeypatch.setattr(serialization, "_read_item", amqp_tables.PY_AMQP_READ_ITEM)
    monkeypatch.setattr(serialization, "_write_item", amqp_tables.PY_AMQP_WRITE_ITEM)


@pytest.fixture
def adapted() -> None:
    """The adapter installed (other tests' imports may have installed it already: it is idempotent)."""
    amqp_tables.install()


def item(key_and_value: bytes) -> bytes:
    """The bytes of one table entry's value (after its key), as `_read_item` takes them."""
    return key_and_value[1 + key_and_value[0] :]


@pytest.mark.usefixtures("py_amqp_own")
@pytest.mark.parametrize("seconds", OUT_OF_RANGE_PARAMS)
def test_py_amqp_itself_still_raises_on_a_timestamp_beyond_datetime(seconds: int) -> None:
    """When this fails, py-amqp decodes such timestamps itself now: check what it gives, and drop the adapter's part."""
    with pytest.raises((ValueError, OverflowError, OSError)):
        amqp_tables.PY_AMQP_READ_ITEM(item(timestamp_item("k", seconds)), 0)


@pytest.mark.usefixtures("py_amqp_own")
def test_py_amqp_itself_still_recurses_into_a_deep_table() -> None:
    with pytest.raises(RecursionError):
        amqp_tables.PY_AMQP_READ_ITEM(item(nested_item("k", DEEP)), 0)


def test_no_method_py_amqp_receives_has_a_timestamp_argument() -> None:
    """The adapter wraps the table items only: `loads`' own 'T' (a method's argument) is never read from the wire."""
    signatures = {
        method: spec.args
        for cls in (amqp.channel.Channel, amqp.connection.Connection)
        for method, spec in cls._METHODS.items()
    }
    assert len(signatures) > 30
    assert [method for method, args in signatures.items() if args and "T" in args] == []


@pytest.mark.usefixtures("adapted")
@pytest.mark.parametrize("seconds", OUT_OF_RANGE_PARAMS)
def test_a_timestamp_beyond_datetime_decodes_as_its_seconds_and_encodes_back_to_the_same_bytes(seconds: int) -> None:
    """Through py-amqp's own entry points: `loads` and `dumps` must still look the item functions up by name."""
    table = headers_table({"task": "t", "id": "1"}, {"stamped": seconds})
    [headers], end = serialization.loads("F", table, 0)
    assert end == len(table)
    assert headers == {"task": "t", "id": "1", "stamped": seconds}
    assert isinstance(headers["stamped"], amqp_tables.OutOfRangeTimestamp)
    assert serialization.dumps("F", [headers]) == table
    assert repr(headers["stamped"]) == f"OutOfRangeTimestamp({seconds})"


@pytest.mark.usefixtures("adapted")
def test_a_timestamp_within_datetime_decodes_as_py_amqp_decodes_it() -> None:
    table = headers_table({}, {"first": 0, "last": LAST_DATETIME_SECOND})
    [headers], _ = serialization.loads("F", table, 0)
    assert headers == {"first": datetime.datetime(1970, 1, 1), "last": datetime.datetime(9999, 12, 31, 23, 59, 59)}
    assert serialization.dumps("F", [headers]) == table


@pytest.mark.usefixtures("adapted")
def test_a_table_nested_too_deep_decodes_as_its_bytes_and_encodes_back_to_them() -> None:
    table = headers_table({"task": "t"}, raw=nested_item("deep", DEEP))
    [headers], _ = serialization.loads("F", table, 0)
    level, depth = headers["deep"], 1
    while isinstance(level, dict):
        [level] = level.values()
        depth += 1
    assert isinstance(level, amqp_tables.NestedTooDeep)
    assert depth == amqp_tables.MAX_NESTING + 1
    assert serialization.dumps("F", [headers]) == table


@pytest.mark.usefixtures("adapted")
def test_a_table_as_deep_as_allowed_decodes_as_py_amqp_decodes_it() -> None:
    table = headers_table({}, raw=nested_item("deep", amqp_tables.MAX_NESTING))
    expected: dict[str, object] = {}
    for _ in range(amqp_tables.MAX_NESTING - 1):
        expected = {"": expected}
    assert serialization.loads("F", table, 0) == ([{"deep": expected}], len(table))


@pytest.mark.usefixtures("adapted")
def test_x_death_records_decode_as_before() -> None:
    """RabbitMQ's own nesting (headers > x-death array > its tables, with timestamps) is far within the limit."""
    death = {"count": 1, "reason": "rejected", "queue": "q", "time": datetime.datetime(2026, 1, 2, 3, 4, 5)}
    table = serialization.dumps("F", [{"x-death": [death, death]}])
    assert serialization.loads("F", table, 0)[0] == [{"x-death": [death, death]}]


@pytest.mark.usefixtures("adapted")
def test_a_message_s_properties_decode_and_encode_back() -> None:
    """The path of every delivery: the content header's properties (decode_properties_basic), and a copy of the
    message published again (a retry, the archive, a replay)."""
    table = headers_table({"task": "t"}, {"stamped": 2**63 - 1}, nested_item("deep", DEEP))
    properties = struct.pack(">H", 0x2000) + table
    decoded, end = serialization.decode_properties_basic(properties, 0)
    assert end == len(properties)
    copy = amqp.Message(b"", application_headers=decoded["application_headers"])
    assert copy._serialize_properties() == properties


@pytest.mark.usefixtures("adapted")
@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(timestamp_item("k", 2**63 - 1)[:-3], id="timestamp"),
        pytest.param(nested_item("k", DEEP)[:-3], id="nested"),
    ],
)
def test_a_value_cut_short_still_raises_struct_error(cut: bytes) -> None:
    """As py-amqp does for any value cut short (a framing error to whoever reads): the adapter reads no further."""
    with pytest.raises(struct.error):
        serialization.loads("F", struct.pack(">I", len(cut)) + cut, 0)


def test_an_out_of_range_timestamp_is_a_64_bit_number() -> None:
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        amqp_tables.OutOfRangeTimestamp(2**64)


@pytest.mark.parametrize(
    "module",
    [
        "celery_event_operator.runtime",
        "celery_event_operator.adapters.archive.operations",
        "celery_event_operator.adapters.broker.control",
    ],
)
def test_what_decodes_with_py_amqp_installs_the_adapter(module: str) -> None:
    """The worker's app, the archive walk and the control connection (server properties) install it on import."""
    check = (
        f"import {module}\n"
        "from celery_event_operator.adapters.broker import amqp_tables\n"
        "assert amqp_tables.installed()\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=60)
