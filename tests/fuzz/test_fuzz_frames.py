"""The events reader's frame layer against any byte stream a broker (or whatever answers on its port) sends: it raises
only FramingError, and deliveries framed at any size and split anywhere come out whole, in order, to their route."""

from __future__ import annotations

import contextlib
import struct
from unittest import mock

import pytest
from amqp import serialization
from hypothesis import given
from hypothesis import strategies as st

from celery_event_operator.adapters.broker import amqp_tables
from celery_event_operator.core.monitoring import frames
from tests.fuzz.strategies import FIELD_TABLES
from tests.unit.monitoring.test_frames import Recorder, connection_start, delivery, frame

SPLITS = st.lists(st.integers(min_value=1, max_value=64), min_size=1, max_size=40)
FRAME_MAX = st.sampled_from([frames.FRAME_MIN, 8192, frames.FRAME_MAX])
KINDS = st.sampled_from([frames.METHOD, frames.HEADER, frames.BODY, frames.HEARTBEAT, 0, 9])
# Frames of any kind and payload, some beginning as a delivery or a content header would.
PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.binary(max_size=40).map(lambda rest: struct.pack(">HH", *frames.BASIC_DELIVER) + rest),
    st.tuples(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=8)).map(
        lambda size_rest: struct.pack(">HHQ", 60, 0, size_rest[0]) + size_rest[1]
    ),
)
FRAMES = st.tuples(KINDS, PAYLOADS, st.integers(min_value=0, max_value=3)).map(
    lambda parts: frame(parts[0], parts[1], parts[2])
)
METHOD_IDS = st.sampled_from(sorted(frames.RECEIVED_SIGNATURES))


def fed(recorder: Recorder, stream: bytes, splits: list[int]) -> None:
    position = 0
    while position < len(stream):
        for size in splits:
            recorder.reader.feed(stream[position : position + size])
            position += size


def feed_or_refuse(recorder: Recorder, stream: bytes, splits: list[int]) -> None:
    with contextlib.suppress(frames.FramingError):  # the one documented refusal: the connection is opened again
        fed(recorder, stream, splits)


@given(stream=st.binary(max_size=300), splits=SPLITS, frame_max=FRAME_MAX)
def test_any_bytes_are_read_or_refused_as_framing(stream: bytes, splits: list[int], frame_max: int) -> None:
    recorder = Recorder()
    recorder.reader.frame_max = frame_max
    feed_or_refuse(recorder, stream, splits)


@given(stream=st.lists(FRAMES, max_size=12).map(b"".join), splits=SPLITS)
def test_any_frames_are_read_or_refused_as_framing(stream: bytes, splits: list[int]) -> None:
    feed_or_refuse(Recorder(), stream, splits)


@given(
    bodies=st.lists(st.tuples(st.binary(max_size=300), st.sampled_from([b"ctag", b"other", b"gone"])), max_size=6),
    frame_max=FRAME_MAX,
    body_frame=st.integers(min_value=1, max_value=frames.FRAME_MAX),
    splits=SPLITS,
    flipped=st.one_of(st.none(), st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255))),
)
def test_deliveries_come_out_whole_and_in_order_and_a_corrupted_stream_is_refused_as_framing(
    bodies: list[tuple[bytes, bytes]],
    frame_max: int,
    body_frame: int,
    splits: list[int],
    flipped: tuple[int, int] | None,
) -> None:
    body_frame = min(body_frame, frame_max - frames.FRAME_OVERHEAD)
    stream = b"".join(delivery(body, body_frame, tag.decode()) for body, tag in bodies)
    first, second = Recorder(max_body_bytes=200), Recorder()
    first.routes[b"other"] = second
    first.reader.frame_max = frame_max
    if flipped is None or not stream:
        fed(first, stream, splits)
        assert first.bodies == [body for body, tag in bodies if tag == b"ctag" and len(body) <= 200]
        assert second.bodies == [body for body, tag in bodies if tag == b"other"]
        assert first.oversized == sum(1 for body, tag in bodies if tag == b"ctag" and len(body) > 200)
        return
    position, xor = flipped
    position %= len(stream)
    corrupted = stream[:position] + bytes((stream[position] ^ xor,)) + stream[position + 1 :]
    feed_or_refuse(first, corrupted, splits)


@given(method=METHOD_IDS, payload=st.binary(max_size=60))
def test_method_arguments_decode_or_are_refused_as_framing(method: frames.MethodId, payload: bytes) -> None:
    with contextlib.suppress(frames.FramingError):
        frames.method_arguments(method, struct.pack(">HH", *method) + payload)


@given(server_properties=FIELD_TABLES)
def test_any_server_properties_decode_or_are_refused_as_framing(server_properties: bytes) -> None:
    """With py-amqp's own table decoding (the core does not rely on the runtime's and operator's adapter): a timestamp
    beyond year 9999 or a table nested past the recursion limit is a FramingError, not OSError or RecursionError."""
    payload = struct.pack(">HH", *frames.CONNECTION_START) + connection_start(server_properties[4:])
    with (
        mock.patch.object(serialization, "_read_item", amqp_tables.PY_AMQP_READ_ITEM),
        contextlib.suppress(frames.FramingError),
    ):
        frames.method_arguments(frames.CONNECTION_START, payload)


@given(ours=st.integers(min_value=1, max_value=2**32 - 1), theirs=st.integers(min_value=0, max_value=2**32 - 1))
def test_a_negotiated_limit_is_never_above_either_side(ours: int, theirs: int) -> None:
    agreed = frames.negotiated(ours, theirs)
    assert agreed <= ours
    assert agreed <= theirs or theirs == 0
    if theirs:
        assert agreed == min(ours, theirs)
    too_small = frames.negotiated(frames.FRAME_MAX, theirs) < frames.FRAME_MIN
    with pytest.raises(frames.FramingError) if too_small else contextlib.nullcontext():
        frames.agreed_limits(0, theirs, channels=2)
