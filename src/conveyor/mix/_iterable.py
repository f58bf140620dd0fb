"""``IterableMix``: named streams mixed by weight, resumably.

    iter(IterableMix(...)) ──▶ _MixIterator: position p ──MixOrder.locate(p)──▶ source s ──next(its iterator)──▶ sample
                                state_dict(): p, and per source its epoch, the samples it gave in that epoch, and
                                its iterator's own state (when it has one)

The source of each position is the map-style mix's stateless map; only the
streams themselves move. A source that runs out ends the mix
(``stop="first"``), or starts its next epoch (its ``set_epoch(epoch)`` when
it has one, then a new ``iter()``): with ``stop="all"`` until every source
of positive weight has run out once (with a list of steps, one whose weight
becomes 0 before it runs out is an error; a function's are all waited for),
with ``stop="never"`` for good (``num_samples=`` then bounds the mix).
With worker processes each worker mixes its own copy, over the share of
each stream that the stream gives that worker (streams shard
themselves, as ``ShardStream`` and ``ShardedIterable`` do). The mix owns its
streams' epochs: each pass over it starts them at epoch 0 (``set_epoch(0)``),
on a ``copy.copy`` of each stream that has ``set_epoch``, so two passes at
once (thread workers share the mix's streams) move their own epochs (an
epoch a stream keeps in an object it holds is still shared).
"""

from __future__ import annotations

import copy
import numbers
import operator
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from ..dataset._protocol import IterableDataset, is_iterable_dataset
from ..state._stateful import is_stateful
from ._dataset import STOPS, check_sources
from ._order import MixOrder
from ._schedule import WeightsLike, blocks_of

__all__ = ["IterableMix"]


class IterableMix(IterableDataset[Any]):
    """Named iterable sources (streams) mixed by weight, with the same
    stateless choice of source per position as :class:`Mix`, resumable.

    Arguments: ``sources`` a mapping name -> iterable dataset; ``weights``,
    ``schedule_every`` as for :class:`Mix` (default: equal weights);
    ``num_samples`` the most samples it yields (None: no bound; with
    workers, each worker's copy yields that many); ``stop``
    ``"first"`` (default), ``"all"`` or ``"never"`` (needs
    ``num_samples``). Its iterator has ``state_dict()`` /
    ``load_state_dict()``: the mix's position and, per source, its epoch,
    the samples it gave in that epoch and its iterator's own state; a source
    whose iterator has no state is resumed by reading those samples again.

    Example::

        >>> mix = IterableMix({"a": range(3), "b": range(10, 12)},
        ...                   weights={"a": 1, "b": 1})
        >>> list(mix)
        [0, 10, 1, 11, 2]
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: WeightsLike = None,
        *,
        num_samples: Optional[int] = None,
        stop: Optional[str] = None,
        schedule_every: Optional[int] = None,
    ) -> None:
        self.names, self.sources = check_sources(sources, "IterableMix")
        for name, source in zip(self.names, self.sources):
            if not is_iterable_dataset(source) and not callable(getattr(source, "__iter__", None)):
                raise TypeError(f"IterableMix: sources[{name!r}] is a {type(source).__name__}, not iterable")
        if stop is not None and stop not in STOPS:
            raise ValueError(f"IterableMix: stop must be one of {STOPS}, got {stop!r}")
        if num_samples is not None:
            if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or num_samples < 0:
                raise ValueError(f"IterableMix: num_samples must be an int >= 0, got {num_samples!r}")
        elif stop == "never":
            raise ValueError("IterableMix: stop='never' needs num_samples= (else the mix never ends)")
        self.stop = stop or "first"
        self.num_samples = None if num_samples is None else int(num_samples)
        if weights is None:
            weights = dict.fromkeys(self.names, 1)
        self._blocks = blocks_of(weights, self.names, (1,) * len(self.names), schedule_every)
        self._order = MixOrder(self._blocks, len(self.names))
        #: Per source, whether any block reads it (a function's may: all): stop="all" waits for those only.
        count = self._blocks.count()
        self._read = [
            count is None or any(self._blocks.weights(b)[s] > 0 for b in range(count)) for s in range(len(self.names))
        ]

    def _never_read_after(self, position: int, sources: list[int]) -> bool:
        """Whether a finite schedule reads none of ``sources`` from ``position`` on."""
        count = self._blocks.count()
        if count is None:
            return False
        later = range(self._blocks.block_at(position), count)
        return not any(self._blocks.weights(b)[s] > 0 for b in later for s in sources)

    def __iter__(self) -> Iterator[Any]:
        return _MixIterator(self)

    def source_of(self, position: int) -> str:
        """The name of the source that position ``position`` (an int >= 0,
        below ``num_samples`` when given) reads."""
        p = operator.index(position)
        if p < 0 or (self.num_samples is not None and p >= self.num_samples):
            bound = "..." if self.num_samples is None else self.num_samples
            raise IndexError(f"IterableMix: position {position} is outside the mix's positions [0, {bound})")
        return self.names[self._order.locate(p)[0]]

    def resume_settings(self) -> dict[str, Any]:
        """What a loader's state records of the mix (see ``Mix.resume_settings``)."""
        return {
            "mix_sources": list(self.names),
            "mix_weights": self._blocks.fingerprint(),
            "mix_stop": self.stop,
            "mix_length": self.num_samples,
        }


class _MixIterator(Iterator[Any]):
    """One pass over an :class:`IterableMix` (see the module docstring)."""

    def __init__(self, mix: IterableMix) -> None:
        self.mix = mix
        self.position = 0
        n = len(mix.names)
        self.epochs = [0] * n
        self.taken = [0] * n
        self.ran_out = [False] * n
        self._iterators: list[Optional[Iterator[Any]]] = [None] * n
        # A stream whose epoch the mix sets is a copy of its own (thread workers share the mix's
        # streams, as copy.copy of the mix shares them: each worker's iterator moves its own epochs).
        self._streams = [copy.copy(s) if callable(getattr(s, "set_epoch", None)) else s for s in mix.sources]
        self._done = False

    def _iterator(self, s: int) -> Iterator[Any]:
        iterator = self._iterators[s]
        if iterator is None:
            source = self._streams[s]
            set_epoch = getattr(source, "set_epoch", None)
            if callable(set_epoch):  # (every pass of the mix starts its streams at their epoch 0)
                set_epoch(self.epochs[s])
            iterator = self._iterators[s] = iter(source)
        return iterator

    def __next__(self) -> Any:
        mix = self.mix
        if self._done or (mix.num_samples is not None and self.position >= mix.num_samples):
            self._done = True
            raise StopIteration
        s = mix._order.locate(self.position)[0]
        for _ in range(2):
            try:
                sample = next(self._iterator(s))
            except StopIteration:
                if not self._next_epoch(s):
                    self._done = True
                    raise StopIteration from None
                continue
            self.taken[s] += 1
            self.position += 1
            return sample
        raise ValueError(
            f"IterableMix: the source {mix.names[s]!r} yielded nothing in a whole epoch; give the mix only sources "
            f"that yield samples (a stream sharded over more workers than it has shards yields none in some)"
        )

    def _next_epoch(self, s: int) -> bool:
        """Source ``s`` ran out: start its next epoch, or say the mix ends."""
        self.ran_out[s] = True
        mix = self.mix
        if mix.stop == "first":
            return False
        if mix.stop == "all":
            waiting = [i for i, read in enumerate(mix._read) if read and not self.ran_out[i]]
            if not waiting:
                return False
            if mix._never_read_after(self.position, waiting):
                raise ValueError(
                    f"IterableMix: with stop='all' the mix never ends: the sources {[mix.names[i] for i in waiting]} "
                    f"stop being read (their weight becomes 0) before running out (a stream runs out when a read "
                    f"finds it empty); give num_samples= or stop='first'"
                )
        self.epochs[s] += 1
        self.taken[s] = 0
        self._iterators[s] = None
        return True

    def state_dict(self) -> dict[str, Any]:
        """The mix's position, and per source its epoch, samples taken in it, its iterator's state."""
        sources = {}
        for s, name in enumerate(self.mix.names):
            iterator = self._iterators[s]
            own = iterator.state_dict() if iterator is not None and is_stateful(iterator) else None
            sources[name] = {"epoch": self.epochs[s], "taken": self.taken[s], "ran_out": self.ran_out[s], "state": own}
        return {"position": self.position, "done": self._done, "sources": sources}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a mix over the same sources)."""
        if not isinstance(state, Mapping) or set(state.get("sources", {})) != set(self.mix.names):
            saved = sorted(state.get("sources", {})) if isinstance(state, Mapping) else state
            raise ValueError(
                f"IterableMix: the state was saved over the sources {saved}, this mix has {sorted(self.mix.names)}; "
                f"resume with the same sources"
            )
        self.position, self._done = int(state["position"]), bool(state["done"])
        for s, name in enumerate(self.mix.names):
            saved = state["sources"][name]
            self.epochs[s], self.taken[s], self.ran_out[s] = int(saved["epoch"]), int(saved["taken"]), saved["ran_out"]
            self._iterators[s] = None
            iterator = self._iterator(s)
            if saved["state"] is not None:
                if not is_stateful(iterator):
                    raise ValueError(
                        f"IterableMix: the state holds an iterator state for {name!r}, but its iterator has no "
                        f"load_state_dict"
                    )
                iterator.load_state_dict(saved["state"])
            else:
                for _ in range(self.taken[s]):  # (no state: read its samples of this epoch again)
                    next(iterator)
