"""ShardedSampler: one replica's share of any sampler's or batch sampler's items."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .resumable import _Resumable
from .samplers import Sampler
from .sharding import _check_rank, _per_replica, _shard, _world_from_torch


class ShardedSampler(_Resumable, Sampler[Any]):
    """Any sampler's or batch sampler's items, shared out over the ranks of a
    data-parallel job: what torch's DistributedSampler does for a plain index
    range, for a WeightedRandomSampler, a TokenBudgetBatchSampler or a
    sampler of your own.

    Every rank draws the same sequence from ``sampler`` (build it with the
    same seed on every rank) and keeps every ``num_replicas``-th item from
    position ``rank``: indices from a sampler, whole batches from a batch
    sampler (pass it as ``batch_sampler=``). ``even`` says what happens when
    the items do not divide evenly:

    * ``"pad"`` (default, as DistributedSampler): items from the start are
      repeated so every rank gets as many, and no rank runs out of batches
      before another;
    * ``"drop"``: the last items are left out, to the same end;
    * ``None``: for evaluation, every item exactly once; ranks' shares may
      differ by one item.

    Resumable: its state holds the wrapped sampler's state from the start of
    the epoch, so a resumed iteration draws the same sequence again and goes
    on from where it stopped, and between epochs where the wrapped sampler
    stands, for the next epoch's draw (the wrapped sampler needs ``state_dict`` and
    ``load_state_dict``, as every conveyor sampler has). Each iteration moves
    to the next epoch; ``set_epoch`` sets it, and the wrapped sampler's.

    Example::

        >>> import numpy as np
        >>> from conveyor import ShardedSampler, WeightedRandomSampler
        >>> weighted = WeightedRandomSampler([1.0] * 6, 6, generator=np.random.default_rng(0))  # same seed: every rank
        >>> mine = ShardedSampler(weighted, num_replicas=2, rank=0)
        >>> len(mine)
        3
    """

    _flavor = "numpy"

    def __init__(
        self, sampler: Any, num_replicas: int | None = None, rank: int | None = None, even: str | None = "pad"
    ):
        if not hasattr(sampler, "__iter__"):
            raise TypeError(f"ShardedSampler needs a sampler (an iterable), got {type(sampler).__name__}")
        if even not in ("pad", "drop", None):
            raise ValueError(f"even must be 'pad', 'drop' or None, got {even!r}")
        if num_replicas is None:
            num_replicas = _world_from_torch("num_replicas", "ShardedSampler")
        if rank is None:
            rank = _world_from_torch("rank", "ShardedSampler")
        self.num_replicas, self.rank = _check_rank(num_replicas, rank)
        self.sampler = sampler
        self.even = even
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {"num_replicas": self.num_replicas, "even": self.even, "sampler": type(self.sampler).__name__}

    def _stateful(self) -> bool:
        return callable(getattr(self.sampler, "state_dict", None)) and callable(
            getattr(self.sampler, "load_state_dict", None)
        )

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        if record is None:
            return epoch, self.sampler.state_dict() if self._stateful() else None
        self.sampler.load_state_dict(record)  # the epoch's draw, again
        return epoch, record

    def _chunks(self, epoch: int) -> Iterator[list[Any]]:
        items = list(self.sampler)
        if self.even is None:
            yield items[self.rank :: self.num_replicas]
        elif items:
            yield _shard(items, self.num_replicas, self.rank, self.even == "drop")

    def _idle_record(self) -> Any:
        # Between epochs the wrapped sampler has moved on (its epoch, its
        # generator): its state is what the next epoch draws from.
        return self.sampler.state_dict() if self._stateful() else None

    def _restore_idle(self, record: Any) -> None:
        if record is not None:
            self.sampler.load_state_dict(record)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not self._stateful():
            raise TypeError(
                f"ShardedSampler cannot resume: the sampler it wraps, {type(self.sampler).__name__}, has no "
                f"state_dict/load_state_dict to draw the epoch's sequence again; give it those methods"
            )
        record = state.get("rng") if isinstance(state, Mapping) and state.get("in_iteration") is True else None
        if isinstance(record, Mapping):
            self._check_inner(record)
        super().load_state_dict(state)

    def _check_inner(self, record: Mapping[str, Any]) -> None:
        """Let the wrapped sampler refuse, now, the state its iteration is to
        replay (loaded only when that iteration starts): loaded into it, then
        its own state put back. (Refused, it has changed nothing.)"""
        before = self.sampler.state_dict()
        self.sampler.load_state_dict(record)
        self.sampler.load_state_dict(before)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return self._iterate()

    def __len__(self) -> int:
        total = len(self.sampler)
        if self.even is None:
            return len(range(self.rank, total, self.num_replicas))
        return _per_replica(total, self.num_replicas, self.even == "drop") if total else 0
