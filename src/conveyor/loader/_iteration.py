"""One pass over the data: the plan, the executor, delivery to the loop.

    iter(loader) ──▶ LoaderIterator(start, index sampler's batches, the loader's plan)
        plan:      the sampler's batches (_first_draw.py: replayed, first drawn ahead)
                   ──▶ _plan: Task(pass id, index, seed, indices) for each batch
        executor:  begin_epoch(plan) ... next_batch() ──▶ Delivered(batch_index, data | error, copies, timings, skipped)
        delivery:  skipped samples ──▶ SkipLedger (skip_bad_samples: log, stats, budget);
                   a batch whose every sample was skipped ──▶ the next one
                   [pin thread] ──▶ stats.batch (StatsRecorder) [──▶ a Mix's MixTally]
                   ──▶ progress.delivered(index, copies)
                   ──▶ the batch (or its error)

Each ``next()`` is timed (the loop's wait, and its compute since the
previous one) for the loader's stats, and opens torch's profiler range
while a profiler records.

The pass owns its executor unless workers persist (then the loader does),
and its finalizer stops the pin thread and the owned workers whether the
pass is exhausted, abandoned or collected.

An exception a signal handler raises into ``next()`` (Ctrl-C, a timeout's
alarm) leaves a batch already taken from the executor held for the next
``next()``; one raised while a batch was on its way stops the pass, which
says from then on that it cannot go on (``LoaderIterator._interrupted``).
"""

from __future__ import annotations

import itertools
import sys
import warnings
import weakref
from time import perf_counter
from typing import Any, Iterator, Optional

from .._engine.executor.pin import PinThread, pin_tree
from .._engine.executor.records import Delivered, Executor
from .._engine.transport.messages import Task
from ..skips import BadSampleBudgetExceeded, SkipLedger
from ..state import EpochProgress, Start
from ..stats import StatsRecorder
from ._plan import Plan

#: Identifies each pass over the data, so a persistent pool drops the
#: results of an abandoned pass (set_epoch may repeat epoch numbers).
_pass_ids = itertools.count(1)


class LoaderIterator:
    """One pass over the data. Owns its executor unless workers persist."""

    def __init__(
        self,
        loader: Any,
        executor: Executor,
        owned: bool,
        start: Start,
        batches: Iterator,
        plan: Plan,
        started_at: float,
        dataset_epoch: Optional[int] = None,
    ):
        self._loader = loader  # (for len(iterator) only)
        self._plan = plan
        progress = start.progress  # (a resumed pass's stands where its state stood: EpochProgress.from_state)
        self.epoch = start.epoch
        self.base_seed = start.base_seed
        self._progress = progress
        self._num_yielded = progress.count
        first, skip = progress.position, frozenset(progress.delivered_ahead)
        epoch_id = next(_pass_ids)
        tasks = _plan(batches, epoch_id, start.base_seed, first, skip, plan.loading.kind, dataset_epoch)
        self._tally = plan.delivering.mix_tally()  # (a Mix with stats on: its sources' figures, this pass's)
        if self._tally is not None:
            tasks = self._tally.watch(tasks)
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
            self._stats.mix = self._tally
        self._executor = executor
        #: A batch taken from the executor and not yet handed out (see _next).
        self._held: Optional[Delivered] = None
        #: The latest batch the stats counted (a held batch is counted once).
        self._counted = -1
        #: Why next() cannot go on (see _interrupted), or None.
        self._cannot_go_on: Optional[str] = None
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
        if self._cannot_go_on is not None:
            raise RuntimeError(self._cannot_go_on)
        if self._progress.finished:
            raise StopIteration  # (an ended pass stays ended, as any iterator; its workers are gone)
        called_at = perf_counter()
        delivered = self._held
        if delivered is None:
            try:
                delivered = self._take(called_at)
            except StopIteration:
                raise
            except BaseException as exc:
                self._interrupted(exc)
                raise
        # From here an exception a signal handler raises leaves the batch held,
        # for the next next(): each step below can be done again.
        if self._pin_inline:
            delivered = self._held = _pin_delivered(delivered)
        if self._stats is not None and self._counted != delivered.batch_index:
            self._stats.batch(self._pass_id, delivered, called_at, perf_counter())
            if self._tally is not None:
                left_out = [skipped.index for skipped in delivered.skipped]
                self._tally.delivered(delivered.batch_index, left_out, raised=delivered.error is not None)
            self._counted = delivered.batch_index
        self._progress.delivered(delivered.batch_index, delivered.copies)
        self._held = None
        if delivered.error is not None:
            raise delivered.error
        self._num_yielded += 1
        self._check_length()
        return delivered.data

    def _take(self, called_at: float) -> Delivered:
        """The next batch from the executor, skipped samples accounted (a
        batch whose every sample was skipped: the next one); held by the
        pass once taken. StopIteration at the end of the pass."""
        while True:
            try:
                delivered = self._next_batch()
            except StopIteration as end:
                self._progress.finish(end.value)  # (the value: where an iterable dataset's copies stand)
                if self._stats is not None:
                    self._stats.end_pass(self._pass_id, called_at, perf_counter())
                self._close()
                raise StopIteration from None
            if delivered.skipped:
                self._account_skips(delivered.skipped)
            if not delivered.empty:
                self._held = delivered
                return delivered
            self._progress.delivered(delivered.batch_index)  # (every sample skipped: nothing to give)

    def _interrupted(self, error: BaseException) -> None:
        """An exception came out of the executor, the sampler or a signal
        handler while a batch was on its way, and not through the executor's
        failure path: a task may be half-booked or a result half-read, so the
        pass cannot go on. Its workers are stopped (kept ones too: the next
        ``iter(loader)`` starts them again) and every later ``next()`` says so;
        the state saved now resumes at the first batch not delivered."""
        if not self._executor.usable or isinstance(error, BadSampleBudgetExceeded):
            return  # (the executor's own failure, or the budget's: said again by later calls as it is)
        if self._progress.finished:  # (while the pass ended: nothing was on its way, and it stays ended)
            self._close()
            return
        self._cannot_go_on = (
            f"this DataLoader iterator cannot go on: {type(error).__name__} was raised inside next() (by a "
            f"signal handler, such as Ctrl-C's KeyboardInterrupt or a timeout, or by the sampler) while a batch "
            f"was on its way, and it was stopped rather than risk losing or repeating one. Start a new pass "
            f"with iter(loader); to continue this epoch where it stopped, load loader.state_dict() taken now "
            f"into the loader first (docs/resume.md)"
        )
        self._close()
        self._executor.shutdown()  # (also when the loader keeps it: it is started anew)

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
    indices: Iterator,
    epoch_id: int,
    base_seed: int,
    first_index: int,
    skip: frozenset,
    kind: Any,
    dataset_epoch: Optional[int] = None,
) -> Iterator[Task]:
    """The pass's tasks from batch ``first_index`` on, each with its seed,
    the time the sampler took to draw it and the dataset's epoch
    (loader/_dataset_epoch.py), leaving out ``skip`` (the executor books each as
    it sends it). (A resumed sampler that cannot jump has already drawn and
    dropped the batches before ``first_index``: ``replay``.)"""
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
    pin_thread: Optional[PinThread],
    executor: Any,
    progress: EpochProgress,
    stats: Optional[StatsRecorder],
    pass_id: int,
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
