"""Sharding an iterable across workers (and ranks) without boilerplate.

Each worker of a DataLoader iterates its own copy of an iterable dataset, so
without sharding every item arrives ``num_workers`` times. ``ShardedIterable``
gives worker ``w`` of ``W`` on rank ``r`` of ``R`` the items whose position
``i`` satisfies ``i % (R * W) == r + R * w``: every item exactly once across
the whole job. A rank's items (``i % R == r``) do not depend on how many
workers it runs, so ``len()`` is what the rank's loader yields.

Ranks of a job must yield the same number of batches: a rank that runs out
first leaves the others waiting in their next collective (all-reduce) until
it times out. ``even=`` makes it so for a source with a length: every rank
gets the same number of items (``"drop"``: the last ``n % R`` items are
left out; ``"pad"``: items from the start are repeated to fill up, as
DistributedSampler pads), and its workers split them alike, so with the
same ``num_workers`` and ``batch_size`` every rank has as many batches.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Any, Callable, Iterable, Iterator, Optional

from ._engine.info import get_worker_info
from .dataset import IterableDataset
from .sampler.arguments import is_int

#: What ``even=`` takes (None: each rank gets its share, which may differ by one item).
EVEN_POLICIES = (None, "drop", "pad")


def distributed_world() -> tuple[int, int]:
    """(world size, rank): from torch.distributed when torch is loaded and a
    process group is up; else from torchrun's ``WORLD_SIZE`` and ``RANK``
    (set for every process it starts, also before the group is made, and
    by launchers that imitate it); else (1, 0). Never imports torch."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    if world is not None and rank is not None:
        try:
            world_size, rank_number = int(world), int(rank)
        except ValueError:
            raise ValueError(
                f"WORLD_SIZE={world!r} and RANK={rank!r} in the environment are not integers; fix them, or pass "
                f"num_replicas= and rank= to ShardedIterable"
            ) from None
        if world_size >= 1 and 0 <= rank_number < world_size:
            return world_size, rank_number
        raise ValueError(
            f"RANK={rank} is not a rank of WORLD_SIZE={world} (from the environment); fix them, or pass "
            f"num_replicas= and rank= to ShardedIterable"
        )
    return 1, 0


def torch_worker_info() -> Any:
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
            ``torch.distributed`` when it is initialised, else from torchrun's
            ``WORLD_SIZE`` and ``RANK``, else one replica.
        even: None (default: a rank's share may be one item longer than
            another's), ``"drop"`` or ``"pad"``: every rank gets the same
            number of items, so that no rank runs out of batches first (see
            the module's docstring). Needs a source with a length.

    Example::

        files = sorted(glob.glob("shards/*.tar"))
        dataset = ShardedIterable(files, transform=read_records)
        loader = DataLoader(dataset, batch_size=None, num_workers=4)

    Skipped items are still drawn from ``source`` (to find each shard's
    items), so keep ``source`` cheap and put the work in ``transform``.
    With a ``transform`` that returns an iterable per item, set
    ``flatten=True`` to yield its elements. ``set_epoch(e)`` is passed on
    to a ``source`` that has ``set_epoch`` (one that reorders per epoch), and
    ``DataLoader.set_epoch`` reaches every worker's copy (persistent ones too).
    """

    def __init__(
        self,
        source: Any,
        transform: Optional[Callable[[Any], Any]] = None,
        *,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        flatten: bool = False,
        even: Optional[str] = None,
    ):
        if not (callable(source) or hasattr(source, "__iter__")):
            raise TypeError(f"source must be iterable or a callable returning an iterator, got {type(source).__name__}")
        if (num_replicas is None) != (rank is None):
            raise ValueError("pass num_replicas and rank together, or neither (to read them from torch.distributed)")
        if num_replicas is not None and rank is not None and not (0 <= rank < num_replicas):
            raise ValueError(
                f"rank must satisfy 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}"
            )
        if even not in EVEN_POLICIES:
            raise ValueError(f"even must be one of {EVEN_POLICIES}, got {even!r}")
        if even is not None and not hasattr(source, "__len__"):
            raise TypeError(
                f"even={even!r} needs a source with a length (to give every rank as many items), but "
                f"{type(source).__name__} has none; pass a list (of files, say), or even=None"
            )
        self.source = source
        self.transform = transform
        self.num_replicas = num_replicas
        self.rank = rank
        self.flatten = flatten
        self.even = even
        self._epoch: Optional[int] = None

    @property
    def epoch(self) -> Optional[int]:
        """The source's epoch (its ``epoch``), else the one ``set_epoch`` was given last (None: none)."""
        epoch = getattr(self.source, "epoch", None)
        return epoch if is_int(epoch) else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Pass ``epoch`` on to ``source`` when it has ``set_epoch``."""
        self._epoch = int(epoch)
        set_epoch = getattr(self.source, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    def world(self) -> tuple[int, int]:
        """(number of replicas, this replica's rank)."""
        if self.num_replicas is None or self.rank is None:  # (both or neither: see __init__)
            return distributed_world()
        return self.num_replicas, self.rank

    def shard(self) -> tuple[int, int]:
        """(this shard's number, number of shards) in the current process."""
        replicas, rank = self.world()
        info = get_worker_info() or torch_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return rank + replicas * worker, replicas * workers

    def _items(self) -> Iterator[Any]:
        return (
            iter(self.source()) if callable(self.source) and not hasattr(self.source, "__iter__") else iter(self.source)
        )

    def _positions(self) -> tuple[Iterator[Any], Optional[int]]:
        """The items by position, and where the sharded positions end (None:
        at the end of the source). With ``even="pad"`` the source is read
        again from the start past its end, as often as filling up needs."""
        if self.even is None:
            return self._items(), None
        replicas = self.world()[0]
        total = len(self.source)
        per_rank = total // replicas if self.even == "drop" else -(-total // replicas)
        if self.even == "drop" or total == 0:
            return self._items(), per_rank * replicas
        return itertools.chain.from_iterable(self._items() for _ in itertools.count()), per_rank * replicas

    def __iter__(self) -> Iterator[Any]:
        index, count = self.shard()
        positions, end = self._positions()
        items: Iterable[Any] = itertools.islice(positions, index, end, count)
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
        replicas, rank = self.world()
        total = len(self.source)
        if self.even == "drop":
            return total // replicas
        if self.even == "pad":
            return -(-total // replicas)
        return total // replicas + (1 if rank < total % replicas else 0)
