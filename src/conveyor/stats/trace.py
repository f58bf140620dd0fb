"""A Chrome-trace timeline of every batch: each worker's fetch, collate and
encode, the main process's decode, queue and pin, and the loop's waits.

    with loader.trace("trace.json"): ...   ──▶ open in https://ui.perfetto.dev or chrome://tracing

Workers stamp their spans with ``time.perf_counter()``, a clock all
processes of a Linux machine share, so every span lands on one timeline.
"""

from __future__ import annotations

import json
import os
from time import perf_counter
from types import SimpleNamespace
from typing import Any, Union

from .workers import LOCAL, node_of

#: Rows of the main process in the viewer.
_LOOP_TID = 1
_MAIN_TID = 2


class ChromeTrace:
    """Collects spans while the loader runs; :meth:`write` saves them."""

    def __init__(self) -> None:
        self._origin = perf_counter()
        self._pid = os.getpid()
        self._events: list[dict] = []
        self._workers: dict[int, int] = {}

    def _span(self, name: str, pid: int, tid: int, start: float, seconds: float, batch: int) -> None:
        if seconds <= 0:
            return
        self._events.append(
            {
                "name": name,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": (start - self._origin) * 1e6,
                "dur": seconds * 1e6,
                "args": {"batch": batch},
            }
        )

    def batch(self, delivered: Any, called_at: float, returned_at: float) -> None:
        """One delivered batch: ``next()`` was called at ``called_at`` and returned at ``returned_at``."""
        index, timings, main = delivered.batch_index, delivered.timings, self._pid
        self._span("wait (next)", main, _LOOP_TID, called_at, returned_at - called_at, index)
        if timings is None:
            return
        timings = SimpleNamespace(**timings.fields())
        if timings.worker_id < 0:
            pid, tid = main, _MAIN_TID
        else:
            pid, tid = timings.worker_pid, 0
            self._workers[pid] = timings.worker_id
        at = timings.started_at
        for name, seconds in (("fetch", timings.fetch_s), ("collate", timings.collate_s), ("encode", timings.encode_s)):
            self._span(name, pid, tid, at, seconds, index)
            at += seconds
        at = timings.arrived_at
        for name, seconds in (("decode", timings.decode_s), ("queue", timings.queue_s), ("pin", timings.pin_s)):
            self._span(name, main, _MAIN_TID, at, seconds, index)
            at += seconds

    def to_dict(self) -> dict:
        names = [_name(self._pid, "main process"), _thread(self._pid, _LOOP_TID, "training loop")]
        names.append(_thread(self._pid, _MAIN_TID, "loading (main process)"))
        for pid, worker_id in sorted(self._workers.items()):
            node = node_of(pid)
            names.append(_name(pid, f"worker {worker_id}" + (f" on {node}" if node != LOCAL else "")))
        return {"traceEvents": names + self._events, "displayTimeUnit": "ms"}

    def write(self, path: Union[str, os.PathLike]) -> None:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(self.to_dict(), out)


def _name(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": f"{name} (pid {pid})"}}


def _thread(pid: int, tid: int, name: str) -> dict:
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
