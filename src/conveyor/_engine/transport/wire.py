"""Messages over pipes, in frames, without the main process ever blocking.

    frame = 8-byte length (little-endian) + payload (one or more pickles back to back)

Each result is a frame of its own: a finished batch never waits for another.

    main ──FrameWriter (non-blocking; keeps what the pipe did not take)──▶ task pipe ──read_frame──▶ worker
    main ◀──FrameReader (non-blocking; gathers partial frames)── result pipe ◀──write_frame── worker

Why the main side never blocks: a worker blocks while writing a result the
main process has not read yet. If the main process could block writing a
task to that same worker (a long index list, a full pipe), each would wait
for the other forever. So the main process writes what the pipe takes and
keeps the rest until ``poll`` says there is room, and reads what has arrived
without waiting for the rest of a frame. Workers may block on both pipes:
the main process always comes back to read and write.
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import struct
from collections import deque
from typing import Any

_HEADER = struct.Struct("<Q")
#: Bytes asked of the kernel per read: a pipe holds 64 KiB by default, so one
#: read usually takes everything that is there, several small frames at once.
_READ_BYTES = 1 << 16
#: Views handed to one writev (Linux takes up to 1024).
_IOV_MAX = 64


def pack(*messages: Any) -> bytes:
    """The payload of one frame holding ``messages``, pickled back to back."""
    if len(messages) == 1:
        return pickle.dumps(messages[0], protocol=pickle.HIGHEST_PROTOCOL)
    return b"".join(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in messages)


def unpack(payload: Any) -> list:
    """The messages of one frame's payload (raises what unpickling raises)."""
    stream = io.BytesIO(payload)
    messages = []
    while stream.tell() < len(payload):
        messages.append(pickle.load(stream))
    return messages


# ------------------------------------------------------------- blocking ends


def _read_exactly(fd: int, count: int) -> bytearray:
    buffer = bytearray(count)
    view = memoryview(buffer)
    done = 0
    while done < count:
        got = os.readv(fd, [view[done:]])
        if got == 0:
            raise EOFError("the pipe closed in the middle of a message" if done else "the pipe closed")
        done += got
    return buffer


def read_frame(fd: int) -> bytearray:
    """The next frame's payload, waiting for it (a worker's end); EOFError at the end."""
    (length,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size))
    return _read_exactly(fd, length)


def write_frame(fd: int, payload: bytes) -> None:
    """Write ``payload`` as one frame, waiting for room (a worker's end).
    Raises BrokenPipeError once the reader is gone."""
    views = [memoryview(_HEADER.pack(len(payload))), memoryview(payload)]
    while views:
        written = os.writev(fd, views)
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views:
            views[0] = views[0][written:]


# --------------------------------------------------------- main-process ends


class FrameWriter:
    """The main process's end of a task pipe: never waits for room.

    ``put`` writes what the pipe takes now and keeps the rest; the owner
    calls ``flush`` whenever ``poll`` reports the pipe writable, for as long
    as ``pending`` is true. Once the reader is gone, ``put`` and ``flush``
    raise BrokenPipeError and what was kept is dropped.
    """

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._queue: deque[memoryview] = deque()

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    def put(self, payload: bytes) -> None:
        """Send ``payload`` as one frame, now or as the pipe makes room."""
        self._queue.append(memoryview(_HEADER.pack(len(payload))))
        self._queue.append(memoryview(payload))
        self.flush()

    def flush(self) -> None:
        queue = self._queue
        try:
            while queue:
                written = os.writev(self.fd, list(itertools.islice(queue, _IOV_MAX)))
                while queue and written >= len(queue[0]):
                    written -= len(queue.popleft())
                if written:
                    queue[0] = queue[0][written:]
                    return  # the pipe took part of a view: it is full
        except BlockingIOError:
            return
        except OSError:
            queue.clear()
            raise BrokenPipeError(f"the reader of pipe {self.fd} is gone") from None


class FrameReader:
    """The main process's end of a result pipe: takes what has arrived.

    ``read`` returns the payloads of the frames completed so far (often
    several from one ``read`` call) and keeps a partial frame for the next
    call; a large frame is read straight into a buffer of its size. Raises
    EOFError once the writer is gone (``partial`` then tells whether it
    went in the middle of a frame).
    """

    def __init__(self, fd: int):
        self.fd = fd
        os.set_blocking(fd, False)
        self._head = b""  # bytes read and not yet parsed
        self._body: bytearray | None = None  # a large frame being filled
        self._filled = 0

    @property
    def partial(self) -> bool:
        return bool(self._head) or self._body is not None

    def read(self) -> list:
        """Complete payloads available now ([] if none); EOFError at the end."""
        if self._body is not None:
            if not self._fill_body():
                return []
            payloads = [self._take_body()]
        else:
            payloads = []
        try:
            chunk = os.read(self.fd, _READ_BYTES)
        except BlockingIOError:
            return payloads
        if not chunk:
            if payloads:
                return payloads  # the end is reported at the next call
            raise EOFError("the pipe closed in the middle of a message" if self.partial else "the pipe closed")
        data = self._head + chunk if self._head else chunk
        self._head = b""
        self._split(data, payloads)
        return payloads

    def _split(self, data: bytes, payloads: list) -> None:
        view = memoryview(data)
        start = 0
        end = len(data)
        while end - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(view, start)
            body_start = start + _HEADER.size
            if end - body_start >= length:
                payloads.append(view[body_start : body_start + length])
                start = body_start + length
                continue
            if length > _READ_BYTES:
                # Too big to gather chunk by chunk: read the rest into its own buffer.
                self._body = bytearray(length)
                got = end - body_start
                self._body[:got] = view[body_start:end]
                self._filled = got
                if self._fill_body():
                    payloads.append(self._take_body())
                return
            break
        self._head = bytes(view[start:end])

    def _fill_body(self) -> bool:
        """Read into the large frame; True once it is complete."""
        body = self._body
        assert body is not None  # (called while a large frame is being read)
        view = memoryview(body)
        while self._filled < len(body):
            try:
                got = os.readv(self.fd, [view[self._filled :]])
            except BlockingIOError:
                return False
            if got == 0:
                raise EOFError("the pipe closed in the middle of a message")
            self._filled += got
        return True

    def discard(self) -> bool:
        """Drop whatever has arrived (when stopping); False once the pipe has closed."""
        self._head, self._body, self._filled = b"", None, 0
        try:
            while os.read(self.fd, _READ_BYTES):
                pass
        except BlockingIOError:
            return True
        except OSError:
            pass
        return False

    def _take_body(self) -> bytearray:
        body, self._body, self._filled = self._body, None, 0
        assert body is not None
        return body
