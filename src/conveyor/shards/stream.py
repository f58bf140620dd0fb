"""Reading shards in sequence: whole shards in turn, shared out among
workers and ranks by shard, each worker's place saved for exact resume.

    ShardStream(dataset)  ──▶ per epoch: the shard order (shuffled by seed and epoch)
                          ──▶ this worker's shards: order[rank * workers + worker :: world * workers]
    iter(stream)          ──▶ ShardReader: shard by shard, a run of samples (READ_AHEAD bytes) by one
                              read, checked as ShardDataset[i] checks it; sample by sample decoded,
                              transformed and delivered; the next shards prefetched from a store

    ShardStream(dataset, shards_per_window=K)  (the block order, sampler/block_order.py)
                          ──▶ per epoch: the shard order (shuffled with shuffle_shards), cut into
                              windows of K shards; this worker's windows:
                              range(rank * workers + worker, windows, world * workers)
    iter(stream)          ──▶ WindowReader (windows.py): window by window, its shards fetched, its
                              samples in the window's keyed permutation, each read as dataset[i] is
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, Sized, Union

import numpy as np

from .._engine.info import get_worker_info
from ..dataset import IterableDataset, distributed_world, torch_worker_info
from ..sampler.block_order import BlockEpoch, ShardBlocks, check_shards_per_window
from .windows import WindowReader, check_reader_state

if TYPE_CHECKING:
    from ..store import Store


#: Bytes of samples a stream reads at once (one pread; their slices are handed out one by one).
READ_AHEAD = 1 << 20


class Shards(Protocol):
    """What a stream reads of its shards: what ``ShardDataset`` (dataset.py)
    provides, named here so that the dataset can make streams of itself."""

    @property
    def paths(self) -> Sequence[str]: ...

    @property
    def indexes(self) -> Sequence[Sized]: ...

    @property
    def firsts(self) -> Sequence[int]: ...  # where each shard's samples begin, and the total at the end

    @property
    def store(self) -> Optional[Store]: ...

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Any: ...

    def raws(self, shard: int, start: int, stop: int) -> list[dict]: ...  # samples of a shard, read at once

    def run_end(self, shard: int, start: int, max_bytes: int) -> int: ...  # how far a read of max_bytes reaches

    def prepare(self, sample: dict) -> Any: ...  # a raw sample as dataset[i] gives it

    def open_shard(self, shard: int) -> str: ...  # the file its samples are read from

    def close_shard(self, shard: int) -> None: ...


class ShardStream(IterableDataset):
    """Whole shards in turn, each read front to back; the shards are shared
    out among workers (and ranks, as ``ShardedIterable`` does) by number, and
    shuffled per epoch with ``shuffle_shards`` (``set_epoch`` moves it on).
    Samples within a shard keep their order.

    ``shards_per_window=K`` reads in the block order of
    :class:`~conveyor.ShardBlockSampler` instead: the epoch's shard order
    (shuffled with ``shuffle_shards``, by a keyed permutation of
    ``(seed, epoch)``) is cut into windows of K consecutive shards, the
    windows are shared out among workers and ranks (window ``w`` to the
    ``w % (world * workers)``-th reader), and each window's samples are
    delivered in a keyed permutation of the window (the same one the
    sampler uses). So each shard is read by one worker per epoch (from a
    store: downloaded once, with the next ``prefetch`` shards fetched
    ahead), every sample comes once, and each window's samples come in the
    same order for any number of workers; which worker's window a batch
    comes from depends on the number of workers, as for any
    IterableDataset. With one reader (``num_workers=0``, one rank),
    ``shuffle_shards=True`` and the sampler's seed, the order is
    ShardBlockSampler's, sample for sample (the sampler always shuffles the
    shards; without ``shuffle_shards`` the windows come in shard order)."""

    def __init__(
        self,
        dataset: Shards,
        shuffle_shards: bool = False,
        seed: int = 0,
        prefetch: int = 2,
        *,
        shards_per_window: Optional[int] = None,
    ):
        self.dataset, self.shuffle_shards, self.seed, self.prefetch = dataset, shuffle_shards, seed, prefetch
        self.epoch = 0
        self.shards_per_window = (
            None if shards_per_window is None else check_shards_per_window(shards_per_window, "ShardStream")
        )
        #: The block order's arguments (None: whole shards in turn, in shard order).
        self.blocks = (
            None
            if self.shards_per_window is None
            else ShardBlocks(np.diff(np.asarray(dataset.firsts)), self.shards_per_window, seed, bool(shuffle_shards))
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _reader(self) -> tuple[int, int]:
        """(this reader's number, readers): ranks times workers."""
        world, rank = distributed_world()
        info = get_worker_info() or torch_worker_info()  # (conveyor's loader, or torch's)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return rank * workers + worker, world * workers

    def epoch_order(self) -> BlockEpoch:
        """This epoch's block order (with ``shards_per_window`` only)."""
        if self.blocks is None:
            raise ValueError("ShardStream.epoch_order: this stream has no windows; pass shards_per_window=K")
        return self.blocks.epoch(self.epoch)

    def windows(self) -> list[int]:
        """This worker's windows this epoch, in order (with ``shards_per_window`` only)."""
        me, readers = self._reader()
        return list(range(me, self.epoch_order().num_windows, readers))

    def shards(self) -> list[int]:
        """This worker's shards this epoch, in order."""
        if self.blocks is not None:
            blocks = self.epoch_order()
            return [int(s) for w in self.windows() for s in blocks.window_shards(w)]
        order = list(range(len(self.dataset.paths)))
        if self.shuffle_shards:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        me, readers = self._reader()
        return order[me::readers]

    def __iter__(self) -> Union["ShardReader", WindowReader]:
        if self.blocks is not None:
            return WindowReader(self)
        return ShardReader(self)

    def __len__(self) -> int:
        return len(self.dataset)


class ShardReader:
    """One pass of a ShardStream in one worker: its shards in order, each
    held open while it is read (from a store: the next ones prefetched), by
    reads of up to ``READ_AHEAD`` bytes of samples at once, each sample
    decoded and transformed when it is delivered. Saves and loads where it
    stands (``state_dict``: the samples delivered, not those read ahead), so a
    resumed stream goes on from the sample after the last one delivered."""

    def __init__(self, stream: ShardStream):
        self._stream = stream
        self._shards = stream.shards()
        self._position = 0  # in self._shards
        self._sample = 0  # in that shard: the next one to deliver
        self._open: Optional[int] = None
        self._ahead: list[dict] = []  # read, not yet delivered: samples self._sample on, reversed

    def __iter__(self) -> "ShardReader":
        return self

    def __next__(self) -> Any:
        ds = self._stream.dataset
        while self._position < len(self._shards):
            shard = self._shards[self._position]
            if self._sample < len(ds.indexes[shard]):
                if self._open != shard:
                    self._enter(shard)
                if not self._ahead:
                    stop = ds.run_end(shard, self._sample, READ_AHEAD)
                    self._ahead = ds.raws(shard, self._sample, stop)[::-1]
                self._sample += 1
                return ds.prepare(self._ahead.pop())
            ds.close_shard(shard)
            self._open = None
            self._position, self._sample = self._position + 1, 0
        raise StopIteration

    def _enter(self, shard: int) -> None:
        ds, ahead = self._stream.dataset, self._stream.prefetch
        if ds.store is not None:  # (the next shards download while this one is read)
            ds.store.prefetch([ds.paths[k] for k in self._shards[self._position + 1 : self._position + 1 + ahead]])
        ds.open_shard(shard)
        self._open = shard

    def state_dict(self) -> dict:
        return {"shards": list(self._shards), "position": self._position, "sample": self._sample}

    def load_state_dict(self, state: dict) -> None:
        check_reader_state(state, self._shards)
        self._position, self._sample = int(state["position"]), int(state["sample"])
        self._ahead, self._open = [], None


__all__ = ["ShardStream", "ShardReader"]
