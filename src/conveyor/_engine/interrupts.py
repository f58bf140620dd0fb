"""Telling an exception a signal handler raised from a failure of conveyor's own.

Python runs a signal handler in the main thread between any two bytecodes,
and what the handler raises comes out of whatever conveyor was doing then:
reading a result, sending a task, starting a worker. Such an exception
(Ctrl-C's KeyboardInterrupt, a timeout decorator's alarm) is the user's
interruption, not a message that could not cross or a worker that failed
to start: it must reach the loop as it is, never be stored as the pass's
failure and raised again by later calls. The pass then stops
(``iteration.LoaderIterator._interrupted``).

An exception is a handler's when a frame of its traceback runs the code
of a Python handler installed now. KeyboardInterrupt from Python's own
SIGINT handler has no such frame, but it is no Exception and so is never
caught as a failure.

``HolderLock`` serves the other side: a reader (``stats()``) called from a
handler that interrupted a change made under the lock, in the same thread,
can tell, and answer with what it read before instead of half-changed figures.
"""

from __future__ import annotations

import signal
import threading
from types import CodeType
from typing import Any, Optional


def raised_by_handler(error: BaseException) -> bool:
    """Whether ``error`` came from a Python signal handler (or code it called)."""
    if threading.current_thread() is not threading.main_thread():
        return False  # (handlers run in the main thread only)
    codes = _handler_codes()
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


def _handler_codes() -> set[CodeType]:
    """The code objects of the Python signal handlers installed now."""
    codes = set()
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            continue
        code = _code_of(handler)
        if code is not None:
            codes.add(code)
    return codes


def _code_of(handler: Any) -> Optional[CodeType]:
    """The code a handler runs: a function's, a method's, a callable object's ``__call__``."""
    for candidate in (handler, getattr(handler, "__func__", None), getattr(type(handler), "__call__", None)):
        code = getattr(candidate, "__code__", None)
        if isinstance(code, CodeType):
            return code
    func = getattr(handler, "func", None)  # (functools.partial)
    return _code_of(func) if func is not None and func is not handler else None


class HolderLock:
    """A re-entrant lock that tells whether the calling thread holds it: a
    reader called from a signal handler (or a finalizer) amid a change made
    under the lock, in the same thread, would find the change half done,
    and a plain re-entrant lock would let it in."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._holder: Optional[int] = None
        self._depth = 0

    def __enter__(self) -> "HolderLock":
        self._lock.acquire()
        self._holder = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if not self._depth:
            self._holder = None
        self._lock.release()

    def held_here(self) -> bool:
        """Whether this thread holds it (so the code holding it was interrupted, or called us)."""
        return self._holder == threading.get_ident()
