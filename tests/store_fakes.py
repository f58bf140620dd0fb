"""A file system for Store tests that fails on purpose: the local file
system under the protocol ``flaky://``, whose reads raise the exceptions a
test queues (botocore's and aiohttp's own classes, say) and can go slowly.
A plain module, so that a subprocess can import it too.

    FlakyFS.reset(faults={"cat_file": [EndpointConnectionError(...), None]})
    Store("flaky:///some/folder").read("a.bin")   # fails once, then reads
    FlakyFS.calls                                 # [("cat_file", path, start, end), ("read", path, offset, n), ...]
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import fsspec
from fsspec.implementations.local import LocalFileSystem


class FlakyFS(LocalFileSystem):
    """The local file system; ``faults[op]`` lists what each next call of
    ``op`` ("cat_file", "info", "open", "read") does: raise the exception,
    call the function (and raise what it returns, if anything), or (None)
    work. ``read_pause_s`` slows each read of an open file."""

    protocol = "flaky"
    faults: dict = {}
    calls: list = []
    read_pause_s = 0.0
    _lock = threading.Lock()

    @classmethod
    def reset(cls, faults: Optional[dict] = None, read_pause_s: float = 0.0) -> None:
        cls.faults, cls.calls, cls.read_pause_s = {op: list(f) for op, f in (faults or {}).items()}, [], read_pause_s

    @classmethod
    def happen(cls, op: str, *details: Any) -> None:
        """Note a call of ``op``; raise its next queued fault, if any."""
        with cls._lock:
            cls.calls.append((op, *details))
            queued = cls.faults.get(op)
            fault = queued.pop(0) if queued else None
        if callable(fault) and not isinstance(fault, BaseException):
            fault = fault()
        if fault is not None:
            raise fault

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.happen("cat_file", path, start, end)
        return super().cat_file(path, start=start, end=end, **kwargs)

    def info(self, path, **kwargs):
        self.happen("info", path)
        return super().info(path, **kwargs)

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        self.happen("open", path)
        return _FlakyFile(super()._open(path, mode, block_size, **kwargs), path)


class _FlakyFile:
    def __init__(self, file: Any, path: str):
        self.file, self.path = file, path

    def __enter__(self) -> "_FlakyFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.file.close()

    def seek(self, offset: int) -> int:
        return self.file.seek(offset)

    def read(self, n: int = -1) -> bytes:
        if FlakyFS.read_pause_s:
            time.sleep(FlakyFS.read_pause_s)
        FlakyFS.happen("read", self.path, self.file.tell(), n)
        return self.file.read(n)


fsspec.register_implementation("flaky", FlakyFS, clobber=True)
