"""Saying so when the training loop has waited long for a batch.

A stuck ``__getitem__`` (a lock, a network read without a timeout, a
deadlock in a native library) looks exactly like a slow one: the loop just
waits. While the main process waits in ``next()`` and no result has arrived
for ``stall_warning`` seconds, the watchdog warns once (again only after a
result has arrived), naming each busy worker, its pid, its batch and
indices, how long it has been at it, and its Python stack. Iteration goes
on: slowness is not an error (``timeout=`` makes it one).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from ..errors import describe_indices


class StallWarning(RuntimeWarning):
    """No batch has arrived for ``stall_warning`` seconds; the message says
    what each worker is doing. Turn it into an error with
    ``warnings.simplefilter("error", StallWarning)``."""


@dataclass(frozen=True)
class BusyWorker:
    """What one worker was doing when the watchdog looked."""

    worker: str  # "worker 0 (pid 123)"
    doing: str  # "loading batch 3 (sample indices [6, 7])"
    busy_s: float
    stack: str = ""
    #: Batch indices of this epoch it has been given, the one in hand first.
    queued: tuple = ()


class StallWatchdog:
    """The clock of one executor: since when nothing has arrived."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._since = time.monotonic()
        self._warned = False

    def waiting(self) -> None:
        """``next()`` began to wait: time spent outside it does not count."""
        self._since = time.monotonic()
        self._warned = False

    def arrived(self) -> None:
        """A result arrived: the loader is moving."""
        self._since = time.monotonic()
        self._warned = False

    def remaining_s(self) -> Optional[float]:
        """Seconds until a warning is due; None when off or already given."""
        if self.stall_s <= 0 or self._warned:
            return None
        return max(0.0, self._since + self.stall_s - time.monotonic())

    def wait_s(self, deadline: Optional[float]) -> Optional[float]:
        """How long the executor may wait now: until the warning is due or
        the ``deadline`` (a time.monotonic() reading) passes; None: no limit."""
        waits = [max(0.0, deadline - time.monotonic())] if deadline is not None else []
        remaining = self.remaining_s()
        if remaining is not None:
            waits.append(remaining)
        return min(waits) if waits else None

    def due(self) -> bool:
        remaining = self.remaining_s()
        return remaining is not None and remaining <= 0

    def report(self, busy: list[BusyWorker]) -> str:
        """The warning's text (and the watchdog counts it as given)."""
        self._warned = True
        waited = time.monotonic() - self._since
        lines = [
            f"conveyor: no batch has arrived for {waited:.0f} s (stall_warning={self.stall_s:g}); "
            f"iteration goes on. A sample that never finishes hangs the loop: look at the stacks below, "
            f"or set timeout= to make this an error."
        ]
        if not busy:
            lines.append("No worker has a batch in hand.")
        for entry in busy:
            lines.append(f"{entry.worker} has been {entry.doing} for {entry.busy_s:.0f} s. Its stack:")
            lines.append(_indent(entry.stack) if entry.stack else "    (unavailable)")
        return "\n".join(lines)


def busy_workers(
    workers: Iterable[Any], epoch_id: int, pending: Mapping[int, Any], starting: set, with_stacks: bool
) -> list[BusyWorker]:
    """What each worker (a workers.WorkerView) with something in hand is
    doing: starting up, or loading the batch of this epoch it began first
    (``pending``: batch index -> its Task). ``with_stacks`` asks
    each one for its Python stack (a signal; about 50 ms each)."""
    now = time.monotonic()
    busy = []
    for worker in workers:
        sent = worker.current(epoch_id)
        if worker.id in starting:
            doing = "starting (imports, seeding, worker_init_fn)"
        elif sent is not None and sent.batch_index in pending:
            doing = f"loading batch {sent.batch_index} ({describe_indices(pending[sent.batch_index].indices)})"
        else:
            continue
        queued = tuple(s.batch_index for s in worker.outstanding if s.epoch_id == epoch_id)
        stack = worker.stack_text() if with_stacks else ""
        busy.append(BusyWorker(worker.describe(), doing, now - worker.busy_since, stack, queued))
    return busy


def late_text(busy: list[BusyWorker], wanted: Optional[int], wanted_indices: str) -> str:
    """For a timeout: which batch the loop waits for (``wanted``, in plan
    order; None when batches come as they are ready) and who has what."""
    parts = []
    if wanted is not None:
        parts.append(f"waiting for batch {wanted}" + (f" ({wanted_indices})" if wanted_indices else ""))
    for entry in busy:
        text = f"{entry.worker} has been {entry.doing} for {entry.busy_s:.1f} s"
        if wanted is not None and wanted in entry.queued[1:]:
            text += f"; batch {wanted}, the one the loop waits for, is queued behind it"
        parts.append(text)
    return "; ".join(parts) if parts else "no worker had a batch in hand"


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
