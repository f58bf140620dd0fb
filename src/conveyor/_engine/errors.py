"""Turning failures in workers into exceptions a user can act on.

Messages begin with the words torch.utils.data uses for the same event, so
log searches written for torch keep matching; conveyor's context follows.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from typing import Any, Optional

from .messages import Failure

#: Reasons shown next to a signal that killed a worker.
_SIGNAL_HINTS = {
    signal.SIGKILL: (
        "SIGKILL usually comes from the kernel's out-of-memory killer: lower batch_size, "
        "prefetch_factor or num_workers, or give the job more memory (see `dmesg`)."
    ),
    signal.SIGBUS: (
        "SIGBUS usually means shared memory ran out (/dev/shm is full or too small, e.g. "
        "64 MB in a default container): enlarge it (docker run --shm-size=8g) or lower "
        "batch_size or prefetch_factor."
    ),
    signal.SIGSEGV: (
        "SIGSEGV is a crash inside native code (a C extension, a decoder, a library that is "
        "not fork-safe): try multiprocessing_context='spawn' or num_workers=0 to find it."
    ),
}


class WorkerDiedError(RuntimeError):
    """A worker process ended while it still had work (signal or exit code)."""


def capture_failure(worker_id: Optional[int], where: str) -> Failure:
    """Describe the exception being handled, for sending to the main process."""
    exc_type, exc, tb = sys.exc_info()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    carried = carried_type = None
    try:
        pickle.loads(pickle.dumps(exc))
        carried = exc
    except Exception:  # the instance cannot cross a process boundary ...
        try:
            pickle.loads(pickle.dumps(exc_type))
            carried_type = exc_type  # ... but its class can
        except Exception:
            pass
    return Failure(
        worker_id=worker_id,
        pid=os.getpid(),
        where=where,
        exc_type_name=exc_type.__name__,
        traceback_text=text,
        exception=carried,
        exception_type=carried_type,
    )


class _KeyErrorMessage(str):
    """KeyError prints its argument with repr(); this keeps newlines readable."""

    def __repr__(self) -> str:
        return str(self)


def _exception_type(failure: Failure) -> type:
    if failure.exception is not None:
        return type(failure.exception)
    if failure.exception_type is not None:
        return failure.exception_type
    import builtins

    found = getattr(builtins, failure.exc_type_name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return RuntimeError


def rebuild_exception(failure: Failure, context: str = "") -> BaseException:
    """An exception of the original type whose message starts like torch's
    (``Caught KeyError in DataLoader worker process 0.``), then conveyor's
    ``context`` and the worker's traceback.

    The original exception object, when it crossed the pipe, is chained as
    ``__cause__`` and kept on ``.original``.
    """
    where = failure.where
    head = f"Caught {failure.exc_type_name} {where}."
    if context:
        head += f" {context}"
    msg = f"{head}\nOriginal {failure.traceback_text}"
    exc_type = _exception_type(failure)
    if exc_type is KeyError:
        msg = _KeyErrorMessage(msg)
    try:
        err = exc_type(msg)
    except Exception:
        err = RuntimeError(msg)
    if str(err) != str(msg) and exc_type is not KeyError:
        # The type's constructor rewrote the message (extra required
        # arguments, custom __str__): fall back to a plain RuntimeError.
        err = RuntimeError(msg)
    try:
        err.original = failure.exception
        err.worker_id = failure.worker_id
        err.worker_pid = failure.pid
    except AttributeError:  # exception types with __slots__
        pass
    if failure.exception is not None:
        err.__cause__ = failure.exception
    return err


def describe_exit(pid: int, exitcode: Optional[int]) -> str:
    """``DataLoader worker (pid N) is killed by signal: Killed.`` or
    ``... exited unexpectedly with exit code 3.``, with the likely cause."""
    if exitcode is not None and exitcode < 0:
        signum = -exitcode
        try:
            name = signal.strsignal(signum) or f"signal {signum}"
        except ValueError:
            name = f"signal {signum}"
        text = f"DataLoader worker (pid {pid}) is killed by signal: {name}."
        hint = _SIGNAL_HINTS.get(signum)
        return f"{text} {hint}" if hint else text
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly with exit code {exitcode}."


def describe_indices(indices: Any, limit: int = 16) -> str:
    """A short rendering of a batch's sample indices."""
    if indices is None:
        return "its next samples (iterable dataset)"
    if isinstance(indices, (list, tuple)):
        shown = ", ".join(str(i) for i in indices[:limit])
        more = f", ... ({len(indices)} in all)" if len(indices) > limit else ""
        return f"sample indices [{shown}{more}]"
    return f"sample index {indices}"
