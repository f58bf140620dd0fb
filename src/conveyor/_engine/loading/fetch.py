"""Loading one batch: fetch samples, collate, under the batch's seed.

The same code runs in the main process (``num_workers=0``) and in workers,
which is what makes a batch the same whatever the number of workers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Iterator, Optional

from ...collate import (
    PadCollate,
    TorchPadCollate,
    default_collate,
    default_convert,
    torch_default_collate,
    torch_default_convert,
)
from ...collate.allocation import Allocator as Allocate
from ...collate.errors import naming_samples
from ...collate.rules import collate_into
from ...rng import derive_seed, seed_global_generators, thread_sample_random
from ...state._stateful import is_stateful
from ..errors import add_note
from .copies import CopyState
from .reads import Skips, choose_reads


class EndOfData(Exception):
    """An iterable dataset ran out (inside the fetcher; never reaches users)."""


class StageClock:
    """When one batch's stages ended, as ``perf_counter()`` readings: the
    fetch began at ``started_at`` (seeding included), the samples were in
    hand at ``fetched_at``, collated at ``collated_at``. Plain fields, set
    where the stages end: this runs for every batch."""

    __slots__ = ("started_at", "fetched_at", "collated_at", "samples")

    def __init__(self) -> None:
        self.started_at = self.fetched_at = self.collated_at = perf_counter()
        self.samples = 0


@dataclass(frozen=True)
class FetchSpec:
    """What a fetcher needs; one object, shared by the main process and workers."""

    dataset: Any
    #: MAP or ITERABLE (executor/kinds.py): what differs between the two kinds, decided once.
    kind: Any
    auto_collation: bool
    batch_size: Optional[int]
    drop_last: bool
    collate_fn: Callable[[Any], Any]
    #: In workers: collate into an allocator (shared memory) with numpy
    #: leaves, instead of calling ``collate_fn``; None for a user's collate_fn.
    collate_into: Optional[Callable[[Any, Allocate], Any]] = None
    #: The main process turns numpy leaves into tensors (``to_torch``) to
    #: give what ``collate_fn`` would have given.
    to_torch: bool = False
    #: Samples of one batch read at once, in threads of the loading process
    #: (``DataLoader(reads_in_flight=)``); 1: one after another.
    reads_in_flight: int = 1
    #: Exception types for which a sample is left out of its batch
    #: (``DataLoader(skip_bad_samples=)``, skips.py); empty: none.
    skip_errors: tuple = ()

    @property
    def iterable(self) -> bool:
        """For the layers above the engine (the state's settings); the engine asks ``kind``."""
        return bool(self.kind.iterable)

    def collate(self, samples: Any, allocate: Optional[Allocate]) -> Any:
        """``collate_fn(samples)``, or the numpy route into ``allocate`` when
        one is given and the collate function has such a route."""
        if allocate is not None and self.collate_into is not None:
            return self.collate_into(samples, allocate)
        return self.collate_fn(samples)


def _convert_into(sample: Any, allocate: Allocate) -> Any:
    return default_convert(sample)


def collate_route(collate_fn: Callable[[Any], Any]) -> tuple[Optional[Callable[[Any, Allocate], Any]], bool]:
    """(numpy route into an allocator, whether the main process converts to
    torch) for conveyor's own collate functions; (None, False) for others."""
    if collate_fn is default_collate:
        return collate_into, False
    if collate_fn is torch_default_collate:
        return collate_into, True
    if collate_fn is default_convert:
        return _convert_into, False
    if collate_fn is torch_default_convert:
        return _convert_into, True
    if isinstance(collate_fn, PadCollate):
        return collate_fn.collate_into, isinstance(collate_fn, TorchPadCollate)
    return None, False


class MapFetcher:
    """Map-style dataset: a task's indices name the samples, read by the
    strategy chosen for the loader's arguments (reads.py)."""

    def __init__(self, spec: FetchSpec, worker_id: int = 0):
        self.spec = spec
        self._skips = Skips(spec.skip_errors)
        self._reads = choose_reads(spec, self._skips)

    @property
    def skipped(self) -> list:
        """The last batch's skipped samples: (index, "Type: message", traceback text)."""
        return self._skips.records

    def seed_for(self, task_seed: Optional[int]) -> Optional[int]:
        """A map-style task carries its batch's seed: derive_seed(base_seed, batch index)."""
        return task_seed

    def begin_epoch(self, restore: Optional[CopyState] = None, epoch: Optional[int] = None) -> None:
        """A new epoch: nothing to start (samples are named by the tasks)."""

    def state(self) -> None:
        """Nothing to save: the sampler's state says where a map-style epoch stands."""
        return None

    def fetch(self, indices: Any, allocate: Optional[Allocate] = None, clock: Optional[StageClock] = None) -> Any:
        """The batch at ``indices``, collated; each sample read with its own
        generators (rng.sample_rng), the batch's while collating."""
        spec = self.spec
        sample = thread_sample_random()
        if self._skips.records:
            self._skips.records = []
        # With conveyor's collate, samples read one by one go into the batch while still in cache (RowPlacer).
        place = getattr(allocate, "place", None) if spec.collate_into is not None else None
        samples, indices = self._reads.read(indices, sample, place)
        count = len(samples) if spec.auto_collation else 1
        sample.at(-1)
        # Collate errors name samples by dataset index (dataset[9]), as the error's header does.
        with naming_samples(indices if spec.auto_collation else None):
            return _collate_timed(spec, samples, count, allocate, clock)

    def close(self) -> None:
        """Stop the reading threads (when there are any); safe to call twice."""
        self._reads.close()


class IterableFetcher:
    """Iterable dataset: each task takes the next ``batch_size`` items of
    this process's iterator (one item when batching is off)."""

    def __init__(self, spec: FetchSpec, worker_id: int = 0):
        self.spec = spec
        self.worker_id = worker_id
        self._iterator: Iterator[Any] = iter(())  # (none yet: begin_epoch makes it)
        self._begun = False
        self.ended = False
        #: Items per batch: batch_size, or 1 with batching off.
        self._per_batch = spec.batch_size if spec.auto_collation and spec.batch_size else 1
        #: Never skips (skip_bad_samples is for map-style datasets): always empty.
        self.skipped: list = []
        #: Batches this process's copy has been asked for this epoch.
        self.served = 0
        #: The epoch this copy was told of last (``Task.dataset_epoch``); None
        #: before its first pass, when it is the main process's copy as it was.
        self._epoch: Optional[int] = None

    def seed_for(self, task_seed: Optional[int]) -> Optional[int]:
        """An iterable task carries the epoch's base seed; batch ``k`` of
        worker ``w`` is loaded under derive_seed(base_seed, w, k), which does
        not depend on how the main process happened to hand out tasks."""
        return None if task_seed is None else derive_seed(task_seed, self.worker_id, self.served)

    def begin_epoch(self, restore: Optional[CopyState] = None, epoch: Optional[int] = None) -> None:
        """Begin a new pass over the dataset (a new epoch), or continue one
        from ``restore`` (as :meth:`state` made it): the dataset's state
        is loaded, ``iter()`` called, then the iterator's state loaded; a
        copy with neither state is moved on past the items of the batches
        already served (read again, not collated), as torchdata does. When
        the dataset's ``__iter__``, ``set_epoch`` or ``load_state_dict``
        raises, this copy has no data this epoch (as a generator that raised).

        ``epoch``: the main process's copy's epoch (loader/_dataset_epoch.py), given
        to this copy's ``set_epoch`` before ``iter()`` (:meth:`_follow`). A
        state from inside an epoch was saved after its ``set_epoch``, so it is
        loaded after; a copy carried from the epoch before had its state
        first, so ``set_epoch`` comes after that state."""
        dataset = self.spec.dataset
        self._iterator, self._begun = iter(()), False
        self.ended = True
        self.served = 0
        carried = restore is not None and restore.carried_over
        if not carried:
            self._follow(epoch)
        if restore is not None and restore.dataset_state is not None:
            with self._loading("dataset_state", dataset):
                dataset.load_state_dict(restore.dataset_state)
        if carried:
            self._follow(epoch, always=True)
        iterator = iter(dataset)
        if restore is not None and restore.iterator_state is not None:
            if not callable(getattr(iterator, "load_state_dict", None)):
                raise ValueError(
                    f"DataLoader.load_state_dict: the state's 'copies.states[{self.worker_id}].iterator_state' "
                    f"holds a state, but the iterator {type(dataset).__name__}.__iter__ returned (a "
                    f"{type(iterator).__name__}) has no load_state_dict; pass a state saved by a loader over "
                    f"this dataset"
                )
            with self._loading("iterator_state", iterator):
                iterator.load_state_dict(restore.iterator_state)
        self._iterator, self._begun = iterator, True
        self.ended = False
        if restore is None:
            return
        self.ended = bool(restore.iterator_ended)
        self.served = int(restore.served)
        if restore.reads_again:  # (resume mechanism 4: docs/architecture.md, "Resume mechanisms")
            self._skip_items(self.served * self._per_batch)

    def _follow(self, epoch: Optional[int], always: bool = False) -> None:
        """Give this copy the main process's epoch when it had another one
        (a persistent worker's copy at a later pass), or ``always`` (a copy
        whose state came from the epoch before). At a worker's first pass the
        copy is the main process's as it was then, its epoch included."""
        if epoch is None:
            return
        if always or (self._epoch is not None and epoch != self._epoch):
            dataset = self.spec.dataset
            try:
                dataset.set_epoch(epoch)
            except Exception as exc:
                add_note(
                    exc,
                    f"(conveyor: raised by {type(dataset).__name__}.set_epoch({epoch}) in worker "
                    f"{self.worker_id}, giving its copy the epoch of the main process's)",
                )
                raise
        self._epoch = epoch

    @contextlib.contextmanager
    def _loading(self, key: str, owner: Any) -> Iterator[None]:
        """Name the state's key in what a user's ``load_state_dict`` raises."""
        try:
            yield
        except Exception as exc:
            add_note(
                exc,
                f"(conveyor: raised by {type(owner).__name__}.load_state_dict, loading the state's "
                f"'copies.states[{self.worker_id}].{key}' given to DataLoader.load_state_dict)",
            )
            raise

    def _skip_items(self, count: int) -> None:
        for _ in range(count):
            try:
                next(self._iterator)
            except StopIteration:
                self.ended = True
                return

    def state(self) -> CopyState:
        """Where this process's copy stands, for DataLoader.state_dict (the
        dataset's and its iterator's own states when they have them).

        A dataset that is its own iterator (``__iter__`` returns ``self``)
        gives its state as the iterator's, restored after ``iter()`` (which
        would otherwise reset it), as torchdata does."""
        dataset, iterator = self.spec.dataset, self._iterator
        own_iterator = iterator is dataset
        return CopyState(
            dataset_state=dataset.state_dict() if is_stateful(dataset) and not own_iterator else None,
            iterator_state=iterator.state_dict() if self._begun and is_stateful(iterator) else None,
            iterator_ended=self.ended,
            served=self.served,
        )

    def fetch(self, indices: Any, allocate: Optional[Allocate] = None, clock: Optional[StageClock] = None) -> Any:
        spec = self.spec
        if not self._begun and not self.ended:
            self.begin_epoch()
        self.served += 1
        if self.ended:
            raise EndOfData
        if not spec.auto_collation:
            thread_sample_random().at(0)
            try:
                item = next(self._iterator)
            except StopIteration:
                self.ended = True
                raise EndOfData from None
            return _collate_timed(spec, item, 1, allocate, clock)
        samples = []
        sample = thread_sample_random()
        for k in range(self._per_batch):
            sample.at(k)
            try:
                samples.append(next(self._iterator))
            except StopIteration:
                self.ended = True
                break
        sample.at(-1)
        if not samples or (spec.drop_last and len(samples) < self._per_batch):
            raise EndOfData
        return _collate_timed(spec, samples, len(samples), allocate, clock)


def _collate_timed(
    spec: FetchSpec, samples: Any, count: int, allocate: Optional[Allocate], clock: Optional[StageClock]
) -> Any:
    if clock is None:
        return spec.collate(samples, allocate)
    clock.fetched_at = perf_counter()
    clock.samples = count
    batch = spec.collate(samples, allocate)
    clock.collated_at = perf_counter()
    return batch


def make_fetcher(spec: FetchSpec, worker_id: int = 0) -> Any:
    """The fetcher of ``spec``'s kind of dataset, for worker ``worker_id``."""
    return spec.kind.fetcher(spec, worker_id)


def fetch_seeded(
    fetcher: Any,
    indices: Any,
    seed: Optional[int],
    allocate: Optional[Allocate] = None,
    clock: Optional[StageClock] = None,
    seed_globals: bool = True,
) -> Any:
    """Seed ``random``, ``numpy.random`` and torch (when loaded) with the
    batch's seed (unless ``seed_globals`` is false: a thread worker's
    process is the main one), then load the batch (timed by ``clock`` when
    given). ``seed=None`` leaves the generators alone."""
    seed = fetcher.seed_for(seed)
    if seed is not None and seed_globals:
        seed_global_generators(seed)
    thread_sample_random().reset(seed)
    return fetcher.fetch(indices, allocate, clock)
