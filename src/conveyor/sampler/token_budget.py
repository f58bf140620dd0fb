"""TokenBudgetBatchSampler: batches of variable-length samples within a padded-token budget."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from conveyor.rng import derive_seed, source_for

from .arguments import _check_bool, _check_int, _check_positive_int
from .fingerprint import values_crc32
from .resumable import _Resumable
from .samplers import Sampler
from .sharding import _check_rank, _shard


class TokenBudgetBatchSampler(_Resumable, Sampler[list[int]]):
    """Batches of samples of similar length whose padded size stays within ``max_tokens``.

    For variable-length data (text, audio): a batch's padded size is
    ``max(length in batch) × batch count``, and no batch exceeds
    ``max_tokens``. A sample counts as at least one token, so empty samples
    cannot pile into an unbounded batch.

    Each epoch:

    1. order the samples: shuffled from ``derive_seed(seed, epoch)`` when
       ``shuffle``, else by index;
    2. cut that order into pools of ``pool_size`` samples (one pool when None)
       and sort each pool by length (stable);
    3. pack each sorted pool greedily into batches (capped at
       ``max_batch_size`` samples when given);
    4. shuffle the order of the batches (same epoch generator) when ``shuffle``;
    5. with ``num_replicas > 1``, even out the batch count as
       :class:`DistributedSampler` does (repeat batches from the start, or
       with ``drop_last`` drop the surplus) and keep every
       ``num_replicas``-th batch from ``rank``.

    ``pool_size`` trades padding for randomness: None sorts the whole dataset
    (least padding; each epoch has the same batches in another order, up to
    ties between equal lengths); a pool of, say, 100 batches' worth of samples
    varies the batches between epochs at a little more padding.

    ``epoch`` is the value given to :meth:`set_epoch`, else 0, 1, 2, ... per
    iteration. ``len()`` is the number of batches of the current (or next)
    epoch, which with ``pool_size`` can differ between epochs.
    ``drop_last`` only matters with ``num_replicas > 1``; without it every
    sample appears exactly once per epoch.

    Example::

        >>> sampler = TokenBudgetBatchSampler([5, 3, 9, 2, 8, 4], max_tokens=16, shuffle=False)
        >>> list(sampler)
        [[3, 1, 5], [0, 4], [2]]
    """

    _flavor = "numpy"

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        max_batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        pool_size: int | None = None,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        self.max_tokens = _check_positive_int("max_tokens", max_tokens)
        self.lengths = _check_lengths(lengths, self.max_tokens)
        self.max_batch_size = None if max_batch_size is None else _check_positive_int("max_batch_size", max_batch_size)
        self.pool_size = None if pool_size is None else _check_positive_int("pool_size", pool_size)
        self.shuffle = _check_bool("shuffle", shuffle)
        self.drop_last = _check_bool("drop_last", drop_last)
        self.seed = _check_int("seed", seed)
        self.num_replicas, self.rank = _check_rank(num_replicas, rank)
        self._lengths_crc32 = values_crc32(self.lengths)  # (lengths are copied: fixed from here on)
        self._plan_cache: tuple[int, list[list[int]]] | None = None
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "num_lengths": len(self.lengths),
            "lengths_crc32": self._lengths_crc32,
            "max_tokens": self.max_tokens,
            "max_batch_size": self.max_batch_size,
            "pool_size": self.pool_size,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "num_replicas": self.num_replicas,
            "flavor": self._flavor,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler stands (JSON values); ``rank`` is recorded but not checked on load."""
        return {**super().state_dict(), "rank": self.rank}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        return epoch, None

    def _chunks(self, epoch: int) -> Iterator[list[list[int]]]:
        # Copies: a caller may change a batch in place; the cached plan must not change.
        yield [batch[:] for batch in self._plan(epoch)]

    def _plan(self, epoch: int) -> list[list[int]]:
        """This rank's batches for ``epoch`` (cached for the last epoch asked)."""
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (epoch, self._make_plan(epoch))
        return self._plan_cache[1]

    def _make_plan(self, epoch: int) -> list[list[int]]:
        n = len(self.lengths)
        source = source_for(derive_seed(self.seed, epoch), self._flavor) if self.shuffle else None
        order = np.asarray(source.permutation(n), dtype=np.int64) if source else np.arange(n, dtype=np.int64)
        costs = np.maximum(self.lengths, 1)
        pool = self.pool_size or max(n, 1)
        batches: list[list[int]] = []
        for start in range(0, n, pool):
            members = order[start : start + pool]
            members = members[np.argsort(costs[members], kind="stable")]
            batches.extend(_pack(members.tolist(), costs[members].tolist(), self.max_tokens, self.max_batch_size))
        if source is not None:
            batches = [batches[i] for i in source.permutation(len(batches))]
        return _shard(batches, self.num_replicas, self.rank, self.drop_last)

    def _current_epoch(self) -> int:
        if self._resume is not None:
            return self._resume.epoch
        if self._cursor is not None and not self._cursor.done:
            return self._cursor.epoch
        return self.epoch

    def __iter__(self) -> Iterator[list[int]]:
        return self._iterate()

    def __len__(self) -> int:
        return len(self._plan(self._current_epoch()))


def _check_lengths(lengths: Any, max_tokens: int) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(
            f"lengths should be a 1d sequence of integers (one per sample), got dtype {array.dtype} "
            f"and shape {tuple(array.shape)}"
        )
    array = array.astype(np.int64)
    if array.size and array.min() < 0:
        raise ValueError(f"lengths should be non-negative, got {int(array.min())} at index {int(array.argmin())}")
    too_long = np.flatnonzero(array > max_tokens)
    if too_long.size:
        worst = int(too_long[np.argmax(array[too_long])])
        raise ValueError(
            f"{too_long.size} sample(s) are longer than max_tokens={max_tokens} (the longest: index {worst} "
            f"with {int(array[worst])} tokens; first few: {too_long[:5].tolist()}); raise max_tokens to at "
            f"least {int(array[worst])}, or truncate or filter those samples before batching"
        )
    return array


def _pack(members: list[int], costs: list[int], max_tokens: int, max_batch_size: int | None) -> list[list[int]]:
    """Cut ``members`` (sorted by ascending ``costs``) greedily into batches within the budget.

    The batch starting at ``start`` takes the most members ``k`` with
    ``costs[start + k - 1] * k <= max_tokens``; that product grows with ``k``,
    so ``k`` is found by bisection, once per batch rather than per sample.
    """
    batches, start, count = [], 0, len(members)
    while start < count:
        most = min(count - start, max_tokens // costs[start], max_batch_size or count)
        low, high = 1, most
        while low < high:
            middle = (low + high + 1) // 2
            if costs[start + middle - 1] * middle <= max_tokens:
                low = middle
            else:
                high = middle - 1
        batches.append(members[start : start + low])
        start += low
    return batches
