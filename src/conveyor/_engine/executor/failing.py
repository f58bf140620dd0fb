"""The errors the executor fails with, built from what it knows when a
worker breaks the pool: each names the worker, the batch and its indices.

    a worker's Fatal (user code ended it)        ──▶ fatal_error
    a message that could not cross (Broken)      ──▶ broken_error
    a batch later than ``timeout``               ──▶ timeout_error
    (a worker that died: Workers.exit_error, which knows how it died)

The executor raises each through its one failure path (``_fail``).
"""

from __future__ import annotations

from traceback import format_tb
from typing import Any, Callable, Optional

from ..errors import WorkerNames, describe_indices, rebuild_exception, transport_error, worker_ended_error
from ..transport.messages import Fatal
from ..workers.protocol import Broken
from .watchdog import late_text


def fatal_error(
    worker: Any, fatal: Fatal, names: WorkerNames, epoch_id: int, what: Callable[[Optional[int]], str]
) -> BaseException:
    """User code ended ``worker`` (set-up failed, SystemExit, KeyboardInterrupt),
    named as its place names it (``names``)."""
    ended = worker_ended_error(fatal, worker.pid)
    if ended is not None:
        return ended
    error = rebuild_exception(fatal.failure)
    if fatal.stage == "read":
        return broken_error(Broken(worker, None, "could not read the task of", error), epoch_id, what)
    who = names.starting.format(id=worker.id, pid=worker.pid)
    return rebuild_exception(fatal.failure, f"(conveyor: while starting {who})")


def broken_error(broken: Broken, epoch_id: Optional[int], what: Callable[[Optional[int]], str]) -> BaseException:
    """A message could not cross between this process and a worker: the
    batch (the one it names, else the one the worker had in hand) and the cause."""
    batch_index = broken.batch_index
    if batch_index is None and epoch_id is not None:
        sent = broken.worker.current(epoch_id)
        batch_index = sent.batch_index if sent is not None else None
    # The cause's traceback starts in a frame below the executor's and its
    # frames lead back (f_back) to the iterator: kept, it would keep the
    # broken loader alive for good. Its text goes into the message instead.
    cause = broken.cause
    below = cause.__traceback__.tb_next if cause.__traceback__ is not None else None
    where = "".join(format_tb(below)) if below is not None else ""
    cause.__traceback__ = None
    broken.__traceback__ = None
    return transport_error(broken.doing, what(batch_index), broken.worker.describe(), cause, where)


def timeout_error(timeout_s: float, busy: list, wanted: Optional[int], task: Any) -> RuntimeError:
    """The batch the loop waited for (``wanted``, None out of order) was
    later than ``timeout``: who was loading what."""
    wanted_text = describe_indices(task.indices) if task is not None else ""
    return RuntimeError(
        f"DataLoader timed out after {timeout_s} seconds. (conveyor: {late_text(busy, wanted, wanted_text)}. "
        f"The workers were stopped; raise timeout=, or look for a slow or stuck sample.)"
    )
