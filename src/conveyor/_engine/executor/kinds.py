"""The two kinds of dataset, as strategies the plan picks once: what
differs between a map-style dataset and an iterable one, in one place.

    map-style (MAP)                           iterable (ITERABLE)
    a task names its samples                  a worker's own copy gives its next items
    MapFetcher                                IterableFetcher (its copy starts each epoch)
    any worker may load any batch:            worker w serves every w-th batch (torch's round
      the least busy one                        robin): which worker serves decides the content
    nothing to keep per worker                where each copy stands (IterableProgress), for the state
    a thread worker shares the dataset        a thread worker gets its own shallow copy
    a lost Ray actor's batches load again     a lost copy's batches are lost with it
    batch i's seed: derive_seed(base, i)      the base seed (the worker derives (w, k) itself)

``FetchSpec.kind`` holds the strategy; the engine asks it instead of
testing which kind it has.
"""

from __future__ import annotations

import copy
from typing import Any, Optional, Sequence

from ...rng import derive_seed
from ..loading.copies import Copies
from .progress import IterableProgress


class NoCopies:
    """A map-style dataset's stand-in for IterableProgress: no copy to follow."""

    retired: Sequence[int] = ()
    next_turn = 0

    def restore_points(self) -> dict:
        return {}

    def started(self, worker_id: int, state: Any) -> None:
        pass

    def arrived(self, batch_index: int, worker_id: int, state: Any) -> None:
        pass

    def handed_over(self, batch_index: int) -> None:
        pass

    def exhausted(self, batch_index: int, worker_id: int, state: Any) -> None:
        pass

    def passed(self, batch_index: int) -> None:
        pass

    def snapshot(self) -> None:
        return None


class MapKind:
    """A map-style dataset (``__getitem__``)."""

    iterable = False
    #: Samples can be placed row by row into the batch as they are read.
    places_rows = True
    #: A lost worker's batches in hand can be loaded again by a new one, as
    #: RayWorkers(restart_lost=) does: a task names its samples.
    reloads_lost = True

    def fetcher(self, spec: Any, worker_id: int) -> Any:
        from ..loading.fetch import MapFetcher

        return MapFetcher(spec, worker_id)

    def for_thread(self, dataset: Any) -> Any:
        """A thread worker's dataset: the one dataset, shared."""
        return dataset

    def progress(self, workers: int, saved: Optional[Copies]) -> NoCopies:
        return NoCopies()

    def batch_seed(self, base_seed: int, batch_index: int) -> int:
        """Batch ``batch_index`` is loaded under its own seed."""
        return derive_seed(base_seed, batch_index)

    def choose(self, workers: list, turn: int, in_order: bool, prefetch_factor: int) -> tuple[Any, int]:
        """The least busy worker (content does not depend on it); ties go
        round the workers from ``turn``. (worker or None, the next turn)."""
        active = [w for w in workers if w.active and not w.exited]
        if not active:
            return None, turn
        return min(active, key=lambda w: (len(w.outstanding), (w.id - turn) % len(workers))), turn + 1


class IterableKind:
    """An iterable dataset (``__iter__``): each worker reads its own copy."""

    iterable = True
    places_rows = False
    #: A lost copy's place in its stream is lost with it: no batch of it can be loaded again.
    reloads_lost = False

    def fetcher(self, spec: Any, worker_id: int) -> Any:
        from ..loading.fetch import IterableFetcher

        return IterableFetcher(spec, worker_id)

    def for_thread(self, dataset: Any) -> Any:
        """A thread worker's own shallow copy, as each worker process has its
        own: what its ``__iter__`` or ``load_state_dict`` sets on it (a
        position, a shard list) is that worker's; the objects it holds are shared."""
        return copy.copy(dataset)

    def progress(self, workers: int, saved: Optional[Copies]) -> IterableProgress:
        return IterableProgress(workers, saved)

    def batch_seed(self, base_seed: int, batch_index: int) -> int:
        """The epoch's base seed: the worker derives its batch k's seed
        from (worker, k), which does not depend on how tasks were handed out."""
        return base_seed

    def choose(self, workers: list, turn: int, in_order: bool, prefetch_factor: int) -> tuple[Any, int]:
        """Round robin over all workers, skipping retired ones, as torch:
        which worker serves a batch decides its content. With
        ``in_order=False``, also skipping those with their share of the
        window in hand (as torch), so a slow worker holds back no other;
        (None, the next turn) when every one has."""
        active = [w for w in workers if w.active and not w.exited]
        if not active:
            return None, turn
        count = len(workers)
        share = None if in_order else prefetch_factor * count // len(active)
        for step in range(count):
            worker = workers[(turn + step) % count]
            if worker.active and not worker.exited and (share is None or len(worker.outstanding) < share):
                return worker, turn + step + 1
        return None, turn + count


MAP = MapKind()
ITERABLE = IterableKind()


def kind_of(iterable: bool) -> Any:
    """The strategy for a dataset of this kind (decided once, by the plan)."""
    return ITERABLE if iterable else MAP


__all__ = ["MAP", "ITERABLE", "MapKind", "IterableKind", "NoCopies", "kind_of"]
