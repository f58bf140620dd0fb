"""Sharding an iterable across workers (and ranks) without boilerplate.

Each worker of a DataLoader iterates its own copy of an iterable dataset, so
without sharding every item arrives ``num_workers`` times. ``ShardedIterable``
gives worker ``w`` of ``W`` on rank ``r`` of ``R`` the items whose position
``i`` satisfies ``i % (R * W) == r + R * w``: every item exactly once across
the whole job. A rank's items (``i % R == r``) do not depend on how many
workers it runs, so ``len()`` is what the rank's loader yields.
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Callable, Iterable, Iterator, Optional

from ._engine.info import get_worker_info
from .dataset import IterableDataset


def _distributed_world() -> tuple[int, int]:
    """(world size, rank) from torch.distributed when torch is loaded and a
    process group is up; (1, 0) otherwise. Never imports torch."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def _torch_worker_info() -> Any:
    """torch.utils.data's worker info, when torch's own DataLoader runs this
    dataset (never imports torch)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.utils.data.get_worker_info()
    except AttributeError:
        return None


class ShardedIterable(IterableDataset):
    """An iterable dataset that shards ``source`` across workers and ranks.

    Args:
        source: an iterable (a list of file names, a dataset with ``__iter__``)
            or a zero-argument callable returning a fresh iterator.
        transform: applied to each item *after* sharding, so the expensive
            part (opening a file, decoding) runs only for this shard's items.
        num_replicas, rank: the distributed world; by default read from
            ``torch.distributed`` when it is initialised, else one replica.

    Example::

        files = sorted(glob.glob("shards/*.tar"))
        dataset = ShardedIterable(files, transform=read_records)
        loader = DataLoader(dataset, batch_size=None, num_workers=4)

    Skipped items are still drawn from ``source`` (to find each shard's
    items), so keep ``source`` cheap and put the work in ``transform``.
    With a ``transform`` that returns an iterable per item, set
    ``flatten=True`` to yield its elements.
    """

    def __init__(
        self,
        source: Any,
        transform: Optional[Callable[[Any], Any]] = None,
        *,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        flatten: bool = False,
    ):
        if not (callable(source) or hasattr(source, "__iter__")):
            raise TypeError(f"source must be iterable or a callable returning an iterator, got {type(source).__name__}")
        if (num_replicas is None) != (rank is None):
            raise ValueError("pass num_replicas and rank together, or neither (to read them from torch.distributed)")
        if num_replicas is not None and not (0 <= rank < num_replicas):
            raise ValueError(f"rank must satisfy 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}")
        self.source = source
        self.transform = transform
        self.num_replicas = num_replicas
        self.rank = rank
        self.flatten = flatten

    def shard(self) -> tuple[int, int]:
        """(this shard's number, number of shards) in the current process."""
        if self.num_replicas is None:
            replicas, rank = _distributed_world()
        else:
            replicas, rank = self.num_replicas, self.rank
        info = get_worker_info() or _torch_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return rank + replicas * worker, replicas * workers

    def _items(self) -> Iterator[Any]:
        return iter(self.source()) if callable(self.source) and not hasattr(self.source, "__iter__") else iter(self.source)

    def __iter__(self) -> Iterator[Any]:
        index, count = self.shard()
        items: Iterable[Any] = itertools.islice(self._items(), index, None, count)
        if self.transform is not None:
            items = map(self.transform, items)
        if self.flatten:
            items = itertools.chain.from_iterable(items)
        return iter(items)

    def __len__(self) -> int:
        """Items this rank yields (over all its workers), when ``source`` has a length
        and nothing is flattened."""
        if self.flatten or not hasattr(self.source, "__len__"):
            raise TypeError("ShardedIterable has no length: its source has none, or flatten=True")
        replicas, rank = (self.num_replicas, self.rank) if self.num_replicas is not None else _distributed_world()
        total = len(self.source)
        return total // replicas + (1 if rank < total % replicas else 0)
