"""Executors: who runs fetch + collate for each planned batch.

    loader iterator ──begin_epoch(plan)──▶ Executor ──next_batch()──▶ Delivered(index, data | error, progress)
                                             │
      InProcessExecutor (here): loads each batch in the calling thread (num_workers=0)
      ProcessExecutor (process_executor.py):
                         dispatch ──Tasks (slot k)──▶ workers (pool.py) ──results──▶ collect
                         ──▶ views on slot k (SlotPool.decode) ──▶ ReorderBuffer ──▶ Delivered

Both take the same tasks (batch index, sample indices, seed) and give the
same batches, whatever the number of workers. A failure of one batch is
that batch's ``Delivered.error`` and iteration goes on, as in torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Protocol

from .fetch import EndOfData, FetchSpec, fetch_in_main, make_fetcher


@dataclass(frozen=True)
class PlannedBatch:
    """One batch of the plan: its position in the epoch, its indices, its seed."""

    batch_index: int
    indices: Any
    seed: Optional[int]


@dataclass(frozen=True)
class Delivered:
    """One batch as the executor hands it out: its index in the epoch, and
    its data or the exception loading it raised (which still counts as
    delivered, as in torch). For an iterable dataset, ``copies`` is where
    each copy stood as of this batch (one per worker, or the one of
    ``num_workers=0``; a plain dict, see progress.py)."""

    index: int
    data: Any = None
    error: Optional[BaseException] = None
    copies: Optional[dict] = None
    #: Seconds spent in each stage of this batch, by stage name (for stats;
    #: None until stages are timed).
    timings: Optional[Mapping[str, float]] = None


class Executor(Protocol):
    """What the loader's iterator asks of an executor."""

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a pass over ``tasks`` (see ProcessExecutor.begin_epoch)."""

    def next_batch(self) -> Delivered:
        """The next batch; StopIteration at the end of the pass."""

    def shutdown(self) -> None:
        """Stop; safe to call twice."""


class InProcessExecutor:
    """Loads each batch in the caller's thread (``num_workers=0``)."""

    def __init__(self, spec: FetchSpec):
        self._fetcher = make_fetcher(spec)
        self._tasks: Iterator[PlannedBatch] = iter(())

    def begin_epoch(
        self,
        epoch_id: int,
        tasks: Iterator[PlannedBatch],
        first_index: int = 0,
        skip: frozenset = frozenset(),
        workers_resume: Optional[dict] = None,
    ) -> None:
        """Start a pass. Batches come in plan order here, so ``first_index``
        and ``skip`` (see :meth:`ProcessExecutor.begin_epoch`) change nothing.
        An iterable dataset's ``__iter__`` runs now, as in torch; its one
        copy continues from ``workers_resume`` (a one-worker progress) when given."""
        self._tasks = tasks
        if self._fetcher.spec.iterable:
            states = workers_resume["states"] if workers_resume is not None else [None]
            self._fetcher.restart(states[0])

    def next_batch(self) -> Delivered:
        """The next batch; StopIteration at the end of the epoch (its
        ``value``: where an iterable dataset's copy stands, as with workers)."""
        try:
            task = next(self._tasks)
        except StopIteration:
            raise StopIteration(self._copies()) from None
        try:
            data = fetch_in_main(self._fetcher, task.indices, task.seed)
        except EndOfData:
            raise StopIteration(self._copies()) from None
        except Exception as error:
            return Delivered(task.batch_index, error=error, copies=self._copies())
        return Delivered(task.batch_index, data, copies=self._copies())

    def _copies(self) -> Optional[dict]:
        """An iterable dataset: where its one copy stands, as a one-worker progress."""
        if not self._fetcher.spec.iterable:
            return None
        return {"states": [self._fetcher.state()], "retired": [], "next": 0}

    def shutdown(self) -> None:
        self._tasks = iter(())
