"""One pass over the data: the plan, the executor, delivery to the loop.

    iter(loader) ──▶ LoaderIterator(start, index sampler's batches, the loader's plan)
        plan:      replay (a resumed sampler that cannot jump) ──▶ _FirstDrawAhead
                   ──▶ _plan: Task(pass id, index, seed, indices) for each batch
        executor:  begin_epoch(plan) ... next_batch() ──▶ Delivered(batch_index, data | error, copies, timings, skipped)
        delivery:  skipped samples ──▶ SkipLedger (skip_bad_samples: log, stats, budget);
                   a batch whose every sample was skipped ──▶ the next one
                   [pin thread] ──▶ stats.batch (StatsRecorder) ──▶ progress.delivered(index)
                   ──▶ the batch (or its error)

Each ``next()`` is timed (the loop's wait, and its compute since the
previous one) for the loader's stats, and opens torch's profiler range
while a profiler records.

The pass owns its executor unless workers persist (then the loader does),
and its finalizer stops the pin thread and the owned workers whether the
pass is exhausted, abandoned or collected.
"""

from __future__ import annotations

import itertools
import sys
import threading
import warnings
import weakref
from functools import partial
from time import perf_counter
from typing import Any, Callable, Iterator, Optional

from ._engine.executor.records import Delivered, Executor
from ._engine.executor.pin import PinThread, pin_tree
from ._engine.transport.messages import Task
from .plan import Plan
from .sampler.replay import replay
from .skips import BadSampleBudgetExceeded, SkipLedger
from .state import EpochProgress, Start
from .stats import StatsRecorder

#: Identifies each pass over the data, so a persistent pool drops the
#: results of an abandoned pass (set_epoch may repeat epoch numbers).
_pass_ids = itertools.count(1)


class LoaderIterator:
    """One pass over the data. Owns its executor unless workers persist."""

    def __init__(
        self, loader: Any, executor: Executor, owned: bool, start: Start, indices: Iterator, plan: Plan, started_at: float,
        dataset_epoch: Optional[int] = None,
    ):  # fmt: skip
        self._loader = loader  # (for len(iterator) only)
        self._plan = plan
        progress, resume = start.progress, start.resume
        self.epoch = start.epoch
        self.base_seed = start.base_seed
        self._progress = progress
        self._num_yielded = resume.count if resume is not None else 0
        first, skip = (resume.position, resume.delivered_ahead) if resume is not None else (0, frozenset())
        if resume is not None and resume.sampler_skip:  # (resume mechanism 2: docs/architecture.md)
            indices = replay(indices, resume.sampler_skip, resume.first_batch, plan.sampling.sampler_text)
        drawn = _FirstDrawAhead(indices, partial(progress.note_first_draw, plan.sampling.index_sampler, first=first == 0))
        progress.draw_first = drawn.draw_first
        epoch_id = next(_pass_ids)
        tasks = _plan(drawn, epoch_id, start.base_seed, first, skip, plan.loading.kind, dataset_epoch)
        try:
            starting = executor.begin_epoch(epoch_id, tasks, first, skip, start.copies)
        except BaseException:  # (an iterable's __iter__ or load_state_dict raised, num_workers=0)
            if owned:
                executor.shutdown()
            raise
        if starting is not None:  # (a state saved before the first batch resumes the copies from here)
            progress.copies = starting
        # With workers, batches are pinned in a thread (as torch); in-process, inline.
        delivering, num_workers = plan.delivering, plan.running.num_workers
        pinning = delivering.pin and num_workers > 0
        self._pin_thread = (
            PinThread(executor.next_batch, delivering.pin_ahead, _pin_delivered, first=executor.send_first)
            if pinning
            else None
        )
        self._pin_inline = delivering.pin and not num_workers
        self._next_batch = self._pin_thread.next_batch if self._pin_thread else executor.next_batch
        # Profilers see the range torch.utils.data opens around each next().
        self._profile_name = "enumerate(DataLoader)#{}.__next__".format(
            "_MultiProcessingDataLoaderIter" if num_workers > 0 else "_SingleProcessDataLoaderIter"
        )
        self._stats = delivering.stats
        self._pass_id = 0
        budget = delivering.skip_budget
        self._skips = SkipLedger(budget, delivering.epoch_samples, progress.skipped) if budget is not None else None
        if self._stats is not None:
            self._pass_id = self._stats.begin_pass(started_at, _length(plan), num_workers, plan.running.method)
        self._finalizer = weakref.finalize(
            self, _close_iteration, self._pin_thread, executor if owned else None, progress, self._stats, self._pass_id
        )

    def __iter__(self) -> "LoaderIterator":
        return self

    def hand_over_workers(self) -> None:
        """A later ``iter(loader)`` takes the persistent workers over: this
        pass's pin thread stops driving them (its next() then says so).
        Without a pin thread the workers are driven from the caller's
        thread, and this pass goes on with the newer pass's batches, as
        torch's one reset iterator does."""
        if self._pin_thread is not None:
            self._pin_thread.close()

    def __next__(self) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and _profiling(torch):  # (checked per call: torch may be imported late)
            with torch.autograd.profiler.record_function(self._profile_name):
                return self._next()
        return self._next()

    def _next(self) -> Any:
        if self._progress.finished:
            raise StopIteration  # (an ended pass stays ended, as any iterator; its workers are gone)
        called_at = perf_counter()
        while True:
            try:
                delivered = self._next_batch()
            except StopIteration as end:
                if end.value is not None:  # where an iterable dataset's copies stand at the end
                    self._progress.copies = end.value
                self._progress.finished = True
                if self._stats is not None:
                    self._stats.end_pass(self._pass_id, called_at, perf_counter())
                self._close()
                raise StopIteration from None
            if delivered.skipped:
                self._account_skips(delivered.skipped)
            if not delivered.empty:
                break
            self._progress.delivered(delivered.batch_index)  # (every sample skipped: nothing to give)
        if self._pin_inline:
            delivered = _pin_delivered(delivered)
        if self._stats is not None:
            self._stats.batch(self._pass_id, delivered, called_at, perf_counter())
        self._progress.delivered(delivered.batch_index)
        if delivered.copies is not None:
            self._progress.copies = delivered.copies
        if delivered.error is not None:
            raise delivered.error
        self._num_yielded += 1
        self._check_length()
        return delivered.data

    def _account_skips(self, records: tuple) -> None:
        """Samples left out of a batch: counted, logged, checked against the
        budget (over it: the pass ends, with every skip in the error)."""
        if self._stats is not None:
            self._stats.skipped(records)
        if self._skips is None:  # (no budget: a skipped sample cannot happen)
            return
        try:
            self._skips.add(records)
        except BadSampleBudgetExceeded:
            self._close()
            raise

    def _check_length(self) -> None:
        plan = self._plan
        expected = plan.delivering.expected_length
        if plan.iterable and expected is not None and self._num_yielded > expected:
            message = (
                f"Length of IterableDataset {plan.loading.dataset} was reported to be {expected}(when "
                f"accessing len(dataloader)), but {self._num_yielded} samples have been fetched. "
            )
            if plan.running.num_workers > 0:
                message += (
                    "For multiprocessing data-loading, this could be caused by not properly configuring "
                    "the IterableDataset replica at each worker. (conveyor: shard it with "
                    "conveyor.ShardedIterable or get_worker_info().)"
                )
            warnings.warn(message, stacklevel=3)

    def _close(self) -> None:
        self._finalizer()

    def __len__(self) -> int:
        return len(self._loader)

    def __getstate__(self) -> dict:
        raise TypeError(f"{type(self).__name__} cannot be pickled; save loader.state_dict() instead")


def _plan(
    indices: Iterator, epoch_id: int, base_seed: int, first_index: int, skip: frozenset, kind: Any,
    dataset_epoch: Optional[int] = None,
) -> Iterator[Task]:  # fmt: skip
    """The pass's tasks from batch ``first_index`` on, each with its seed,
    the time the sampler took to draw it and the dataset's epoch
    (dataset_epoch.py), leaving out ``skip`` (the executor books each as
    it sends it). (A resumed sampler that cannot jump has already drawn and dropped the batches before ``first_index``: ``replay``.)"""
    batch_index = first_index
    while True:
        asked_at = perf_counter()
        try:
            batch = next(indices)
        except StopIteration:
            return
        if batch_index not in skip:
            # Map-style: the batch's own seed. Iterable: the base seed; the
            # fetcher derives each batch's from (worker, its batch count).
            seed = kind.batch_seed(base_seed, batch_index)
            sampler_s = perf_counter() - asked_at
            yield Task(epoch_id, batch_index, seed, batch, dataset_epoch=dataset_epoch, sampler_s=sampler_s)
        batch_index += 1


class _FirstDrawAhead:
    """The index sampler's batches, whose first one can be drawn ahead of
    time: a state saved before the first batch is delivered must name the
    epoch's draw (a shuffle not yet drawn from the global generator would
    be drawn anew after a resume): resume mechanism 3 (docs/architecture.md,
    "Resume mechanisms"; ``ResumeTracker._draw_pending`` draws it).
    ``on_first(batch)`` sees the first batch drawn. Thread-safe: the pin
    thread may iterate while the main thread saves."""

    def __init__(self, batches: Iterator, on_first: Callable[[Any], None]):
        self._batches = batches
        self._on_first: Optional[Callable[[Any], None]] = on_first
        self._ahead: list = []
        self._lock = threading.Lock()

    def draw_first(self) -> None:
        """Draw the first batch now, if it was not drawn yet."""
        with self._lock:
            if self._on_first is not None:
                self._draw()

    def _draw(self) -> None:
        on_first, self._on_first = self._on_first, None
        assert on_first is not None  # (drawn once)
        for batch in self._batches:
            self._ahead.append(batch)
            on_first(batch)
            break

    def __iter__(self) -> "_FirstDrawAhead":
        return self

    def __next__(self) -> Any:
        with self._lock:
            if self._on_first is not None:
                self._draw()
            if self._ahead:
                return self._ahead.pop()
            return next(self._batches)


def _pin_delivered(delivered: Delivered) -> Delivered:
    """The batch in pinned memory; its timings say how long that took."""
    if delivered.error is not None:
        return delivered
    started_at = perf_counter()
    data = pin_tree(delivered.data)
    timings = delivered.timings
    if timings is not None:
        timings = timings.with_pin(perf_counter() - started_at)
    return delivered._replace(data=data, timings=timings)


def _profiling(torch: Any) -> bool:
    """Whether a torch profiler is recording (cheap: a flag)."""
    try:
        return torch.autograd._profiler_enabled()
    except AttributeError:  # torch still importing, or an unusual build
        return False


def _length(plan: Plan) -> Optional[int]:
    """The pass's number of batches when known (for a progress bar's ETA)."""
    if plan.iterable:
        return plan.delivering.expected_length
    try:
        return len(plan.sampling.index_sampler)
    except Exception:  # no length, or a sampler whose __len__ fails: a bar without ETA
        return None


def _close_iteration(
    pin_thread: Optional[PinThread], executor: Any, progress: EpochProgress, stats: Optional[StatsRecorder], pass_id: int
) -> None:
    """End of one pass (exhausted, abandoned or collected): stop pinning,
    stop the workers when this pass owns them, and let the loader load a state."""
    if stats is not None:
        stats.abandon_pass(pass_id)
    progress.iterating = False
    shutdown = executor.shutdown if executor is not None else None
    if pin_thread is not None:
        pin_thread.close(then=shutdown)  # (the pin thread out of the executor first: pin.py)
    elif shutdown is not None:
        shutdown()
