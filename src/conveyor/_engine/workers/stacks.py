"""A worker's Python stack, for the user: when it crashes, and when it stalls.

    main: StackFile (one anonymous file per worker) ──fd──▶ worker
    worker: faulthandler writes every thread's stack into it
              * on a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL), then dies
              * on the stack signal (stack_signal()), sent by the main process, then carries on
    main: reads the file: the crash report names where the worker was; the
          stall watchdog shows where it is stuck

faulthandler writes from a C signal handler, so this works even when the
worker is stuck in native code holding the GIL. The dump goes to the file,
never to the terminal (a crashed worker used to print a fatal-error dump
into the user's output, and into test logs).

Ownership: the main process creates the file (a memfd, or a temporary file
unlinked at once: ``portable.scratch_file``) and closes it with the pool;
the worker only writes. Both share one file offset (one open file
description), so the main process rewinds it before it asks for a stack.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
import traceback
from typing import Optional

from .. import portable

#: How long to wait for a worker to write its stack once asked.
_DUMP_WAIT_S = 1.0
#: The dump is complete once the file has not grown for this long.
_DUMP_SETTLE_S = 0.05
#: At most this much of a dump is read (a worker with many threads).
_MAX_DUMP_BYTES = 64 * 1024


def thread_stack(ident: Optional[int]) -> str:
    """The Python stack of this process's thread ``ident`` now ("" when it
    is gone or unknown): a worker thread's, or the loop's for the inline worker."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    return "".join(traceback.format_stack(frame)) if frame is not None else ""


def stack_signal() -> Optional[int]:
    """The signal that asks a worker for its stack (None: this platform has
    none to spare). A real-time signal where there are some: user code
    rarely claims one (SIGUSR1/2 are often taken by frameworks). Decided
    per call, from ``portable.LINUX_PATHS``, which a worker shares with its
    main process."""
    if portable.realtime_signals():
        return signal.SIGRTMIN + 3
    return getattr(signal, "SIGUSR2", None)


def install(fd: Optional[int]) -> None:
    """In a worker: write stacks into ``fd`` on a crash and on request."""
    if fd is None:
        return
    # A forked worker inherits faulthandler as "enabled" (pytest, or the user,
    # enabled it in the parent), and enable() then changes only the file, not
    # the signal handlers: a library that took over SIGSEGV in the parent
    # afterwards (Ray's driver does) would keep it and the crash would go
    # unreported. Disabling first installs faulthandler's handlers anew.
    faulthandler.disable()
    faulthandler.enable(file=fd, all_threads=True)
    signum = stack_signal()
    if signum is not None and hasattr(faulthandler, "register"):  # (not on Windows)
        faulthandler.register(signum, file=fd, all_threads=True)


class StackFile:
    """Main side: the file one worker writes its stacks into, and the
    signal that asks for one (chosen when the worker is started, as the
    worker chooses it)."""

    def __init__(self) -> None:
        self.fd = portable.scratch_file("stack")
        self.signal = stack_signal()

    def _text(self) -> str:
        data = os.pread(self.fd, _MAX_DUMP_BYTES, 0)
        return data.decode("utf-8", "replace").strip()

    def crash_text(self) -> str:
        """What the worker wrote when it crashed ("" if nothing)."""
        try:
            return self._text()
        except OSError:
            return ""

    def request(self, pid: int) -> str:
        """Ask the running worker ``pid`` for its stack; "" if none came."""
        if self.signal is None:
            return ""
        try:
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
            os.kill(pid, self.signal)
        except OSError:
            return ""
        deadline = time.monotonic() + _DUMP_WAIT_S
        size = 0
        while time.monotonic() < deadline:
            time.sleep(_DUMP_SETTLE_S)
            grown = os.fstat(self.fd).st_size
            if grown and grown == size:
                break
            size = grown
        text = self.crash_text()
        try:  # leave the file empty for a crash report
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)
        except OSError:
            pass
        return text

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
