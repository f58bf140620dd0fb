"""The workers a loader keeps between passes (``persistent_workers=True``).

    DataLoader.__iter__ ──PersistentWorkers.for_pass()──▶ the kept executor
        (started at the first pass, and again after one broke or was shut
        down, as an interrupted pass does: iteration.py; the pass
        before hands it over first: its pin thread stops driving it)
    DataLoader collected ──▶ the executor shut down (a finalizer)

Without persistent workers each pass starts and owns an executor of its
own (:func:`started`).
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from .._engine.executor.core import PoolExecutor
from ._plan_parts import Plan


def started(executor: PoolExecutor) -> PoolExecutor:
    executor.start()
    return executor


class PersistentWorkers:
    """One loader's kept executor, and the pass that drives it now."""

    def __init__(self) -> None:
        self.executor: Optional[PoolExecutor] = None
        self._finalizer: Optional[weakref.finalize] = None
        #: The latest pass over these workers (a later one takes them over).
        self._latest: Optional[weakref.ref] = None

    def for_pass(self, loader: Any, plan: Plan, base_seed: int) -> PoolExecutor:
        """The executor for a new pass of ``loader``: taken over from the
        pass before, started anew if there was none or it broke or was
        shut down (shut down
        when ``loader`` is collected)."""
        latest = self._latest() if self._latest is not None else None
        if latest is not None:
            latest.hand_over_workers()
        if self.executor is None or not self.executor.usable:
            if self._finalizer is not None:
                self._finalizer()  # stops the broken pool and forgets it
            self.executor = started(PoolExecutor(plan.loading, plan.running, base_seed))
            self._finalizer = weakref.finalize(loader, self.executor.shutdown)
        return self.executor

    def taken_by(self, iterator: Any) -> None:
        """``iterator``'s pass drives the workers now."""
        self._latest = weakref.ref(iterator)

    def __reduce__(self) -> tuple:
        """Refused while workers are kept (the executor names them); else a
        fresh holder, so that a loader without live workers pickles."""
        if self.executor is not None:
            return self.executor.__reduce__()
        return (PersistentWorkers, ())
