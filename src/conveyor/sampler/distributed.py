"""DistributedSampler: one replica's share of the dataset's indices, from a
stored order (a list of the epoch) or a computed one (per position).

The sharding it shares with ShardedSampler and TokenBudgetBatchSampler is in
:mod:`.sharding`; ShardedSampler itself in :mod:`.sharded`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any

import numpy as np

from conveyor.rng import TorchSource, derive_seed, source_for

from .arguments import _check_int, _is_int, checked_length
from .order import block_bounds, check_saved_order, order_setting, resolve_order
from .permutation import KeyedPermutation
from .resumable import _Resumable, _state_error
from .samplers import Sampler
from .sharded import ShardedSampler  # noqa: F401  (its former home: samplers pickled before the split name it)
from .sharding import _check_rank, _per_replica, _shard, _world_from_torch


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


def resumed_span(kind: str, state: Any, num_replicas: int, total: int) -> tuple[Any, bool, Any]:
    """Where a loaded state's epoch resumes on this job of ``num_replicas``
    ranks over ``total`` positions: ``(pending, from_another_size, state)``,
    the pending ``(epoch, _Span)`` (None: nothing to resume inside an
    epoch), whether the state was saved mid-epoch by a job of another size,
    and the state to load (for another size: this job's size, and the span
    the ranks of the saving job consumed together, as the ``rng`` record).

    The ranks of a synchronous job stand at the same position and their
    positions interleave, so together they consumed a prefix of the epoch's
    one order: ``consumed`` places, after ``offset`` = the saved position
    (refused past that job's epoch: each of its ranks had at most
    ``ceil(rest / its size)`` places)."""
    saved_replicas = state.get("num_replicas") if isinstance(state, Mapping) else None
    if _is_int(saved_replicas) and saved_replicas != num_replicas and state.get("in_iteration") is True:
        position, epoch = state.get("position"), state.get("epoch")
        if not _is_int(position) or position < 0 or not _is_int(epoch) or saved_replicas < 1:
            what = "the state's position or number of ranks is malformed."
            saved = {"position": position, "epoch": epoch, "num_replicas": saved_replicas}
            raise _state_error(kind, what, saved, {})
        before = _Span.of(state.get("rng"))  # (that job's own start, if it had resumed one of another size)
        # That job's ranks had at most ceil(rest / its size) places each after its own start.
        limit = before.offset + -(-max(total - before.consumed, 0) // int(saved_replicas))
        if int(position) > limit:
            what = "the saved position is past the end of an iteration of the job that saved it."
            raise _state_error(kind, what, {"position": position, "num_replicas": saved_replicas}, {"len": limit})
        consumed = min(before.consumed + (int(position) - before.offset) * int(saved_replicas), total)
        span = _Span(consumed, int(position))
        return (int(epoch), span), True, {**state, "num_replicas": num_replicas, "rng": span.record()}
    span = _Span.of(state.get("rng") if isinstance(state, Mapping) else None)
    if span.consumed and state.get("in_iteration") is True and _is_int(state.get("epoch")):
        return (int(state["epoch"]), span), False, state  # (its length decides how far the position may go)
    return None, False, state


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

    ``order=`` (conveyor): ``"stored"`` shuffles the epoch as a list, as
    torch; ``"computed"`` takes this rank's ``k``-th index from position
    ``rank + k * num_replicas`` of ``KeyedPermutation(n, derive_seed(seed,
    epoch))`` (:mod:`.order`), padding with position ``p % n`` and cutting
    with ``drop_last`` as torch does, so no rank holds anything of the
    dataset's size and a resume starts at its position at once.
    ``"auto"`` (default): computed for more than ``order.COMPUTED_ABOVE``
    (2**24) samples in the numpy core; ``conveyor.torch`` keeps torch's
    exact order (stored) unless ``order="computed"`` is given.

    Example::

        >>> list(DistributedSampler(range(5), num_replicas=2, rank=1, shuffle=False))
        [1, 3, 0]
    """

    _flavor = "numpy"
    _auto_epoch = False
    #: "stored" or "computed" (set at construction); a sampler pickled before order= existed has the stored one.
    order = "stored"

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
        order: str = "auto",
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
        #: "stored" or "computed" (``order="auto"`` resolved at construction).
        self.order = resolve_order(type(self).__name__, order, len(dataset), self._flavor == "torch")
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
            **order_setting(self.order),
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
        check_saved_order(type(self).__name__, state, self.order)
        # A state without "even" was saved with padding (before even= existed, or with even=True).
        saved_even = state.get("even", True) if isinstance(state, Mapping) else True
        if saved_even != self.even:
            what = "the state was saved with another even= setting."
            raise _state_error(type(self).__name__, what, {"even": saved_even}, {"even": self.even})
        before = self._pending, self.loaded_from_another_size
        self._pending, self.loaded_from_another_size, state = resumed_span(
            type(self).__name__, state, self.num_replicas, len(self.dataset)
        )
        try:
            super().load_state_dict(state)  # (every other setting must match; it reads the span's length)
        except BaseException:
            self._pending, self.loaded_from_another_size = before  # (refused: nothing changed)
            raise

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        """The epoch and its span: how much of its order jobs of other sizes
        consumed before this one took over (none for a whole epoch); the
        record, saved in the state, carries it."""
        self._pending = None
        span = _Span.of(record)
        self._current = (epoch, span)
        return (epoch, span), span.record()

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self._resume is None:  # (a resume point of another size dropped: its span goes with it)
            self._pending = None

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

    def _check_length(self) -> int:
        n = len(self.dataset)
        if _per_replica(n, self.num_replicas, self.drop_last, self.rank, self.even) != self.num_samples:
            raise RuntimeError(
                f"DistributedSampler: the dataset now has {n} samples, which changes the {self.num_samples} "
                f"per replica computed when the sampler was built; build a new DistributedSampler"
            )
        return n

    def _epoch_order(self, epoch: int) -> list[int]:
        n = self._check_length()
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

    def _chunks_from(self, context: tuple[int, "_Span"], position: int) -> Iterable[Sequence[Any]]:
        if self.order == "stored":
            return super()._chunks_from(context, position)
        return self._computed_share(context, position)

    def _computed_share(self, context: tuple[int, "_Span"], position: int) -> Iterator[list[Any]]:
        """Places ``position`` on of this rank's iteration, computed: place
        ``k`` of the share is place ``rank + k * num_replicas`` of the padded
        (or cut) rest of the epoch, that is position ``consumed + g % rest``
        of the epoch's permutation (padding repeats the order from its
        start, as :func:`.sharding._shard` does)."""
        epoch, span = context
        n = self._check_length()
        permutation = KeyedPermutation(n, derive_seed(self.seed, epoch)) if self.shuffle else None
        if position < span.offset:  # (places consumed before a job of another size took over: skipped)
            yield [None] * (span.offset - position)
            position = span.offset
        rest = n - span.consumed
        if rest <= 0:
            return
        stop = self._length(span)
        for first, last in block_bounds(position - span.offset, stop - span.offset):
            k = np.arange(first, last, dtype=np.uint64)
            places = k * np.uint64(self.num_replicas) + np.uint64(self.rank)
            places %= np.uint64(rest)
            places += np.uint64(span.consumed)
            yield (permutation.take(places) if permutation is not None else places).tolist()

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return checked_length(type(self).__name__, self._length(self._span_now()))
