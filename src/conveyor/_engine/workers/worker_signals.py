"""What a worker process does on the signals a job gets, whatever handlers
its main process installed.

    signal                    in a worker              why
    SIGTERM, SIGHUP, SIGINT,  ignored                  a job's signals (``scancel``, a closed terminal, Ctrl-C,
    SIGUSR1, SIGUSR2                                   SLURM's ``--signal=USR1`` asking for a checkpoint) reach
                                                       the whole process group and are the main process's to
                                                       act on: it stops the workers when it stops, and when it
                                                       dies the kernel kills them (``portable.die_with_parent``)
    SIGALRM                   the default: it dies     an alarm is per process; a worker's own ``signal.alarm``
                                                       (a per-sample timeout) installs its handler first
    any other signal          a Python handler of the main process is put back to the default

A signal the main process ignores (``SIG_IGN``, as ``nohup`` leaves SIGHUP)
stays ignored, as it would across ``exec``. A forked worker inherits the
main process's Python handlers, and a forkserver's children those their
server had (from the user's modules it preloaded); without this a SIGTERM
sent to the whole job ran the user's checkpoint handler in every worker,
each writing the checkpoint with its own (wrong) position (issue #32).

:func:`reset` runs first in every worker entry, before any user code
(``worker_init_fn`` included, which may install handlers of its own: they
work, since they come after), and again once a spawn or forkserver
worker's config has loaded (unpickling it may import the user's modules).
Conveyor's own handlers come after it too (the stack signal:
``stacks.install``).

multiprocessing's forkserver is the parent of every forkserver worker, and
the kernel kills them when it ends: it ignores the job's signals too
(:func:`shield_forkserver`), and ends with the main process as before (its
pipe from the main process reaches end of file).
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any, Optional

#: Signals a worker takes as a fresh process would: the default action.
_DEFAULT = ("SIGALRM",)
#: Signals meant for the main process, which a worker ignores.
_IGNORED = ("SIGTERM", "SIGHUP", "SIGINT", "SIGUSR1", "SIGUSR2")


def _wanted(name: str) -> Any:
    return signal.SIG_IGN if name in _IGNORED else signal.SIG_DFL


def reset() -> None:
    """Give this worker process the dispositions the table above lists.
    Called in the worker's main thread (the only one that may set them)."""
    named = {getattr(signal, name): name for name in _DEFAULT + _IGNORED if hasattr(signal, name)}
    for signum in signal.valid_signals():
        try:
            current = signal.getsignal(signum)
        except (OSError, ValueError):  # (a number with no signal behind it)
            continue
        if current is signal.SIG_IGN:
            continue  # (ignored in the main process: ignored here too)
        name = named.get(signum)
        if name is not None:
            wanted = _wanted(name)
        elif callable(current):
            wanted = signal.SIG_DFL  # (any other handler of the main process's)
        else:
            continue
        if current is not wanted:
            try:
                signal.signal(signum, wanted)
            except (OSError, ValueError):  # (SIGKILL, SIGSTOP; a signal the platform will not let be set)
                pass


# ------------------------------------------------------- the forkserver
#: The signals multiprocessing's forkserver must outlive: a job sends them
#: to its whole process group, and the forkserver's end is the end of
#: every worker it started (the kernel kills them with it).
_SERVER_IGNORES = ("SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")
#: Imported into the forkserver before it serves (see preload_in_forkserver).
MODULE = __name__


def in_forkserver() -> bool:
    """Whether this code runs inside multiprocessing's forkserver, while it
    loads its preloaded modules (the user's script, run again, among them);
    not in a process it forked, which starts inside its frames too."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(getattr(forkserver, "main", None), "__code__", None)
    child = getattr(getattr(forkserver, "_serve_one", None), "__code__", None)
    if server is None:
        return False
    frames = set()
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        frames.add(frame.f_code)
        frame = frame.f_back
    return server in frames and child not in frames


def shield_forkserver() -> None:
    """In multiprocessing's forkserver: ignore the job's signals that would
    end it (which ends every forkserver worker with it, each then reported
    dead), and give each process it forks what it had before, so that the
    user's own forkserver processes keep their defaults. The signals are
    blocked while it forks: one sent to a child before the child has its
    defaults back waits, and comes once it has them, instead of being
    ignored (``terminate()`` right after ``start()``). Runs when conveyor
    is imported; does nothing in any other process."""
    if not in_forkserver():
        return
    before = {}
    for name in _SERVER_IGNORES:
        signum = getattr(signal, name, None)
        if signum is not None:
            before[signum] = signal.signal(signum, signal.SIG_IGN)
    can_block = hasattr(signal, "pthread_sigmask")

    def block() -> None:
        if can_block:
            signal.pthread_sigmask(signal.SIG_BLOCK, list(before))

    def unblock() -> None:
        if can_block:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, list(before))

    def back_in_child() -> None:
        for signum, handler in before.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        unblock()

    os.register_at_fork(before=block, after_in_parent=unblock, after_in_child=back_in_child)


def preload_in_forkserver() -> None:
    """Have multiprocessing's forkserver import this module when it starts
    (a script that imports conveyor only inside its main guard would not
    have it there). No effect on a forkserver already running."""
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # (multiprocessing's own, private: its list of modules to preload)
        modules = list(server._preload_modules)
    except (AttributeError, TypeError):
        return
    if MODULE not in modules:
        server._preload_modules = [*modules, MODULE]


shield_forkserver()
