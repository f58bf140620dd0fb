"""The DataLoader: torch.utils.data's arguments (checked early: _arguments.py),
the samplers, one pass per ``iter()`` (_iteration.py), and the workers it
keeps between passes (``persistent_workers=True``: PersistentWorkers, below).

    DataLoader(dataset, batch_size, shuffle, sampler, ...)     validates, builds samplers
      └─ _plan ─▶ the Plan of its arguments (_plan.py), for a pass or a state
      └─ __iter__ ─▶ ResumeTracker.begin (conveyor.state): the epoch, its base seed, what it resumes
                 ─▶ the executor (PoolExecutor) over inline workers (num_workers=0), worker
                    threads or processes: the pass's own, or the loader's kept ones
                 ─▶ LoaderIterator: plan ─▶ executor ─▶ Delivered ─▶ the loop
      └─ state_dict(), load_state_dict(): its resumable state (_state_methods.py)
      └─ stats(), on_stats(), trace(): its figures (_stats_methods.py)

Seeds (one root per epoch): ``base_seed`` is ``derive_seed(seed, epoch)`` when
``seed=`` is given, else one draw from ``generator`` (or the global generator)
as torch draws it; batch ``i`` is loaded with ``random``, ``numpy.random`` and
torch seeded from ``derive_seed(base_seed, i)``, in a worker process or in-process
(an iterable dataset's batch ``k`` from worker ``w``: ``derive_seed(base_seed, w, k)``;
thread workers leave the global generators to the training loop), and each
sample with its own generators (``conveyor.sample_rng()``) from that seed.

Kept workers (``PersistentWorkers``)::

    DataLoader.__iter__ ──PersistentWorkers.for_pass()──▶ the kept executor
        (started at the first pass, and again after one broke or was shut
        down, as an interrupted pass does: _iteration.py; the pass
        before hands it over first: its pin thread stops driving it)
    DataLoader collected ──▶ the executor shut down (a finalizer)

Without persistent workers each pass starts and owns an executor of its
own (:func:`started`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
import weakref
from time import perf_counter
from typing import Any, Callable, Generic, Iterable, Optional, TypeVar, Union

# (Each module by its own name, not through its package: conveyor/__init__ imports this one.)
import conveyor.collate as _collate
import conveyor.loader._arguments as _args
import conveyor.sampler as _sampler
import conveyor.skips as _skips
import conveyor.state as _state
import conveyor.stats as _stats

from .._engine.cpu import usable_cores
from .._engine.executor.core import PoolExecutor
from .._engine.executor.pin import pinning
from ..ray_options import RayWorkers
from ..sampler.arguments import is_int
from ..sampler.samplers import _InfiniteConstantSampler
from ._dataset_epoch import DatasetEpoch
from ._first_draw import PassBatches
from ._iteration import LoaderIterator
from ._plan import Plan, make_plan
from ._state_methods import StateMethods
from ._stats_methods import StatsMethods

__all__ = ["DataLoader"]

T_co = TypeVar("T_co", covariant=True)

_FROZEN_AFTER_INIT = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers")


class DataLoader(StateMethods, StatsMethods, Generic[T_co]):
    """Combines a dataset and a sampler, and iterates over batches.

    Takes torch.utils.data.DataLoader's arguments with the same meaning, plus:

    * ``seed``: a root seed from which every shuffle and every worker's random
      generators derive, so that a run is reproducible and its batches are the
      same for any ``num_workers``.
    * ``shuffle=True`` over more than 2**24 samples (``conveyor.sampler.order.
      COMPUTED_ABOVE``) computes each position's index from a keyed
      permutation instead of storing the epoch's (``RandomSampler(order=
      "auto")``): nothing of the dataset's size is held, and a resume starts
      at its position at once (docs/scale.md). ``conveyor.torch`` keeps
      torch's order when torch's generator draws it.
    * ``stall_warning``: seconds (default 300) without any batch arriving,
      while the loop waits, after which a
      :class:`~conveyor.StallWarning` names each busy worker, its batch and
      its Python stack; iteration goes on. ``0`` turns it off. (``timeout``
      still makes a late batch an error.)
    * ``collect_stats``: time every batch's stages for :meth:`stats`
      (default True; the cost is within measurement noise, bench workload h).
    * ``progress``: show a live tqdm bar per pass (samples/s, data wait,
      workers busy, ETA). Needs tqdm.
    * ``reads_in_flight``: read up to this many samples of a batch at once,
      in threads of each worker (or of the main process with
      ``num_workers=0``), for a map-style ``__getitem__`` that waits on
      storage or a network (default 1: one after another). Batches are the
      same; a ``__getitem__`` that draws from the global ``random`` /
      ``numpy.random`` generators is then no longer reproducible (threads
      share them), so draw from ``conveyor.sample_rng()`` instead.
    * ``prefetch_factor`` left out: 2, as torch, except that batches under
      32 KB may run up to 16 per worker ahead (docs/differences.md); a
      value you give is kept exactly.
    * ``skip_bad_samples``: a budget for samples whose ``__getitem__``
      raises (an int: per epoch; a float: a fraction of the epoch; or a
      :class:`~conveyor.SkipBudget`): each is left out of its batch, logged
      and counted in ``stats().skipped``; past the budget,
      :class:`~conveyor.BadSampleBudgetExceeded` lists them all. Map-style only.
    * ``worker_method``: ``"multiprocessing"`` (default) runs workers as
      processes; ``"thread"`` runs them as threads of this process (torch's
      proposed name), for datasets that wait on I/O: no start-up, no
      pickling, no copies, same batches and guarantees. The global
      generators are then the training loop's and are not seeded per
      batch: draw from ``conveyor.sample_rng()`` (docs/threads.md).
      ``"ray"`` or ``RayWorkers(...)``: Ray actors on a cluster (docs/scale-out.md).

    Example::

        >>> import numpy as np
        >>> from conveyor import DataLoader, TensorDataset
        >>> ds = TensorDataset(np.arange(10))
        >>> [b[0].tolist() for b in DataLoader(ds, batch_size=4)]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]

    The core returns numpy arrays; ``conveyor.torch.DataLoader`` returns torch
    tensors.
    """

    _flavor = "numpy"
    _RandomSampler = _sampler.RandomSampler
    _SequentialSampler = _sampler.SequentialSampler
    _BatchSampler = _sampler.BatchSampler
    _default_collate = staticmethod(_collate.default_collate)
    _default_convert = staticmethod(_collate.default_convert)
    __initialized = False

    def __init__(
        self,
        dataset: Any,
        batch_size: Optional[int] = 1,
        shuffle: Optional[bool] = None,
        sampler: Optional[Iterable] = None,
        batch_sampler: Optional[Iterable] = None,
        num_workers: int = 0,
        collate_fn: Optional[Callable[[Any], Any]] = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Optional[Callable[[int], None]] = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: Optional[int] = None,
        stall_warning: float = 300.0,
        collect_stats: bool = True,
        progress: bool = False,
        reads_in_flight: int = 1,
        worker_method: Union[str, RayWorkers] = "multiprocessing",
        skip_bad_samples: Union[None, int, float, _skips.SkipBudget] = None,
    ) -> None:
        _args.check_worker_method(worker_method)
        _args.check_workers(num_workers, timeout, prefetch_factor, persistent_workers, worker_method)
        _args.check_stall_warning(stall_warning)
        _args.check_stats(collect_stats, progress)
        _args.check_reads_in_flight(reads_in_flight, dataset)
        self._prefetch_given = prefetch_factor is not None
        prefetch_factor = _args.default_prefetch(num_workers, prefetch_factor)
        iterable = _args.check_dataset(dataset)
        self.skip_bad_samples = _args.check_skip_bad_samples(skip_bad_samples, iterable)
        _args.check_callables(collate_fn, worker_init_fn)
        _args.check_seed(seed, generator)
        shuffle, batch_size, drop_last = _args.check_batching(
            iterable, shuffle, sampler, batch_sampler, batch_size, drop_last
        )

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.worker_method = worker_method
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.generator = generator
        self.seed = seed
        self.stall_warning = stall_warning
        self.reads_in_flight = reads_in_flight
        self._iterable = iterable

        if sampler is None:
            if iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = self._RandomSampler(dataset, generator=generator, seed=seed if generator is None else None)
            else:
                sampler = self._SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = self._BatchSampler(sampler, batch_size, drop_last)  # type: ignore[arg-type]  # (any iterable of indices, as torch's)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        if collate_fn is None:
            collate_fn = self._default_collate if batch_sampler is not None else self._default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._persistent = PersistentWorkers()
        self._dataset_epoch = DatasetEpoch(iterable)  # (what the workers' copies are told: _dataset_epoch.py)
        self._IterableDataset_len_called: Optional[int] = None
        #: Epochs, base seeds and resumable state (conveyor.state).
        self._tracker = _state.ResumeTracker()
        #: Every batch's timings (conveyor.stats); None when collect_stats=False.
        self._stats = _stats.StatsRecorder(num_workers) if collect_stats else None
        if progress and self._stats is not None:  # (progress needs collect_stats: checked above)
            self._stats.add_listener(_stats.ProgressBar())
        self.__initialized = True
        _args.warn_worker_count(num_workers, worker_method, usable_cores())

    # ------------------------------------------------------------ validation
    @property
    def multiprocessing_context(self) -> Any:
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context: Any) -> None:
        self.__multiprocessing_context = _args.check_multiprocessing_context(
            context, self.num_workers, getattr(self, "worker_method", "multiprocessing")
        )

    def __setattr__(self, attr: str, value: Any) -> None:
        if self.__initialized and attr in _FROZEN_AFTER_INIT:
            raise ValueError(
                f"{attr} attribute should not be set after {type(self).__name__} is initialized "
                f"(conveyor: build a new DataLoader instead)"
            )
        super().__setattr__(attr, value)

    # ------------------------------------------------------------- iteration
    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        """What gives a pass its batches of indices: the batch sampler, or the
        sampler with batching off (any iterable of indices, as torch takes)."""
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (and tell the samplers, and
        an iterable dataset that has ``set_epoch``: every worker's copy follows).

        With ``seed=``, the epoch picks the shuffle and the batch seeds, so
        calling ``set_epoch(e)`` before ``iter()`` reproduces epoch ``e``.
        """
        if not is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        dropped = self._tracker.set_epoch(epoch, type(self).__name__)
        # The index sampler (a BatchSampler passes it on to its sampler).
        target: Any = self.batch_sampler if hasattr(self.batch_sampler, "set_epoch") else self.sampler
        if hasattr(target, "set_epoch"):
            with warnings.catch_warnings():
                if dropped:
                    warnings.simplefilter("ignore")  # the loader has said it once
                target.set_epoch(epoch)
        self._dataset_epoch.give(self.dataset, epoch)

    def _plan(self) -> Plan:
        """This loader's arguments as the parts each layer takes, made anew for
        each pass, state or executor (_plan.py says why)."""
        return make_plan(self)

    def _executor_for(self, plan: Plan, base_seed: int) -> tuple[Any, bool]:
        """The executor for a new pass, and whether the pass owns it
        (persistent workers are the loader's)."""
        if not plan.keeps_base_seed:
            return started(PoolExecutor(plan.loading, plan.running, base_seed)), True
        return self._persistent.for_pass(self, plan, base_seed), False

    def __iter__(self) -> LoaderIterator:
        started_at = perf_counter()
        plan = self._plan()
        if plan.delivering.pin:  # (whether it can be done, said once per pass, as torch says it)
            delivering = dataclasses.replace(plan.delivering, pin=self._warn_pin_memory())
            plan = dataclasses.replace(plan, delivering=delivering)
        wired = PassBatches(plan.sampling.index_sampler, plan.sampling.sampler_text)  # (before the pass is published)
        # (the base seed is drawn before the sampler draws, as torch)
        start = self._tracker.begin(plan, wired)
        executor, owned = self._executor_for(plan, start.base_seed)
        epoch = self._dataset_epoch.now(self.dataset)  # (the dataset's, for the workers' copies)
        assert wired.batches is not None  # (made by begin)
        iterator = LoaderIterator(self, executor, owned, start, wired.batches, plan, started_at, epoch)
        if not owned:
            self._persistent.taken_by(iterator)
        return iterator

    def _warn_pin_memory(self) -> bool:
        """Whether this pass's batches will be pinned (executor/pin.py's
        ``pinning``, which warns as torch does when it cannot be done)."""
        return pinning(self.pin_memory_device)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dataset={type(self.dataset).__name__}, batch_size={self.batch_size}, "
            f"num_workers={self.num_workers})"
        )


def started(executor: PoolExecutor) -> PoolExecutor:
    """``executor``, its workers started (a pass's own, or the loader's kept ones)."""
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
        shut down (shut down when ``loader`` is collected)."""
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
