"""The block order over shards: shards shuffled, samples shuffled only
within a window of consecutive shards, computed per position.

::

    (shard sizes, shards_per_window K, seed)  ──▶ ShardBlocks
    ShardBlocks.epoch(e)  ──▶ BlockEpoch:
        shard order      KeyedPermutation(S, derive_seed(seed, e, 0))  (or 0, 1, ..., S-1 unshuffled)
        windows          shards K·w .. K·w + K - 1 of that order; window w holds positions
                         starts[w] .. starts[w + 1] - 1 (prefix sums of its shards' sizes)
        position p       ──▶ its window w (a search in starts) ──▶ KeyedPermutation(size of w,
                         derive_seed(seed, e, 1, w))[p - starts[w]] ──▶ a sample of w's shards, taken
                         in the shard order ──▶ (shard, sample within it), dataset index firsts[shard] + sample

A window's samples all lie in its K shards and fill one span of positions,
so a reader in that order needs only K shards at a time (a cache of a few
windows' shards holds all it reads), and each shard is read in one span of
an epoch: a stream reads it in one worker, a store downloads it once. The
order is a pure function of (sizes, K, seed, epoch, position): nothing of
the order is saved, any position is reached at once, and the same
positions give the same samples whoever computes them. An epoch holds one
int64 per shard (its order and the windows' starts), nothing per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from conveyor.rng import derive_seed

from .arguments import _check_int, _is_int
from .permutation import KeyedPermutation

__all__ = ["ShardBlocks", "BlockEpoch", "check_shards_per_window"]

#: derive_seed's key for an epoch's shard order, and for its windows' sample orders.
_SHARD_ORDER_KEY, _WINDOW_KEY = 0, 1


def check_shards_per_window(value: Any, owner: str) -> int:
    """``value`` as a number of shards per window (an int >= 1), or a clear error naming ``owner``'s argument."""
    if not _is_int(value):
        raise TypeError(
            f"{owner}: shards_per_window must be an int (how many consecutive shards' samples are shuffled "
            f"together, e.g. 8), got {value!r} ({type(value).__name__})"
        )
    if value < 1:
        raise ValueError(
            f"{owner}: shards_per_window must be at least 1 (1 shuffles each shard's samples on their own; "
            f"more mixes more shards at a time), got {value}"
        )
    return int(value)


class ShardBlocks:
    """The block order's arguments: ``sizes[s]`` samples in shard ``s``,
    ``shards_per_window`` shards to a window, ``seed``, and whether the
    shard order is shuffled (``shuffle_shards``; the samples within a
    window always are). :meth:`epoch` gives one epoch's order."""

    def __init__(
        self, sizes: Union[Sequence[int], np.ndarray], shards_per_window: int, seed: int, shuffle_shards: bool = True
    ) -> None:
        self.sizes = np.asarray(sizes, dtype=np.int64).reshape(-1)
        if self.sizes.size and int(self.sizes.min()) < 0:
            raise ValueError("ShardBlocks: a shard's number of samples cannot be negative")
        self.firsts = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.shards_per_window = check_shards_per_window(shards_per_window, "ShardBlocks")
        self.seed = _check_int("seed", seed)  # (not int(seed): 1.5 would be seed 1's order)
        self.shuffle_shards = bool(shuffle_shards)
        self._last: Optional[BlockEpoch] = None  # (the epoch asked for last: a reader asks for it more than once)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_last": None}  # (a pickled order travels without its epoch: made again)

    @property
    def num_shards(self) -> int:
        return int(self.sizes.size)

    @property
    def num_samples(self) -> int:
        return int(self.firsts[-1])

    @property
    def num_windows(self) -> int:
        return -(-self.num_shards // self.shards_per_window)

    def epoch(self, epoch: int) -> BlockEpoch:
        """Epoch ``epoch``'s order."""
        last = self._last
        if last is None or last.epoch != int(epoch):
            last = self._last = BlockEpoch(self, int(epoch))
        return last


class BlockEpoch:
    """One epoch of a block order: position ``p`` in ``[0, num_samples)`` ──▶ a sample (see the module)."""

    def __init__(self, blocks: ShardBlocks, epoch: int) -> None:
        self.blocks, self.epoch = blocks, epoch
        k, count = blocks.shards_per_window, blocks.num_shards
        if blocks.shuffle_shards and count:
            #: The epoch's shard order: shard_order[j] is the j-th shard read.
            key = derive_seed(blocks.seed, epoch, _SHARD_ORDER_KEY)
            self.shard_order = KeyedPermutation(count, key).block(0, count)
        else:
            self.shard_order = np.arange(count, dtype=np.int64)
        ends = np.cumsum(blocks.sizes[self.shard_order])
        #: starts[w]: the first position of window w; starts[-1]: the epoch's length.
        self.starts = np.concatenate([[0], ends[k - 1 :: k]]).astype(np.int64)
        if count and count % k:
            self.starts = np.concatenate([self.starts, ends[-1:]])

    @property
    def num_windows(self) -> int:
        return int(self.starts.size - 1)

    def window_shards(self, window: int) -> np.ndarray:
        """The shards of window ``window``, in the epoch's shard order."""
        k = self.blocks.shards_per_window
        return self.shard_order[window * k : (window + 1) * k]

    def window_span(self, window: int) -> range:
        """The positions window ``window``'s samples fill."""
        return range(int(self.starts[window]), int(self.starts[window + 1]))

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        """The window each position falls in."""
        return np.searchsorted(self.starts, positions, side="right") - 1

    def locate(self, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """(shard, sample within it) at each of ``positions`` (ints in ``[0, num_samples)``)."""
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        total = int(self.starts[-1])
        if positions.size and (int(positions.min()) < 0 or int(positions.max()) >= total):
            raise IndexError(f"positions outside a block order of {total} samples")
        shards = np.empty(positions.size, dtype=np.int64)
        samples = np.empty(positions.size, dtype=np.int64)
        windows = self.window_of(positions)
        for window in np.unique(windows).tolist():
            where = windows == window
            shards[where], samples[where] = self._in_window(window, positions[where] - self.starts[window])
        return shards, samples

    def indices(self, positions: Any) -> np.ndarray:
        """The dataset index (``firsts[shard] + sample``) at each of ``positions``."""
        shards, samples = self.locate(positions)
        return self.blocks.firsts[shards] + samples

    def _in_window(self, window: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, sample) at ``offsets`` within window ``window``: its samples
        taken shard after shard, permuted by the window's key."""
        shards = self.window_shards(window)
        ends = np.cumsum(self.blocks.sizes[shards])
        key = derive_seed(self.blocks.seed, self.epoch, _WINDOW_KEY, window)
        local = KeyedPermutation(int(ends[-1]), key).take(offsets)
        which = np.searchsorted(ends, local, side="right")
        return shards[which], local - (ends[which] - self.blocks.sizes[shards[which]])
