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
from dataclasses import dataclass
from typing import Any, Optional

import cloudpickle

from .transport.messages import Failure, Fatal

#: Reasons shown next to a signal that killed a worker, by signal name
#: (names, not numbers: not every platform has every signal).
_SIGNAL_HINTS = {
    "SIGKILL": (
        "SIGKILL usually comes from the kernel's out-of-memory killer: lower batch_size, "
        "prefetch_factor or num_workers, or give the job more memory (see `dmesg`)."
    ),
    "SIGBUS": (
        "SIGBUS means memory that was mapped is no longer backed: a memory-mapped file "
        "that was truncated or replaced while in use (np.load(mmap_mode=...), a record "
        "format read through mmap), or shared memory (/dev/shm) filled by tensors your own "
        "code shares (conveyor's transport reserves its memory up front and uses no /dev/shm)."
    ),
    "SIGSEGV": (
        "SIGSEGV is a crash inside native code (a C extension, a decoder, a library that is "
        "not fork-safe): try multiprocessing_context='spawn' or num_workers=0 to find it."
    ),
}


class WorkerDiedError(RuntimeError):
    """A worker process ended while it still had work: killed by a signal,
    an exit code, or ``SystemExit``/``KeyboardInterrupt`` raised in user code."""


class TransportError(RuntimeError):
    """A batch could not cross between the main process and a worker:
    pickling its task, reading or unpickling its result, mapping its memory.
    The original exception is the ``__cause__``."""


def _safe(call: Any, fallback: str) -> str:
    try:
        return str(call())
    except Exception:
        return fallback


def _pickled_if_it_travels(obj: Any) -> Optional[bytes]:
    """``obj`` pickled, if it also unpickles here; else None. By reference
    first; then by value with cloudpickle, which also gives back the user's
    own class for one defined in ``__main__`` under spawn (cloudpickle
    recognises the classes it sent to the worker)."""
    for dumps in (pickle.dumps, cloudpickle.dumps):
        try:
            data = dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(data)
            return data
        except BaseException:  # a __reduce__ may raise anything
            continue
    return None


def capture_failure(worker_id: Optional[int], where: str) -> Failure:
    """Describe the exception being handled, for sending to the main process.
    Never raises: whatever the exception does when printed or pickled, its
    type name and traceback text get through."""
    exc_type, exc, tb = sys.exc_info()
    text = _safe(lambda: "".join(traceback.format_exception(exc_type, exc, tb)), "")
    type_name = _safe(lambda: exc_type.__qualname__ if exc_type is not None else "Exception", "Exception")
    if not text:
        text = f"Traceback unavailable (printing it failed)\n{type_name}\n"
    exception_bytes = _pickled_if_it_travels(exc)
    return Failure(
        worker_id=worker_id,
        pid=os.getpid(),
        where=where,
        exc_type_name=type_name,
        traceback_text=text,
        exception_bytes=exception_bytes,
        type_bytes=None if exception_bytes is not None else _pickled_if_it_travels(exc_type),
    )


def _loads(data: Optional[bytes]) -> Any:
    """Unpickle what the worker sent; None if this process cannot (a class
    it cannot import, a constructor that raises)."""
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except BaseException:
        return None


class _KeyErrorMessage(str):
    """KeyError prints its argument with repr(); this keeps newlines readable."""

    def __repr__(self) -> str:
        return str(self)


def _exception_type(failure: Failure, original: Any) -> type:
    if isinstance(original, BaseException):
        return type(original)
    carried = _loads(failure.type_bytes)
    if isinstance(carried, type) and issubclass(carried, BaseException):
        return carried
    import builtins

    found = getattr(builtins, failure.exc_type_name, None)
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return RuntimeError


def _instantiate(exc_type: type, msg: str) -> BaseException:
    """``exc_type(msg)`` if that keeps the message as it is; else a RuntimeError."""
    if exc_type is KeyError:
        return KeyError(_KeyErrorMessage(msg))
    try:
        err = exc_type(msg)
        if str(err) == msg:
            return err
    except Exception:  # other required arguments, a __str__ that raises, ...
        pass
    return RuntimeError(msg)


def rebuild_exception(failure: Failure, context: str = "") -> BaseException:
    """An exception of the original type whose message starts like torch's
    (``Caught KeyError in DataLoader worker process 0.``), then conveyor's
    ``context`` and the worker's traceback.

    The original exception object, when it crossed the pipe, is chained as
    ``__cause__`` and kept on ``.original``. Never raises: when the type
    cannot be rebuilt with that message, it is a RuntimeError that names it.
    """
    head = f"Caught {failure.exc_type_name} {failure.where}."
    if context:
        head += f" {context}"
    msg = f"{head}\nOriginal {failure.traceback_text}"
    original = _loads(failure.exception_bytes)
    err = _instantiate(_exception_type(failure, original), msg)
    for name, value in (("original", original), ("worker_id", failure.worker_id), ("worker_pid", failure.pid)):
        try:
            setattr(err, name, value)
        except Exception:  # exception types with __slots__ or a strict __setattr__
            pass
    if isinstance(original, BaseException):
        err.__cause__ = original
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
        try:
            hint = _SIGNAL_HINTS.get(signal.Signals(signum).name)
        except ValueError:
            hint = None
        return f"{text} {hint}" if hint else text
    return f"DataLoader worker (pid(s) {pid}) exited unexpectedly with exit code {exitcode}."


def describe_indices(indices: Any, limit: int = 16) -> str:
    """A short rendering of a batch's sample indices."""
    if indices is None or (isinstance(indices, (list, tuple)) and all(i is None for i in indices)):
        return "its next samples (iterable dataset)"
    if isinstance(indices, (list, tuple)):
        shown = ", ".join(_safe(lambda i=i: i, "?") for i in indices[:limit])
        more = f", ... ({len(indices)} in all)" if len(indices) > limit else ""
        return f"sample indices [{shown}{more}]"
    return f"sample index {indices}"


def describe_error(exc: BaseException) -> str:
    """``TypeName: message``, even when the message cannot be printed."""
    try:
        text = str(exc)
    except Exception:
        text = "<its message could not be printed>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def add_note(error: BaseException, note: str) -> None:
    """Add a line to ``error``'s traceback (Python 3.11+; nothing before)."""
    add = getattr(error, "add_note", None)
    if add is not None:
        try:
            add(note)
        except Exception:
            pass


#: Raised by user code to end the process: reported as the worker's end,
#: never rebuilt and raised in the main process.
_ENDING_TYPES = ("SystemExit", "KeyboardInterrupt")


def worker_ended_error(fatal: Fatal, pid: int) -> Optional[WorkerDiedError]:
    """The error for ``SystemExit``/``KeyboardInterrupt`` raised in user code
    (None for any other Fatal): torch's words for the exit, then what was
    raised, where, and the worker's traceback."""
    failure = fatal.failure
    if failure.exc_type_name not in _ENDING_TYPES:
        return None
    if fatal.batch_index is not None:
        doing = f"while loading batch {fatal.batch_index} ({describe_indices(fatal.indices)})"
    else:
        doing = "while starting"
    error = WorkerDiedError(
        f"DataLoader worker (pid(s) {pid}) exited unexpectedly with exit code {fatal.exit_code}: "
        f"{failure.exc_type_name} was raised {failure.where} {doing} (conveyor: worker {fatal.worker_id}).\n"
        f"Original {failure.traceback_text}"
    )
    error.exit_code = fatal.exit_code  # type: ignore[attr-defined]  # (for callers that read it, as torch's)
    error.__cause__ = rebuild_exception(failure)
    return error


def batch_error(failure: Any, who: str, batch_index: int, indices: Any) -> BaseException:
    """The exception a batch's loading raised in ``who`` ("worker pid 12"),
    rebuilt with its context; ``batch_index`` and ``indices`` set on it when
    it takes attributes."""
    error = rebuild_exception(failure, f"(conveyor: {who}, batch {batch_index}, {describe_indices(indices)})")
    for name, value in (("batch_index", batch_index), ("indices", indices)):
        try:
            setattr(error, name, value)
        except Exception:
            pass
    return error


def death_error(pid: int, exitcode: Optional[int], worker_id: int, doing: str, crash_stack: str) -> WorkerDiedError:
    """A worker that died: how (signal or code), what it was doing, and its
    Python stack if it crashed."""
    text = f"{describe_exit(pid, exitcode)} (conveyor: worker {worker_id}. {doing})"
    if crash_stack:
        text += f"\nIts Python stack when it crashed:\n{crash_stack}"
    return WorkerDiedError(text)


#: What Python prints when a process started by multiprocessing runs the
#: parent's main script again and that script starts processes itself.
_UNGUARDED_MAIN = ("bootstrapping phase", "freeze_support()")


def start_death_error(pid: int, exitcode: Optional[int], worker_id: int, method: str, printed: str) -> WorkerDiedError:
    """A worker that died while starting, before it could report: how, and
    what it printed then (its own error), with the fix when it is the
    classic one (a script without ``if __name__ == "__main__":``)."""
    text = (
        f"{describe_exit(pid, exitcode)} (conveyor: worker {worker_id} died while starting, under {method}, before "
        f"it was ready.)"
    )
    if printed:
        text += f"\nWhat it printed while starting:\n{printed}"
    else:
        text += " It printed nothing conveyor could keep; look for its error in this process's stderr."
    if any(mark in printed for mark in _UNGUARDED_MAIN):
        text += (
            f"\nFix: under {method}, each worker runs your main script again before it starts. Put the code "
            f'that builds and iterates the DataLoader under `if __name__ == "__main__":` (or use '
            f'multiprocessing_context="spawn": conveyor\'s spawn workers do not run your script again).'
        )
    return WorkerDiedError(text)


def transport_error(doing: str, what: str, worker: str, cause: BaseException, where: str = "") -> TransportError:
    """A message that could not cross: ``doing`` ("could not send the task
    of") ``what`` ("batch 3 (sample indices [6, 7])") for/from ``worker``;
    ``where`` is the traceback text of the failure, if any."""
    direction = "for" if "task" in doing else "from"
    text = (
        f"conveyor: {doing} {what} {direction} {worker}: {describe_error(cause)}. The loader stopped "
        f"its workers; the cause is chained below."
    )
    if where:
        text += f"\nWhere it failed (most recent call last):\n{where}"
    error = TransportError(text)
    error.__cause__ = cause
    return error


@dataclass(frozen=True)
class WorkerNames:
    """How the main process's errors name the workers of one place (each
    place's own: loading/places.py); ``{id}`` and ``{pid}`` are filled in."""

    #: One worker and several, as in "2 worker processes".
    one: str
    many: str
    #: The worker whose batch failed: "worker pid {pid}".
    in_batch: str
    #: The worker whose user code ended it (set-up): "worker {id}, pid {pid}".
    starting: str


def live_workers_error(workers: list, names: WorkerNames) -> TypeError:
    """Why a loader holding live persistent workers cannot be pickled or
    deep-copied (torch refuses too, less clearly), and what to do instead."""
    some = names.one if len(workers) == 1 else names.many
    return TypeError(
        f"cannot pickle or deep-copy a DataLoader that holds live persistent workers: {len(workers)} worker "
        f"{some} ({', '.join(workers)}), kept between passes by persistent_workers=True. Worker {names.many}, and "
        f"the pipes and shared memory that reach them, cannot be pickled. Pickle or copy the loader before its "
        f"first pass, or build a new DataLoader with the same arguments and give it this one's state_dict() "
        f"(load_state_dict) to go on where it stands."
    )
