"""The thread that starts worker processes for every thread but the main one.

    a thread that is not the main one ──call──▶ [queue] ──▶ conveyor-process-starter: fork / Popen ──▶ worker
                                      ◀──the started worker, or the exception──

Linux's parent-death signal (``portable.die_with_parent``), which kills a
worker however busy it is when its main process is killed, follows the
*thread* that started the worker, not the process: a worker forked by a
training loop's thread would be killed when that thread ends, and a worker
started by a thread that may end cannot ask for it (the watch thread alone
then served, which cannot run while user code holds the GIL). So every
worker is started by a thread that lives as long as its process: the main
thread, or this one. It is a daemon, started at the first start it is
asked for; a child forked by the user's process starts its own.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Optional

#: How often a caller waiting for a start looks whether the starter still runs.
_ALIVE_CHECK_S = 0.1


class _Call:
    """One start asked of the starter, and what came of it."""

    def __init__(self, function: Callable[..., Any], args: tuple):
        self.function, self.args = function, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.value = self.function(*self.args)
        except BaseException as exc:  # (handed to the caller, raised there)
            self.error = exc
        finally:
            self.done.set()


class ProcessStarter:
    """A daemon thread that runs the starts its callers hand it, one at a time."""

    def __init__(self) -> None:
        self._calls: "queue.SimpleQueue[_Call]" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="conveyor-process-starter", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self._calls.get().run()

    def run(self, function: Callable[..., Any], *args: Any) -> Any:
        """``function(*args)`` in the starter's thread; its value, or its exception raised here."""
        call = _Call(function, args)
        self._calls.put(call)
        while not call.done.wait(_ALIVE_CHECK_S):
            if not self.thread.is_alive():  # (never expected: the thread catches everything)
                raise RuntimeError("conveyor's process-starter thread has ended; worker processes cannot start")
        if call.error is not None:
            raise call.error
        return call.value


_starter: Optional[ProcessStarter] = None
_lock = threading.Lock()


def process_starter() -> ProcessStarter:
    """This process's starter, started at the first call."""
    global _starter
    with _lock:
        if _starter is None:
            _starter = ProcessStarter()
        return _starter


def start_from_a_lasting_thread(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, which starts a process: in this thread if it is
    the main one, else in the starter's."""
    if threading.current_thread() is threading.main_thread():
        return function(*args)
    return process_starter().run(function, *args)


def _forget_in_child() -> None:
    global _starter, _lock
    _starter, _lock = None, threading.Lock()  # (the thread did not come with the fork)


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
    os.register_at_fork(after_in_child=_forget_in_child)
