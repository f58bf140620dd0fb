"""How user code ends a worker: the Fatal it sends, the code it exits with.

    SystemExit / KeyboardInterrupt in user code (a process or thread worker)
        ──▶ Ending(fatal_message(...)) ──▶ the worker loop sends the Fatal and ends
    a failure while setting up or reading a task ──▶ fatal_message(...) ──▶ sent, then the worker ends

A worker process exits with the code Python would give the exception
(:func:`exit_code`); a thread worker's ends its thread. Inline, these
exceptions are raised as they are (loading/places.py).
"""

from __future__ import annotations

import sys
from typing import Optional

from ..errors import capture_failure
from ..transport.messages import Fatal, Task

#: The exit code of a worker interrupted by KeyboardInterrupt (as a shell reports SIGINT).
INTERRUPTED_EXIT_CODE = 128 + 2


def exit_code(exc: Optional[BaseException]) -> int:
    """The code a process ends with when ``exc`` goes uncaught, as Python's."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED_EXIT_CODE
    return 1


def fatal_message(wid: int, where: str, stage: str, task: Optional[Task] = None) -> Fatal:
    """The exception being handled, as the Fatal message the worker sends before it ends."""
    exc = sys.exc_info()[1]
    return Fatal(
        worker_id=wid,
        failure=capture_failure(wid, where),
        exit_code=exit_code(exc),
        stage=stage,
        epoch_id=task.epoch_id if task is not None else None,
        batch_index=task.batch_index if task is not None else None,
        indices=task.indices if task is not None else None,
    )


class Ending(Exception):
    """User code asked the worker to end (SystemExit, KeyboardInterrupt); carries the Fatal to send."""

    def __init__(self, fatal: Fatal):
        super().__init__(fatal.failure.exc_type_name)
        self.fatal = fatal
