"""Iterable datasets whose order depends on their epoch (``set_epoch``), for
tests/loader/test_stream_epochs.py.

A plain module (see toy_datasets.py): spawn workers unpickle these classes
by reference, so it imports in a fresh interpreter, numpy and conveyor only.
"""

from __future__ import annotations

import random

import conveyor


def shuffled(n: int, epoch: int) -> list[int]:
    """``range(n)`` in epoch ``epoch``'s order."""
    order = list(range(n))
    random.Random(epoch).shuffle(order)
    return order


def share(items: list[int]) -> list[int]:
    """This worker's share of ``items`` (every item once across the workers)."""
    info = conveyor.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return items[worker::workers]


class EpochShuffled(conveyor.IterableDataset):
    """``range(n)`` shuffled by the epoch, shared out among the workers; its
    ``epoch`` says which (as ``ShardDataset.stream()``'s)."""

    def __init__(self, n: int = 16):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(share(shuffled(self.n, self.epoch)))


class HiddenEpoch(conveyor.IterableDataset):
    """As EpochShuffled, but its epoch cannot be read (no ``epoch``): only
    what ``set_epoch`` is given says which."""

    def __init__(self, n: int = 16):
        self.n, self._seen = n, 0

    def set_epoch(self, epoch: int) -> None:
        self._seen = epoch

    def __iter__(self):
        return iter(share(shuffled(self.n, self._seen)))


class ShuffledSource:
    """A source for ``ShardedIterable``: ``range(n)`` shuffled by the epoch,
    every item (the ShardedIterable shares them out)."""

    def __init__(self, n: int = 16):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        return iter(shuffled(self.n, self.epoch))

    def __len__(self) -> int:
        return self.n


class ResumableEpochs(conveyor.IterableDataset):
    """As EpochShuffled, and each copy's state is its epoch and how far it
    has read, so that a copy resumes from its own state (the epoch inside
    it, as a dataset that counts its epochs keeps it)."""

    def __init__(self, n: int = 16):
        self.n, self.epoch, self.read = n, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        mine = share(shuffled(self.n, self.epoch))
        while self.read < len(mine):
            self.read += 1
            yield mine[self.read - 1]
        self.read = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "read": self.read}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.read = state["epoch"], state["read"]


class Numbered:
    """32 samples numbered in ``cls``, packed 4 to a shard by ``conveyor pack``
    (``numbered`` is the factory the command takes)."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict:
        return {"cls": i}


def numbered() -> Numbered:
    return Numbered()
