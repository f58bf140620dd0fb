"""How a map-style batch's samples are read: one strategy, chosen once per
worker (:func:`choose_reads`) from the loader's arguments and the dataset.

    batching off                 Unbatched    dataset[index] (a sample that raises one of
                                              skip_bad_samples' errors leaves its batch empty)
    skip_bad_samples             Skipping     __getitems__ if the dataset has it, else (or when it
                                              raises such an error) one by one, or reads_in_flight
                                              at a time; a sample that raises is left out
    __getitems__                 ReadMany     one call for the batch, as torch's fetcher
    reads_in_flight > 1          Concurrent   up to N reads at a time in threads of the loading process
    otherwise                    OneByOne     dataset[i] in order, each placed into its row of the
                                              batch while still in cache (rows.RowPlacer)

Every strategy reads each sample with its own generators
(``conveyor.sample_rng()``: ``sample.at(k)`` for the sample at place k) and
returns ``(samples, indices)``: the samples to collate and the dataset
indices they came from (fewer when some were skipped).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from traceback import format_exception
from typing import Any, Callable, Optional, Protocol

from ...dataset import fetch_many
from ...rng import thread_sample_random
from .. import info as _info


class EmptyBatch(Exception):
    """Every sample of the batch was skipped (``skip_bad_samples``); the
    fetcher's ``skipped`` says why (inside the engine; never reaches users)."""


class Reads(Protocol):
    """One way of reading a batch's samples."""

    def read(self, indices: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        """(the samples, their dataset indices); ``place(sample, k)``, when
        given, puts sample k into its row of the batch as it is read."""

    def close(self) -> None:
        """Stop what the strategy started (reading threads)."""


class Skips:
    """The samples a batch left out: (index, "Type: message", traceback text)."""

    def __init__(self, errors: tuple):
        self.errors = errors
        self.records: list = []

    def note(self, index: Any, exc: BaseException) -> None:
        self.records.append((index, f"{type(exc).__name__}: {exc}", "".join(format_exception(exc))))


class ReadThreads:
    """Up to ``count`` reads of one batch at a time, in threads of the
    loading process (made on first use); each read answers
    get_worker_info() as its worker and draws from its sample's generators."""

    def __init__(self, dataset: Any, count: int):
        self.dataset, self.count = dataset, count
        self._pool: Optional[ThreadPoolExecutor] = None

    def submit(self, indices: Any, root: Any) -> list:
        """Every read of the batch, done (as futures, in index order)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.count, thread_name_prefix="conveyor-read")
        worker = _info.get_worker_info()
        futures = [self._pool.submit(self._read, worker, root, k, i) for k, i in enumerate(indices)]
        wait(futures)
        return futures

    def _read(self, worker: Any, root: Any, key: int, index: Any) -> Any:
        sample = thread_sample_random()
        sample.reset(root, key)
        _info.lend(worker, sample)
        return self.dataset[index]

    def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class OneByOne:
    """``dataset[i]`` in order, each placed into its row as it is read."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def read(self, indices: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        dataset, samples = self.dataset, []
        for k, i in enumerate(indices):
            sample.at(k)
            samples.append(dataset[i] if place is None else place(dataset[i], k))
        return samples, indices

    def close(self) -> None:
        pass


class ReadMany:
    """``dataset.__getitems__(indices)``: one call for the batch, its result as it is."""

    def __init__(self, dataset: Any):
        self.dataset = dataset

    def read(self, indices: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        return fetch_many(self.dataset, indices), indices

    def close(self) -> None:
        pass


class Concurrent:
    """Up to ``reads_in_flight`` reads at a time; the first failing read (in
    index order) raises, after the others of the batch have finished."""

    def __init__(self, dataset: Any, count: int):
        self.threads = ReadThreads(dataset, count)

    def read(self, indices: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        return [future.result() for future in self.threads.submit(indices, sample.root)], indices

    def close(self) -> None:
        self.threads.close()


class Unbatched:
    """Batching off: the sample at ``index`` is the batch. With a budget, a
    sample that raises one of its errors is noted and leaves its batch empty."""

    def __init__(self, dataset: Any, skips: Optional[Skips]):
        self.dataset, self.skips = dataset, skips

    def read(self, index: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        sample.at(0)
        if self.skips is None:
            return self.dataset[index], None
        try:
            return self.dataset[index], None
        except self.skips.errors as exc:
            self.skips.note(index, exc)
            raise EmptyBatch from None

    def close(self) -> None:
        pass


class Skipping:
    """``skip_bad_samples``: the samples that load, in order, and their
    indices; each that raises one of the budget's errors is left out and
    noted. ``__getitems__`` is tried first; when it raises such an error,
    the samples are read one by one (or ``reads_in_flight`` at a time) to
    find the bad ones."""

    def __init__(self, dataset: Any, skips: Skips, count: int):
        self.dataset, self.skips = dataset, skips
        self.threads = ReadThreads(dataset, count) if count > 1 else None

    def read(self, indices: Any, sample: Any, place: Optional[Callable[[Any, int], Any]]) -> tuple[Any, Any]:
        dataset, errors = self.dataset, self.skips.errors
        if hasattr(dataset, "__getitems__"):
            try:
                return fetch_many(dataset, indices), list(indices)
            except errors:
                pass
        futures = self.threads.submit(indices, sample.root) if self.threads is not None else None
        kept, kept_indices = [], []
        for k, i in enumerate(indices):
            try:
                if futures is not None:
                    kept.append(futures[k].result())
                else:
                    sample.at(k)
                    kept.append(dataset[i])
            except errors as exc:
                self.skips.note(i, exc)
            else:
                kept_indices.append(i)
        if not kept:
            raise EmptyBatch
        return kept, kept_indices

    def close(self) -> None:
        if self.threads is not None:
            self.threads.close()


def choose_reads(spec: Any, skips: Skips) -> Reads:
    """The strategy for ``spec`` (a FetchSpec), decided once."""
    dataset = spec.dataset
    if not spec.auto_collation:
        return Unbatched(dataset, skips if spec.skip_errors else None)
    if spec.skip_errors:
        return Skipping(dataset, skips, spec.reads_in_flight)
    if hasattr(dataset, "__getitems__"):
        return ReadMany(dataset)
    if spec.reads_in_flight > 1:
        return Concurrent(dataset, spec.reads_in_flight)
    return OneByOne(dataset)
