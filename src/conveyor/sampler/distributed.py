"""DistributedSampler: one replica's share of the indices; ShardedSampler: one
replica's share of any sampler's items; and the sharding they share with
TokenBudgetBatchSampler (pad or cut to divide evenly, take every n-th)."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping, Sized
from typing import Any

from conveyor.rng import TorchSource, derive_seed, source_for

from .arguments import _check_int, _check_positive_int, _is_int
from .resumable import _Resumable, _state_error
from .samplers import Sampler


def _per_replica(total: int, num_replicas: int, drop_last: bool, rank: int = 0, even: bool = True) -> int:
    """Items replica ``rank`` gets: all of them, padded, or (drop_last) the
    even part; with ``even=False``, its share as it falls (no padding)."""
    if not even:
        return len(range(rank, total, num_replicas))
    if drop_last and total % num_replicas != 0:
        return math.ceil((total - num_replicas) / num_replicas)
    return math.ceil(total / num_replicas)


def _shard(items: list[Any], num_replicas: int, rank: int, drop_last: bool, even: bool = True) -> list[Any]:
    """``rank``'s share of ``items``: padded by repeating from the start, or
    cut, to divide evenly; with ``even=False``, every ``num_replicas``-th as they fall."""
    if not even:
        return items[rank::num_replicas]
    total = _per_replica(len(items), num_replicas, drop_last) * num_replicas
    padding = total - len(items)
    if padding > 0:
        items = items + (items * math.ceil(padding / len(items)))[:padding]
    else:
        items = items[:total]
    return items[rank:total:num_replicas]


def _world_from_torch(name: str, kind: str = "DistributedSampler") -> int:
    """``num_replicas`` or ``rank`` from torch.distributed, only when the user's program initialised it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"{kind}: {name} was not given and torch.distributed is not initialized; "
            f"pass num_replicas=<world size> and rank=<this process's rank>, "
            f"or call torch.distributed.init_process_group() first"
        )
    return dist.get_world_size() if name == "num_replicas" else dist.get_rank()


def _check_rank(num_replicas: Any, rank: Any) -> tuple[int, int]:
    num_replicas = _check_positive_int("num_replicas", num_replicas)
    if not _is_int(rank) or rank >= num_replicas or rank < 0:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
    return num_replicas, int(rank)


class _Span:
    """Where an epoch resumed by a job of another size starts: ``consumed``
    items of the epoch's order were seen before, and this rank had reached
    place ``offset`` of its iteration (its share of the rest follows)."""

    __slots__ = ("consumed", "offset")

    def __init__(self, consumed: int, offset: int):
        self.consumed, self.offset = consumed, offset

    @classmethod
    def of(cls, record: Any) -> "_Span":
        """From a state's record (None: a whole epoch)."""
        if isinstance(record, Mapping) and _is_int(record.get("consumed")) and _is_int(record.get("offset")):
            return cls(int(record["consumed"]), int(record["offset"]))
        return cls(0, 0)

    def record(self) -> Any:
        return {"consumed": self.consumed, "offset": self.offset} if self.consumed else None


class DistributedSampler(_Resumable, Sampler[int]):
    """This replica's share of the dataset indices, for data-parallel training.

    As in torch: the indices (shuffled from ``seed + epoch`` when ``shuffle``)
    are padded by repeating from the start so every replica gets
    ``ceil(n / num_replicas)`` of them, or, with ``drop_last``, cut so every
    replica gets ``n // num_replicas``; replica ``rank`` takes every
    ``num_replicas``-th index from position ``rank``. Call :meth:`set_epoch`
    each epoch, or every epoch repeats the same order.

    ``even=False`` (conveyor's; torch has no such mode) is for evaluation:
    no padding and nothing cut, so every sample is seen exactly once across
    the replicas, whose shares may differ by one sample (and their loaders
    by one batch). Gather the results with ``all_gather_object`` or a
    metric that handles uneven ranks, not with a collective per batch.

    ``num_replicas`` / ``rank`` default to torch.distributed's world size and
    rank when the program has initialised it; conveyor never imports torch for
    this, and asks for them otherwise.

    The numpy flavour shuffles from ``derive_seed(seed, epoch)``; the torch
    flavour (``conveyor.torch``) from a torch.Generator seeded with
    ``seed + epoch``, the same order as torch. The saved state is the same on
    every rank (``rank`` is recorded but not checked), so one rank's state can
    be loaded on all.

    Example::

        >>> list(DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False))
        [1, 3, 0]
    """

    _flavor = "numpy"
    _auto_epoch = False

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        even: bool = True,
    ) -> None:
        if num_replicas is None:
            num_replicas = _world_from_torch("num_replicas")
        if rank is None:
            rank = _world_from_torch("rank")
        self.num_replicas, self.rank = _check_rank(num_replicas, rank)
        self.dataset = dataset
        self.shuffle = bool(shuffle)
        self.seed = _check_int("seed", seed)
        self.drop_last = bool(drop_last)
        if not isinstance(even, bool):
            raise TypeError(f"even must be True or False, got {type(even).__name__} ({even!r})")
        if not even and self.drop_last:
            raise ValueError(
                "DistributedSampler: even=False keeps every sample and drop_last=True cuts some; "
                "pass one of them (even=False for evaluation, every sample once)"
            )
        self.even = even
        self.num_samples = _per_replica(len(dataset), self.num_replicas, self.drop_last, self.rank, even)
        self.total_size = self.num_samples * self.num_replicas if even else len(dataset)
        #: A state of a job of another size, loaded and waiting: (epoch, its span).
        self._pending: tuple[int, _Span] | None = None
        #: The iteration opened last: (epoch, its span).
        self._current: tuple[int, _Span] | None = None
        #: Whether the state loaded last came from a job of another size.
        self.loaded_from_another_size = False
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "dataset_length": len(self.dataset),
            "num_replicas": self.num_replicas,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "flavor": self._flavor,
            # Only when set, so states saved before even= existed still load.
            **({"even": False} if not self.even else {}),
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler stands (JSON values); ``rank`` and ``num_samples``
        (this rank's share) are recorded but not checked on load."""
        return {**super().state_dict(), "rank": self.rank, "num_samples": self._length(self._span_now())}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` at the next ``__iter__`` (see _Resumable).

        A state saved mid-epoch by a job of another size (``num_replicas``)
        loads too. The ranks of a synchronous job stand at the same position,
        and their shares interleave, so together they consumed a prefix of
        the epoch's order; the resumed epoch gives this rank its share of the
        rest (padded or cut for this job's size as usual): the rest of the
        epoch is covered once, and nothing consumed is read again. Positions
        go on from the saved one (the share is preceded by as many places as
        this rank had consumed), so the loader's batch count and this
        sampler's stay in step, and a state saved during that epoch resumes
        it, on this job's size or on yet another. The epochs after it are whole.
        """
        # A state without "even" was saved with padding (before even= existed, or with even=True).
        saved_even = state.get("even", True) if isinstance(state, Mapping) else True
        if saved_even != self.even:
            what = "the state was saved with another even= setting."
            raise _state_error(type(self).__name__, what, {"even": saved_even}, {"even": self.even})
        self._pending = None
        self.loaded_from_another_size = False
        saved_replicas = state.get("num_replicas") if isinstance(state, Mapping) else None
        if _is_int(saved_replicas) and saved_replicas != self.num_replicas and state.get("in_iteration") is True:
            position, epoch = state.get("position"), state.get("epoch")
            if not _is_int(position) or position < 0 or not _is_int(epoch):
                what = "the state's position is malformed."
                raise _state_error(type(self).__name__, what, {"position": position, "epoch": epoch}, {})
            before = _Span.of(state.get("rng"))  # that job's own start, when it had resumed one of another size
            consumed = min(before.consumed + (int(position) - before.offset) * int(saved_replicas), len(self.dataset))
            self._pending = (int(epoch), _Span(consumed, int(position)))
            self.loaded_from_another_size = True
            # Every other setting must match.
            super().load_state_dict({**state, "num_replicas": self.num_replicas, "rng": self._pending[1].record()})
            return
        span = _Span.of(state.get("rng") if isinstance(state, Mapping) else None)
        if span.consumed and state.get("in_iteration") is True and _is_int(state.get("epoch")):
            self._pending = (int(state["epoch"]), span)  # (its length decides how far the position may go)
        super().load_state_dict(state)

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        """The epoch and its span: how much of its order jobs of other sizes
        consumed before this one took over (none for a whole epoch); the
        record, saved in the state, carries it."""
        self._pending = None
        span = _Span.of(record)
        self._current = (epoch, span)
        return (epoch, span), span.record()

    def _span_now(self) -> "_Span":
        """The span of the iteration loaded or running (that of a whole epoch when none)."""
        if self._pending is not None:
            return self._pending[1]
        if self._current is not None and self._cursor is not None and not self._cursor.done:
            return self._current[1]
        return _Span(0, 0)

    def _length(self, span: "_Span") -> int:
        """Places in this rank's iteration: those before the span's share, then the share."""
        if not span.consumed:
            return self.num_samples
        rest = len(self.dataset) - span.consumed
        share = _per_replica(rest, self.num_replicas, self.drop_last, self.rank, self.even) if rest > 0 else 0
        return span.offset + share

    def _max_position(self) -> int:
        return self._length(self._span_now())

    def _epoch_order(self, epoch: int) -> list[int]:
        n = len(self.dataset)
        if _per_replica(n, self.num_replicas, self.drop_last, self.rank, self.even) != self.num_samples:
            raise RuntimeError(
                f"DistributedSampler: the dataset now has {n} samples, which changes the {self.num_samples} "
                f"per replica computed when the sampler was built; build a new DistributedSampler"
            )
        if not self.shuffle:
            return list(range(n))
        if self._flavor == "torch":
            return TorchSource.from_seed(self.seed + epoch).permutation(n)
        return source_for(derive_seed(self.seed, epoch), self._flavor).permutation(n)

    def _chunks(self, context: tuple[int, "_Span"]) -> Iterator[list[Any]]:
        epoch, span = context
        order = self._epoch_order(epoch)
        if not span.consumed:
            yield _shard(order, self.num_replicas, self.rank, self.drop_last, self.even)
            return
        # The places before the share were consumed before the job changed size;
        # the position the iteration resumes at (at least span.offset) skips them.
        yield [None] * span.offset
        rest = order[span.consumed :]
        if rest:
            yield _shard(rest, self.num_replicas, self.rank, self.drop_last, self.even)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return self._length(self._span_now())


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
