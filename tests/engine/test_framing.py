"""Frames over pipes, driven directly on ``os.pipe()`` (no workers).

A frame is an 8-byte little-endian length and a payload of pickles back to
back (``pack``/``unpack``). Workers use the blocking ends (``write_frame``,
``read_frame``); the main process the non-blocking ones: ``FrameWriter``
never waits for room (it keeps what the pipe did not take until ``flush``)
and ``FrameReader`` never waits for the rest of a frame (it keeps a partial
frame for the next ``read``). Checked: frames of any size and any split,
partial writes, frames far larger than the pipe, the end of the pipe before
and inside a frame, and that a full pipe never blocks the main side.
"""

from __future__ import annotations

import os
import pickle
import struct
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor._engine.transport import wire
from conveyor._engine.transport.wire import FrameReader, FrameWriter, pack, read_frame, unpack, write_frame

#: Bytes a Linux pipe holds by default; frames larger than this cannot sit
#: in the pipe whole.
PIPE_BYTES = 1 << 16
#: Bounds the single-threaded write/read loops below: each round moves at
#: least one byte, so a loop this long means one side stopped moving.
MAX_ROUNDS = 100_000


def header(length: int) -> bytes:
    return struct.pack("<Q", length)


@pytest.fixture
def pipe():
    """(read end, write end); each closed at the end unless the test closed it."""
    r, w = os.pipe()
    ends = {"r": r, "w": w}
    yield ends
    for fd in ends.values():
        try:
            os.close(fd)
        except OSError:
            pass


def close(ends: dict, which: str) -> None:
    os.close(ends[which])
    ends[which] = -1


def pump(writer: FrameWriter, reader: FrameReader, frames: int) -> list:
    """Flush and read in turns, in this one thread, until ``frames`` payloads arrived."""
    got: list = []
    for _ in range(MAX_ROUNDS):
        if writer.pending:
            writer.flush()
        got += [bytes(p) for p in reader.read()]
        if len(got) >= frames and not writer.pending:
            return got
    raise AssertionError(f"no progress: {len(got)} of {frames} frames after {MAX_ROUNDS} rounds")


messages = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12,
)


# ---------------------------------------------------------------- pack/unpack


@given(st.lists(messages, max_size=5))
def test_a_payload_holds_its_messages_in_order(items):
    assert unpack(pack(*items)) == items


def test_one_message_is_one_pickle_and_an_empty_payload_holds_none():
    assert pack({"a": 1}) == pickle.dumps({"a": 1}, protocol=pickle.HIGHEST_PROTOCOL)
    assert pack() == b"" and unpack(b"") == []
    assert unpack(memoryview(pack(1, 2))) == [1, 2]


def test_a_cut_payload_raises_what_unpickling_raises():
    payload = pack([1, 2, 3], "x")
    with pytest.raises((EOFError, pickle.UnpicklingError)):
        unpack(payload[:-3])


# ------------------------------------------------------- blocking (worker) ends


def test_a_frame_written_whole_reads_back(pipe):
    write_frame(pipe["w"], b"hello")
    write_frame(pipe["w"], b"")
    assert read_frame(pipe["r"]) == b"hello"
    assert read_frame(pipe["r"]) == b""


def test_a_frame_larger_than_the_pipe_crosses_while_the_other_side_reads(pipe):
    payload = os.urandom(5 * PIPE_BYTES + 123)
    writer = threading.Thread(target=write_frame, args=(pipe["w"], payload))
    writer.start()
    try:
        assert read_frame(pipe["r"]) == payload
    finally:
        writer.join(timeout=30)
    assert not writer.is_alive()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 40), payload=st.binary(max_size=200))
def test_write_frame_finishes_a_frame_the_pipe_took_in_pieces(monkeypatch, cap, payload):
    """writev may take fewer bytes than offered (a signal, a nearly full pipe):
    the rest goes in the next call, wherever the cut falls."""
    calls = []

    def short_writev(fd, views):
        data = b"".join(bytes(v) for v in views)[:cap]
        calls.append(len(data))
        return os.write(fd, data)

    r, w = os.pipe()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(wire.os, "writev", short_writev)
            write_frame(w, payload)
        assert sum(calls) == 8 + len(payload)
        assert read_frame(r) == payload
    finally:
        os.close(r)
        os.close(w)


def test_read_frame_at_the_end_of_the_pipe(pipe):
    close(pipe, "w")
    with pytest.raises(EOFError, match="^the pipe closed$"):
        read_frame(pipe["r"])


@pytest.mark.parametrize("cut", [3, 8, 8 + 5], ids=["in the header", "after the header", "in the payload"])
def test_read_frame_when_the_pipe_closes_inside_a_frame(pipe, cut):
    os.write(pipe["w"], (header(10) + b"0123456789")[:cut])
    close(pipe, "w")
    with pytest.raises(EOFError) as error:
        read_frame(pipe["r"])
    # (Right after a whole header it says only "the pipe closed": the worker,
    # the one reader of this end, treats both alike.)
    if cut != 8:
        assert "in the middle of a message" in str(error.value)


def test_write_frame_once_the_reader_is_gone(pipe):
    close(pipe, "r")
    with pytest.raises(BrokenPipeError):
        write_frame(pipe["w"], b"x")


# ------------------------------------------------- non-blocking (main) ends


def test_the_writer_returns_at_once_when_the_pipe_is_full_and_keeps_the_rest(pipe):
    writer = FrameWriter(pipe["w"])
    payload = os.urandom(4 * PIPE_BYTES)
    writer.put(payload)  # nobody reads yet: must not block
    assert writer.pending
    writer.put(b"after")  # queued behind it
    writer.flush()  # still full: returns
    assert writer.pending
    assert pump(writer, FrameReader(pipe["r"]), 2) == [payload, b"after"]


def test_the_writer_takes_many_frames_without_a_reader(pipe):
    writer = FrameWriter(pipe["w"])
    payloads = [bytes([i % 256]) * (i * 37 % 900) for i in range(2000)]  # about 900 kB: far past the pipe
    for payload in payloads:
        writer.put(payload)
    assert writer.pending
    assert pump(writer, FrameReader(pipe["r"]), len(payloads)) == payloads


def test_the_writer_sends_at_once_what_fits(pipe):
    writer = FrameWriter(pipe["w"])
    writer.put(b"small")
    assert not writer.pending
    assert read_frame(pipe["r"]) == b"small"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 50), payloads=st.lists(st.binary(max_size=120), min_size=1, max_size=6))
def test_the_writer_resumes_a_frame_the_pipe_took_in_pieces(monkeypatch, cap, payloads):
    """A partial write is kept from the first byte not taken, across views
    (header, payload) and frames."""

    def short_writev(fd, views):
        return os.write(fd, b"".join(bytes(v) for v in views)[:cap])

    r, w = os.pipe()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(wire.os, "writev", short_writev)
            writer = FrameWriter(w)
            for payload in payloads:
                writer.put(payload)
            for _ in range(MAX_ROUNDS):
                if not writer.pending:
                    break
                writer.flush()
        assert not writer.pending
        os.close(w)
        w = -1
        assert [bytes(read_frame(r)) for _ in payloads] == payloads
        with pytest.raises(EOFError):
            read_frame(r)
    finally:
        os.close(r)
        if w != -1:
            os.close(w)


def test_the_writer_once_the_reader_is_gone(pipe):
    writer = FrameWriter(pipe["w"])
    writer.put(os.urandom(2 * PIPE_BYTES))
    assert writer.pending
    close(pipe, "r")
    with pytest.raises(BrokenPipeError, match="is gone"):
        writer.flush()
    assert not writer.pending  # what was kept is dropped
    with pytest.raises(BrokenPipeError):
        writer.put(b"x")
    assert not writer.pending


def test_the_reader_returns_nothing_while_nothing_arrived(pipe):
    reader = FrameReader(pipe["r"])
    assert reader.read() == [] and not reader.partial


def test_the_reader_gathers_a_frame_arriving_byte_by_byte(pipe):
    reader = FrameReader(pipe["r"])
    frame = header(5) + b"abcde"
    for byte in frame[:-1]:
        os.write(pipe["w"], bytes([byte]))
        assert reader.read() == []
        assert reader.partial
    os.write(pipe["w"], frame[-1:])
    assert [bytes(p) for p in reader.read()] == [b"abcde"]
    assert not reader.partial


def test_the_reader_gives_every_frame_that_arrived_in_one_read(pipe):
    reader = FrameReader(pipe["r"])
    os.write(pipe["w"], b"".join(header(len(p)) + p for p in (b"a", b"", b"ccc")) + header(4) + b"dd")
    assert [bytes(p) for p in reader.read()] == [b"a", b"", b"ccc"]
    assert reader.partial  # the fourth is half there
    os.write(pipe["w"], b"dd")
    assert [bytes(p) for p in reader.read()] == [b"dddd"]


def test_the_reader_fills_a_large_frame_as_it_arrives(pipe):
    """A frame larger than one read goes into a buffer of its own size;
    until it is whole, read gives nothing, and the frame after it follows."""
    payload = os.urandom(3 * PIPE_BYTES + 17)
    frame = header(len(payload)) + payload + header(2) + b"ok"
    reader = FrameReader(pipe["r"])
    got = []
    for start in range(0, len(frame), 10_000):
        os.write(pipe["w"], frame[start : start + 10_000])
        got += [bytes(p) for p in reader.read()]
        if start + 10_000 < 8 + len(payload):
            assert got == [] and reader.partial
    got += [bytes(p) for p in reader.read()]
    assert got == [payload, b"ok"]
    assert not reader.partial


def test_the_reader_at_the_end_of_the_pipe(pipe):
    reader = FrameReader(pipe["r"])
    os.write(pipe["w"], header(1) + b"z")
    close(pipe, "w")
    assert [bytes(p) for p in reader.read()] == [b"z"]
    with pytest.raises(EOFError, match="^the pipe closed$"):
        reader.read()
    assert not reader.partial


@pytest.mark.parametrize("size", [10, 4 * PIPE_BYTES], ids=["small frame", "large frame"])
def test_the_reader_when_the_pipe_closes_inside_a_frame(pipe, size):
    reader = FrameReader(pipe["r"])
    os.write(pipe["w"], header(size) + b"x" * 5)
    assert reader.read() == []
    close(pipe, "w")
    with pytest.raises(EOFError, match="in the middle of a message"):
        reader.read()
    assert reader.partial


def test_a_frame_completed_with_the_end_is_given_before_the_end(pipe):
    reader = FrameReader(pipe["r"])
    os.write(pipe["w"], header(3) + b"a")
    assert reader.read() == []
    os.write(pipe["w"], b"bc")
    close(pipe, "w")
    assert [bytes(p) for p in reader.read()] == [b"abc"]
    with pytest.raises(EOFError):
        reader.read()


def test_discard_drops_what_arrived_and_says_when_the_pipe_closed(pipe):
    reader = FrameReader(pipe["r"])
    os.write(pipe["w"], header(100) + b"partial")
    assert reader.read() == [] and reader.partial
    assert reader.discard() is True
    assert not reader.partial
    os.write(pipe["w"], b"left over")
    close(pipe, "w")
    assert reader.discard() is False


# ------------------------------------------------------------ any split, any size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.integers(0, 3 * PIPE_BYTES), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 4096), min_size=1, max_size=40),
)
def test_the_reader_gives_the_frames_in_order_however_the_bytes_arrive(sizes, cuts):
    payloads = [bytes([i + 1]) * size for i, size in enumerate(sizes)]
    stream = b"".join(header(len(p)) + p for p in payloads)
    r, w = os.pipe()
    try:
        reader = FrameReader(r)
        got = []
        at, k = 0, 0
        while at < len(stream):
            step = cuts[k % len(cuts)]
            os.write(w, stream[at : at + step])  # at most 4 KiB: the reader drains it before the next
            at, k = at + step, k + 1
            got += [bytes(p) for p in reader.read()]
        got += [bytes(p) for p in reader.read()]
        assert got == payloads
        assert not reader.partial
    finally:
        os.close(r)
        os.close(w)


@settings(max_examples=30, deadline=None)
@given(
    items=st.lists(st.tuples(messages, st.integers(0, 2 * PIPE_BYTES)), min_size=1, max_size=6),
    reads_between=st.lists(st.booleans(), min_size=1, max_size=6),
)
def test_messages_cross_a_pipe_between_the_main_process_ends(items, reads_between):
    """FrameWriter to FrameReader, one thread, reads whenever it suits: the
    messages arrive whole, in order, and neither end ever blocks."""
    r, w = os.pipe()
    try:
        writer, reader = FrameWriter(w), FrameReader(r)
        sent, got = [], []
        for k, (message, pad) in enumerate(items):
            batch = (message, b"\0" * pad)
            sent.append(list(batch))
            writer.put(pack(*batch))
            if reads_between[k % len(reads_between)]:
                got += [unpack(p) for p in reader.read()]
        for _ in range(MAX_ROUNDS):
            if len(got) == len(sent) and not writer.pending:
                break
            writer.flush()
            got += [unpack(p) for p in reader.read()]
        assert got == sent
    finally:
        os.close(r)
        os.close(w)
