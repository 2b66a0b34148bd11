"""The events consumer's AMQP frame reader: bodies out of any split of the byte stream."""

from __future__ import annotations

import random
import struct

import pytest
from amqp import serialization

from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.core.monitoring import frames
from tests.support.raw_headers import OUT_OF_RANGE, nested_item, timestamp_item


def frame(kind: int, payload: bytes, channel: int = 1) -> bytes:
    return struct.pack(">BHI", kind, channel, len(payload)) + payload + b"\xce"


def delivery(body: bytes, frame_body_max: int = frames.FRAME_MAX - 8, tag: str = "ctag") -> bytes:
    """basic.deliver, its content header and the body in frames of at most `frame_body_max` bytes."""
    deliver = frames.method_frame(1, frames.BASIC_DELIVER, "sLbss", (tag, 1, False, "S:celeryev", "task.x"))
    header = frame(frames.HEADER, struct.pack(">HHQH", 60, 0, len(body), 0))
    parts = [body[i : i + frame_body_max] for i in range(0, len(body), frame_body_max)]
    return deliver + header + b"".join(frame(frames.BODY, part) for part in parts)


class Recorder:
    """The route of one consumer tag; `reader` routes `ctag` to it (and whatever `routes` adds)."""

    def __init__(self, max_body_bytes: int = 1000, kept_bytes: int = 32) -> None:
        self.bodies: list[bytes] = []
        self.methods: list[tuple[int, frames.MethodId, bytes]] = []
        self.oversized = 0
        self.oversized_parts: list[tuple[bytes, bytes, int]] = []
        self.routes: dict[bytes, frames.Route] = {b"ctag": self}
        self.reader = frames.DeliveryReader(
            self.routes, lambda *method: self.methods.append(method), max_body_bytes, kept_bytes
        )

    def on_body(self, body: bytes) -> None:
        self.bodies.append(body)

    def on_oversized(self, head: bytes, tail: bytes, size: int) -> None:
        self.oversized += 1
        self.oversized_parts.append((head, tail, size))


BODIES = [b'{"type": "task-sent"}', b"", b"x" * 250, b"not json at all", "ünïcode".encode()]


def test_bodies_come_out_whole_and_in_order_from_any_split_of_the_stream() -> None:
    stream = b"".join(delivery(body, frame_body_max=100) for body in BODIES)
    rng = random.Random(3)
    splits = [[1] * len(stream), [7] * len(stream), [len(stream)]] + [
        [rng.randint(1, 40) for _ in range(len(stream))] for _ in range(20)
    ]
    for sizes in splits:
        recorder, position = Recorder(), 0
        for size in sizes:
            recorder.reader.feed(stream[position : position + size])
            position += size
            if position >= len(stream):
                break
        assert recorder.bodies == BODIES, sizes[:5]
        assert recorder.methods == []
        assert recorder.oversized == 0


def test_oversized_body_is_reported_and_skipped_without_disturbing_the_next() -> None:
    recorder = Recorder(max_body_bytes=100)
    recorder.reader.feed(delivery(b"y" * 450, frame_body_max=100) + delivery(b"small") + delivery(b"z" * 101))
    assert recorder.bodies == [b"small"]
    assert recorder.oversized == 2


def test_an_oversized_body_keeps_its_head_and_tail_only() -> None:
    recorder = Recorder(max_body_bytes=100, kept_bytes=10)
    body = b"HEAD-" + b"." * 500 + b"-TAIL"
    recorder.reader.feed(delivery(body, frame_body_max=64))
    assert recorder.oversized_parts == [(body[:10], body[-10:], len(body))]


def test_deliveries_go_to_the_route_of_their_consumer_tag() -> None:
    first, second = Recorder(), Recorder()
    first.routes[b"other"] = second
    first.reader.feed(
        delivery(b"1", tag="ctag") + delivery(b"2", tag="other") + delivery(b"3", tag="gone") + delivery(b"4")
    )
    assert (first.bodies, second.bodies) == ([b"1", b"4"], [b"2"])


def test_other_methods_are_handed_over_and_heartbeats_ignored() -> None:
    cancel = frames.method_frame(1, frames.BASIC_CANCEL, "sb", ("ctag", False))
    recorder = Recorder()
    recorder.reader.feed(frames.heartbeat_frame() + delivery(b"a") + cancel + frames.heartbeat_frame())
    assert recorder.bodies == [b"a"]
    [(channel, method, payload)] = recorder.methods
    assert (channel, method) == (1, frames.BASIC_CANCEL)
    assert frames.method_arguments(method, payload) == ["ctag", False]


def test_method_frames_encode_what_the_broker_decodes() -> None:
    encoded = frames.method_frame(0, frames.CONNECTION_TUNE_OK, "BlB", (1, frames.FRAME_MAX, 30))
    kind, channel, size = struct.unpack_from(">BHI", encoded)
    assert (kind, channel, size, encoded[-1]) == (frames.METHOD, 0, len(encoded) - 8, 0xCE)
    assert struct.unpack_from(">HH", encoded, 7) == frames.CONNECTION_TUNE_OK
    assert serialization.loads("BlB", encoded[:-1], 11)[0] == [1, frames.FRAME_MAX, 30]


@pytest.mark.parametrize(
    ("stream", "complaint"),
    [
        (frame(frames.BODY, b"abc")[:-1] + b"\x00", "frame-end"),
        (frame(9, b""), "unknown frame type"),
        (frame(frames.HEADER, struct.pack(">HHQH", 60, 0, 2, 0)) + frame(frames.BODY, b"abc"), "runs past"),
        (frame(frames.BODY, b"stray"), "runs past"),
        (struct.pack(">BHI", frames.BODY, 1, frames.FRAME_MAX + 1) + b"...", "maximum"),
        # issue 40, finding 6: struct.error (a traceback, the connection dropped unexplained)
        pytest.param(frame(frames.METHOD, b"\x00\x0a"), "method frame", id="method-under-4-bytes"),
        pytest.param(frame(frames.METHOD, b""), "method frame", id="method-empty"),
    ],
)
def test_a_stream_that_is_not_amqp_framing_is_refused(stream: bytes, complaint: str) -> None:
    with pytest.raises(frames.FramingError, match=complaint):
        Recorder().reader.feed(stream)


@pytest.mark.parametrize(
    ("method", "arguments"),
    [
        pytest.param(frames.CONNECTION_CLOSE, b"\x01", id="cut-short"),
        # py-amqp's decoding raised TypeError on a bit past the end (found by tests/fuzz; the connection was dropped
        # with a traceback instead of as a framing error)
        pytest.param(frames.BASIC_CANCEL, b"\x00", id="bit-past-the-end"),
    ],
)
def test_method_arguments_that_do_not_decode_are_a_framing_error(method: frames.MethodId, arguments: bytes) -> None:
    with pytest.raises(frames.FramingError, match="do not decode"):
        frames.method_arguments(method, struct.pack(">HH", *method) + arguments)


def connection_start(server_property: bytes) -> bytes:
    """connection.start's payload (after its method id) with one server property, as raw table entry bytes."""
    table = struct.pack(">I", len(server_property)) + server_property
    return b"\x00\x09" + table + struct.pack(">I", 5) + b"PLAIN" + struct.pack(">I", 5) + b"en_US"


@pytest.fixture
def py_amqp_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """py-amqp's own table decoding, as the core gets it (other tests' imports may have installed the runtime's and
    the operator's adapter, adapters/broker/amqp_tables.py, in this process)."""
    monkeypatch.setattr(serialization, "_read_item", amqp_tables.PY_AMQP_READ_ITEM)


@pytest.mark.usefixtures("py_amqp_decoding")
@pytest.mark.parametrize(
    "server_property",
    [
        *(pytest.param(timestamp_item("t", seconds), id=name) for name, seconds in OUT_OF_RANGE.items()),
        pytest.param(nested_item("deep", 3000), id="nested-3000-deep"),
    ],
)
def test_a_table_py_amqp_raises_on_is_a_framing_error(server_property: bytes) -> None:
    """A timestamp beyond year 9999 raised OSError or OverflowError, a table nested 3,000 deep RecursionError, out of
    the events reader (only FramingError is its refusal; ValueError alone was caught)."""
    with pytest.raises(frames.FramingError, match="do not decode"):
        frames.method_arguments(
            frames.CONNECTION_START, struct.pack(">HH", *frames.CONNECTION_START) + connection_start(server_property)
        )


def test_an_empty_body_frame_after_a_complete_delivery_is_refused_not_handed_on_as_a_body() -> None:
    """It handed on an extra empty body (issue 40, finding 6)."""
    recorder = Recorder()
    with pytest.raises(frames.FramingError, match="runs past"):
        recorder.reader.feed(delivery(b"abc") + frame(frames.BODY, b""))
    assert recorder.bodies == [b"abc"]


@pytest.mark.parametrize(
    ("ours", "theirs", "agreed"),
    [
        pytest.param(frames.FRAME_MAX, 0, frames.FRAME_MAX, id="no-limit-of-theirs"),
        pytest.param(frames.FRAME_MAX, 4096, 4096, id="theirs-lower"),
        pytest.param(frames.FRAME_MAX, 1 << 20, frames.FRAME_MAX, id="ours-lower"),
        pytest.param(2, 1, 1, id="one-channel"),
        pytest.param(2, 2047, 2, id="rabbitmq-default-channels"),
    ],
)
def test_limits_are_negotiated_as_amqp_says_zero_meaning_none(ours: int, theirs: int, agreed: int) -> None:
    assert frames.negotiated(ours, theirs) == agreed


def test_the_tune_is_answered_with_the_limits_both_sides_allow() -> None:
    assert frames.agreed_limits(0, 0, channels=2) == (2, frames.FRAME_MAX)
    assert frames.agreed_limits(1, 4096, channels=2) == (1, 4096)
    with pytest.raises(frames.FramingError, match="below AMQP's minimum"):
        frames.agreed_limits(0, 512, channels=2)


def test_the_reader_holds_the_broker_to_the_negotiated_frame_size() -> None:
    """It answered the broker's tune with 131072 whatever the broker said: a broker configured below refused the
    events consumer for ever (issue 40, finding 6). Frames are bounded by what was agreed, header and end included."""
    recorder = Recorder(max_body_bytes=10_000)
    recorder.reader.frame_max = 4096
    recorder.reader.feed(delivery(b"x" * 9000, frame_body_max=4096 - 8))
    assert recorder.bodies == [b"x" * 9000]
    with pytest.raises(frames.FramingError, match="maximum"):
        recorder.reader.feed(delivery(b"x" * 5000, frame_body_max=4096 - 7))
