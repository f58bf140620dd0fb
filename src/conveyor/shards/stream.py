"""Reading shards in sequence: whole shards in turn, shared out among
workers and ranks by shard, each worker's place saved for exact resume.

    ShardStream(dataset)  ──▶ per epoch: the shard order (shuffled by seed and epoch)
                          ──▶ this worker's shards: order[rank * workers + worker :: world * workers]
    iter(stream)          ──▶ ShardReader: shard by shard, a run of samples (READ_AHEAD bytes) by one
                              read, checked as ShardDataset[i] checks it; sample by sample decoded,
                              transformed and delivered; the next shards prefetched from a store
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, Sized

from .._engine.info import get_worker_info
from ..dataset import IterableDataset, distributed_world, torch_worker_info

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
    Samples within a shard keep their order."""

    def __init__(self, dataset: Shards, shuffle_shards: bool = False, seed: int = 0, prefetch: int = 2):
        self.dataset, self.shuffle_shards, self.seed, self.prefetch = dataset, shuffle_shards, seed, prefetch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shards(self) -> list[int]:
        """This worker's shards this epoch, in order."""
        order = list(range(len(self.dataset.paths)))
        if self.shuffle_shards:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        world, rank = distributed_world()
        info = get_worker_info() or torch_worker_info()  # (conveyor's loader, or torch's)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return order[rank * workers + worker :: world * workers]

    def __iter__(self) -> "ShardReader":
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
        if list(state["shards"]) != self._shards:
            raise ValueError(
                f"ShardStream.load_state_dict: the state's shards {state['shards'][:8]} are not this worker's "
                f"{self._shards[:8]} (another shuffle seed, epoch, number of workers or ranks); resume with the "
                f"settings that saved it"
            )
        self._position, self._sample = int(state["position"]), int(state["sample"])
        self._ahead, self._open = [], None


__all__ = ["ShardStream", "ShardReader"]
