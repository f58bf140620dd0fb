"""ShardBlockSampler: a ShardDataset's indices in the block order
(:mod:`.block_order`), so that a shard is read in one span of each epoch.

::

    ShardBlockSampler(dataset, shards_per_window=K, seed=s, num_replicas=R, rank=r)
      __iter__ ──▶ epoch e's BlockEpoch ──▶ this rank's positions r, r + R, r + 2R, ... of the
                   epoch (padded from its start, as DistributedSampler pads; or cut with drop_last)
               ──▶ pieces of BLOCK_ITEMS positions, each computed when it is handed out
               ──▶ indices

The pieces are lazy (:class:`_Positions`): a resume skips them by their
length and computes none it skips, so it costs a few operations per piece
whatever the position; the state is the settings, the epoch and the
position (``resumable.py``, resume mechanism 1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Protocol, Union, overload

import numpy as np

from .arguments import _check_int
from .block_order import BlockEpoch, ShardBlocks, check_shards_per_window
from .distributed import _Span, resumed_span
from .fingerprint import Crc32Of
from .resumable import BLOCK_ITEMS, _Resumable
from .samplers import Sampler
from .sharding import _check_rank, _per_replica

__all__ = ["ShardBlockSampler"]


class ShardStarts(Protocol):
    """What ShardBlockSampler reads of its dataset (a ShardDataset has it)."""

    @property
    def firsts(self) -> Sequence[int]: ...  # where each shard's samples begin, and the total at the end


class _Positions(Sequence[int]):
    """Some positions of an epoch's block order (a range, past the epoch's
    end wrapping to its start), as the indices they hold: computed when
    iterated, never when only measured or sliced, so resume mechanism 1
    (docs/architecture.md) skips the pieces before a position by their
    length alone."""

    __slots__ = ("order", "positions", "base", "length")

    def __init__(self, order: BlockEpoch, positions: range, base: int, length: int) -> None:
        # (position p >= base + length stands for base + (p - base) % length: padding from the start)
        self.order, self.positions, self.base, self.length = order, positions, base, length

    def __len__(self) -> int:
        return len(self.positions)

    @overload
    def __getitem__(self, item: int) -> int: ...
    @overload
    def __getitem__(self, item: slice) -> _Positions: ...
    def __getitem__(self, item: Union[int, slice]) -> Union[int, _Positions]:
        if isinstance(item, slice):
            return _Positions(self.order, self.positions[item], self.base, self.length)
        return int(self.order.indices([self.base + (self.positions[item] - self.base) % self.length])[0])

    def __iter__(self) -> Iterator[int]:
        wanted = np.arange(self.positions.start, self.positions.stop, self.positions.step, dtype=np.int64)
        return iter(self.order.indices(self.base + (wanted - self.base) % self.length).tolist())


class ShardBlockSampler(_Resumable, Sampler[int]):
    """The indices of a :class:`~conveyor.shards.ShardDataset` in a block
    order that keeps reads local: each epoch shuffles the order of the
    shards, cuts it into windows of ``shards_per_window`` consecutive
    shards, and shuffles the samples of each window among themselves. The
    samples of a window fill one span of the epoch's positions, so a reader
    needs only a window's shards at a time: each shard is read in one span
    of the epoch, and from a store downloaded once per node per epoch
    (``ShardDataset(..., store=store, whole_shards=True)``; the workers of
    a node share its cache), with a cache of a couple of windows' shards.

    Larger windows mix samples of more shards into each batch (a batch of
    ``B`` draws from ``shards_per_window`` shards, not from all); 1
    shuffles each shard on its own; one window of all the shards is a full
    shuffle. The order is a pure function of (``seed``, epoch, position),
    computed per position from keyed permutations
    (``conveyor.sampler.permutation``): nothing of it is stored, so the same
    batches come for any number of workers, the state is a few integers,
    and a resume reaches any position at once.

    Epochs: each iteration moves to the next one; :meth:`set_epoch` sets
    it (as ``RandomSampler(seed=)``). Ranks, as ``DistributedSampler``:
    rank ``r`` of ``num_replicas`` takes positions ``r, r + R, ...`` of the
    epoch's one order, padded from its start to a multiple of ``R`` (or, with
    ``drop_last``, cut to one), so the ranks of a step read the same window
    together and together cover the epoch once. A state saved mid-epoch
    loads on another number of ranks (see :meth:`load_state_dict`).

    ``dataset`` is a ShardDataset, or any object with ``firsts``: where each
    shard's samples begin in the dataset's numbering, and the total at the
    end. Example::

        >>> from types import SimpleNamespace
        >>> shards = SimpleNamespace(firsts=[0, 3, 5, 9])  # 3 shards of 3, 2 and 4 samples
        >>> order = list(ShardBlockSampler(shards, shards_per_window=2, seed=0))
        >>> sorted(order) == list(range(9))
        True
    """

    def __init__(
        self,
        dataset: ShardStarts,
        shards_per_window: int,
        seed: int = 0,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ) -> None:
        firsts = getattr(dataset, "firsts", None)
        if firsts is None or isinstance(dataset, (str, bytes)):
            raise TypeError(
                f"ShardBlockSampler needs a ShardDataset (or a dataset with firsts: where each shard's samples "
                f"begin, and the total at the end), got {type(dataset).__name__}"
            )
        starts = np.asarray(firsts, dtype=np.int64).reshape(-1)
        sizes = np.diff(starts)
        if sizes.size == 0 or int(sizes.min()) < 0 or int(starts[0]) != 0:
            raise ValueError(
                f"ShardBlockSampler: the dataset's firsts {list(firsts)[:8]} are not shard boundaries (from 0, "
                f"not decreasing, the total at the end)"
            )
        self.dataset = dataset
        self.shards_per_window = check_shards_per_window(shards_per_window, "ShardBlockSampler")
        self.seed = _check_int("seed", seed)
        self.num_replicas, self.rank = _check_rank(num_replicas, rank)
        if not isinstance(drop_last, bool):
            raise TypeError(f"ShardBlockSampler: drop_last must be True or False, got {drop_last!r}")
        self.drop_last = drop_last
        self.blocks = ShardBlocks(sizes, self.shards_per_window, self.seed)
        total = self.blocks.num_samples
        if total == 0:
            raise ValueError("ShardBlockSampler: the dataset has no samples")
        self.num_samples = _per_replica(total, self.num_replicas, drop_last)
        self._sizes_crc32 = Crc32Of()
        #: A state of a job of another size, loaded and waiting: (epoch, its span).
        self._pending: Optional[tuple[int, _Span]] = None
        #: The span of the iteration opened last.
        self._current: Optional[_Span] = None
        #: Whether the state loaded last came from a job of another size.
        self.loaded_from_another_size = False
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "dataset_length": self.blocks.num_samples,
            "num_shards": self.blocks.num_shards,
            "shard_sizes_crc32": self._sizes_crc32(self.blocks.sizes),
            "shards_per_window": self.shards_per_window,
            "seed": self.seed,
            "num_replicas": self.num_replicas,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next ``__iter__`` (see _Resumable).

        A state saved mid-epoch by a job of another size (``num_replicas``)
        loads too, as DistributedSampler's does: the ranks of a synchronous
        job stand at the same position and their positions interleave, so
        together they consumed a prefix of the epoch's one order; this rank
        gets its share of the rest (padded or cut for this job's size), after
        as many places as the saved position (so the loader's count of
        batches goes on from there). The epochs after it are whole."""
        before = self._pending, self.loaded_from_another_size
        self._pending, self.loaded_from_another_size, state = resumed_span(
            type(self).__name__, state, self.num_replicas, self.blocks.num_samples
        )
        try:
            super().load_state_dict(state)  # (every other setting must match; it reads the span's length)
        except BaseException:
            self._pending, self.loaded_from_another_size = before  # (refused: nothing changed)
            raise

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._resume is None:  # (a resume point of another size dropped: its span goes with it)
            self._pending = None

    def _span_now(self) -> _Span:
        """The span of the iteration loaded or running (that of a whole epoch when none)."""
        if self._pending is not None:
            return self._pending[1]
        if self._current is not None and self._cursor is not None and not self._cursor.done:
            return self._current
        return _Span(0, 0)

    def _length(self, span: _Span) -> int:
        """Places in this rank's iteration: those consumed before the span, then its share of the rest."""
        if not span.consumed:
            return self.num_samples
        rest = self.blocks.num_samples - span.consumed
        return span.offset + (_per_replica(rest, self.num_replicas, self.drop_last) if rest > 0 else 0)

    def _max_position(self) -> int:
        return self._length(self._span_now())

    def _open(self, epoch: int, record: Any) -> tuple[tuple[BlockEpoch, _Span], Any]:
        """The epoch's order, and its span (how much of it a job of another
        size consumed before this one took over; none for a whole epoch),
        which the state records."""
        self._pending = None
        span = self._current = _Span.of(record)
        return (self.blocks.epoch(epoch), span), span.record()

    def _chunks(self, context: tuple[BlockEpoch, _Span]) -> Iterator[Sequence[Any]]:
        order, span = context
        if span.consumed:
            # The places consumed before the job changed size: skipped (a resume starts at or past them).
            yield range(span.offset)
        base = span.consumed
        rest = self.blocks.num_samples - base
        if rest <= 0:
            return
        step = self.num_replicas
        mine = range(base + self.rank, base + (self._length(span) - span.offset) * step, step)
        for start in range(0, len(mine), BLOCK_ITEMS):
            yield _Positions(order, mine[start : start + BLOCK_ITEMS], base, rest)

    def epoch_order(self, epoch: int) -> BlockEpoch:
        """Epoch ``epoch``'s block order (all ranks'): its shard order, windows and positions."""
        return self.blocks.epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return self._length(self._span_now())

    def __repr__(self) -> str:
        return (
            f"ShardBlockSampler({self.blocks.num_shards} shards, {self.blocks.num_samples} samples, "
            f"shards_per_window={self.shards_per_window}, seed={self.seed}, rank {self.rank} of {self.num_replicas})"
        )
