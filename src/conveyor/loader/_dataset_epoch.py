"""An iterable dataset's epoch, from the loader's process to every worker's copy.

    loader.set_epoch(e) ──▶ dataset.set_epoch(e)            (the main process's copy; remembered)
    iter(loader)        ──▶ DatasetEpoch.now(dataset): its ``epoch``, else the e remembered
                        ──▶ every Task of the pass (Task.dataset_epoch)
    worker, the pass's first task ──▶ IterableFetcher.begin_epoch: its copy.set_epoch(e) when
                        its copy had another epoch (loading/fetch.py: ``IterableFetcher._follow``)

Without persistent workers each pass's workers copy the main process's
dataset as it is then, epoch included. Persistent workers keep the copy they
made at their first pass: the epoch is what they are told of each pass, so
that their copies' order is the one fresh workers would have had.
"""

from __future__ import annotations

from typing import Any, Optional

from ..dataset import epoch_of


class DatasetEpoch:
    """What a loader knows of its iterable dataset's epoch (map-style: nothing)."""

    def __init__(self, iterable: bool):
        self._iterable = iterable
        #: The epoch the loader's ``set_epoch`` gave the dataset last (None: never).
        self._given: Optional[int] = None

    def give(self, dataset: Any, epoch: int) -> None:
        """``DataLoader.set_epoch(epoch)``: tell an iterable dataset that has
        ``set_epoch`` (its main-process copy)."""
        set_epoch = getattr(dataset, "set_epoch", None) if self._iterable else None
        if callable(set_epoch):
            set_epoch(epoch)
            self._given = int(epoch)

    def now(self, dataset: Any) -> Optional[int]:
        """The epoch of the main process's copy of an iterable dataset that has
        ``set_epoch``, for a pass's workers: its ``epoch`` attribute when it
        is an int (as ``ShardDataset.stream()``'s), else the one the loader
        gave it last; None: none to tell (no ``set_epoch``, or no epoch known)."""
        if not self._iterable or not callable(getattr(dataset, "set_epoch", None)):
            return None
        epoch = epoch_of(dataset)
        return self._given if epoch is None else epoch


__all__ = ["DatasetEpoch"]
