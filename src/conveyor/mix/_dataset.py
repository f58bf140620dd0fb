"""``Mix``: a map-style dataset that mixes named sources by weight.

    Mix({"web": a, "code": b}, weights={"web": 3, "code": 1}, seed=0, num_samples=N)

    mix[p] ──MixOrder.locate(p)──▶ (source s, its k-th sample)
           ──divmod(k, len(s))──▶ (epoch e, position i in the epoch)
           ──KeyedPermutation(len(s), key(seed, name, e))[i]──▶ index ──▶ s[index]

Nothing of the mix's size is stored and nothing changes as it is read: the
map is a pure function of (seed, weights, position), so any sampler (one
that shuffles the positions too), any number of workers and ranks, and a
resume at any position see the same samples (a source of up to 2**18
samples has each epoch's permutation written out once per process, a
cache of the same map). The mix itself needs no
state; a loader's state records what shapes its order
(:meth:`Mix.resume_settings`), so a state saved over another mix is
refused, naming what differs.
"""

from __future__ import annotations

import numbers
import operator
import sys
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from ..dataset._protocol import Dataset, is_iterable_dataset
from ..rng import derive_seed
from ..sampler.permutation import KeyedPermutation
from ._order import MixOrder
from ._report import MixReport, SourceReport
from ._schedule import Blocks, WeightsLike, blocks_of

__all__ = ["Mix", "STOPS", "check_sources"]

#: The stopping rules: the mix ends when the first source runs out, when
#: every source has run out once, or never (num_samples= sets the length).
STOPS = ("first", "all", "never")
#: Permutations kept per source (one per epoch in use; two cover a wrap).
_PERMUTATIONS_KEPT = 4
#: A source up to this long has its epoch's permutation written out once per
#: process (4 bytes a sample, 1 MiB at most), a batch then read by one numpy
#: index instead of the keyed permutation's rounds; longer ones are computed
#: per position, as always.
_TABULATED_MAX = 1 << 18


def check_sources(sources: Any, owner: str) -> tuple[tuple[str, ...], tuple[Any, ...]]:
    """``sources`` (a mapping name -> source) as names and sources, or a TypeError/ValueError."""
    if not isinstance(sources, Mapping):
        raise TypeError(
            f"{owner}: sources must be a mapping from name to dataset, e.g. {owner}({{'web': web, 'code': code}}, "
            f"weights=...), got {type(sources).__name__}"
        )
    if not sources:
        raise ValueError(f"{owner}: sources is empty; give at least one named source")
    names = tuple(sources)
    bad = [name for name in names if not isinstance(name, str) or not name]
    if bad:
        raise TypeError(f"{owner}: source names must be non-empty strings, got {bad!r}")
    return names, tuple(sources[name] for name in names)


def _source_key(seed: int, name: str, epoch: int) -> int:
    """The key of ``name``'s permutation in ``epoch`` (stable across runs and platforms)."""
    return derive_seed(seed, zlib.crc32(name.encode("utf-8")), epoch)


def _check_num_samples(num_samples: Any) -> int:
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(f"Mix: num_samples must be an int (the mix's length), got {type(num_samples).__name__}")
    n = int(num_samples)
    if n < 0 or n > sys.maxsize:
        raise ValueError(
            f"Mix: num_samples must be in [0, 2**63 - 1] (a Python len() is at most that, below 2**64), got {n}"
        )
    return n


class Mix(Dataset[Any]):
    """Named map-style sources mixed by weight: position ``p`` holds a sample
    of one source, chosen by a stateless map.

    Every prefix of the mix (every block of constant weights, with a
    schedule) is within one sample per source of its share: after ``p``
    positions, source ``s`` has served ``c`` samples with
    ``|c - p * share_s| < 1``. The shares are the weights normalised, exact
    when the weights are ratios of small integers, else each within
    ``2**-20`` times the number of sources (``mix/_shares.py``;
    ``Mix.shares`` gives them). How the order is built and why it holds:
    ``mix/_period.py``.

    Each source is read in its own keyed permutation (``shuffle=True``), a
    new one each time it wraps into a new epoch (key from ``seed``, its
    name and its epoch); within an epoch no sample repeats or is skipped,
    across changes of weights too.

    Arguments:
        sources: a mapping name -> map-style dataset (``len`` and ``[]``;
            each non-empty).
        weights: a mapping name -> weight (numbers >= 0, not all 0; one
            per source); a list of ``(position, mapping)`` steps, the first
            at 0; or a function of the position (samples served before)
            returning a mapping, read once per block of ``schedule_every``
            positions. Default: proportional to the sources' lengths.
        seed: roots every source's permutations (an int).
        num_samples: the mix's length; sources wrap into new epochs as
            needed (``stop="never"``, the default when it is given).
        stop: without ``num_samples``, where the mix ends: ``"first"``
            (default) when the first source runs out, ``"all"`` when every
            source (of positive weight) has run out once, smaller ones
            wrapping meanwhile.
        schedule_every: with ``weights`` a function, the block length.
        shuffle: read each source in a keyed permutation (default), or in
            its own order (epoch after epoch).

    Bad arguments (weights negative, NaN, infinite, all zero, for other
    sources; an empty source; a bad ``num_samples`` or ``stop``) raise a
    ValueError or TypeError here, naming the argument and the fix.

    Example::

        >>> mix = Mix({"a": list(range(10)), "b": list(range(100, 104))},
        ...           weights={"a": 3, "b": 1}, num_samples=8, seed=0)
        >>> [mix.locate(p)[0] for p in range(8)]
        ['a', 'a', 'a', 'b', 'a', 'a', 'a', 'b']
    """

    names: tuple[str, ...]
    sources: tuple[Any, ...]
    lengths: tuple[int, ...]
    seed: int
    shuffle: bool
    stop: str
    _length: int
    _blocks: Blocks
    _order: MixOrder
    _permutations: dict[tuple[int, int], KeyedPermutation]
    _tables: dict[tuple[int, int], np.ndarray]

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: WeightsLike = None,
        *,
        seed: int = 0,
        num_samples: Optional[int] = None,
        stop: Optional[str] = None,
        schedule_every: Optional[int] = None,
        shuffle: bool = True,
    ) -> None:
        self.names, self.sources = check_sources(sources, "Mix")
        for name, source in zip(self.names, self.sources):
            if is_iterable_dataset(source) or not hasattr(source, "__getitem__") or not hasattr(source, "__len__"):
                raise TypeError(
                    f"Mix: sources[{name!r}] is a {type(source).__name__}, not a map-style dataset (len and []); "
                    f"give Mix map-style datasets (a stream can be read into a list, or indexed)"
                )
        self.lengths = tuple(len(source) for source in self.sources)
        empty = [name for name, n in zip(self.names, self.lengths) if n == 0]
        if empty:
            raise ValueError(f"Mix: the sources {empty} have no samples (length 0); leave them out of the mix")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"Mix: seed must be an int, got {type(seed).__name__}")
        if not isinstance(shuffle, bool):
            raise TypeError(f"Mix: shuffle must be True or False, got {shuffle!r}")
        self.seed, self.shuffle = int(seed), shuffle
        self._blocks = blocks_of(weights, self.names, self.lengths, schedule_every)
        self._order = MixOrder(self._blocks, len(self.names))
        self.stop, self._length = self._stop_and_length(stop, num_samples)
        self._permutations = {}
        self._tables = {}

    def __getstate__(self) -> dict[str, Any]:
        # (sent to workers without its caches: each process writes out what it reads)
        return {**vars(self), "_permutations": {}, "_tables": {}}

    # -- length ---------------------------------------------------------------

    def _stop_and_length(self, stop: Any, num_samples: Any) -> tuple[str, int]:
        if stop is not None and stop not in STOPS:
            raise ValueError(f"Mix: stop must be one of {STOPS}, got {stop!r}")
        if num_samples is not None:
            if stop not in (None, "never"):
                raise ValueError(
                    f"Mix: num_samples= sets the mix's length and stop={stop!r} computes one; give num_samples= "
                    f"(sources wrap as needed) or stop=, not both"
                )
            return "never", _check_num_samples(num_samples)
        if stop == "never":
            raise ValueError("Mix: stop='never' needs num_samples= (the mix's length: a map-style dataset has one)")
        stop = stop or "first"
        if stop == "first":
            first = self._order.first_reached(dict(enumerate(self.lengths)))
            assert first is not None  # (the last block, or every block of a function, reads some source)
            return stop, first
        ends = {name: self._order.reaches(s, n) for s, (name, n) in enumerate(zip(self.names, self.lengths))}
        never = [name for name, end in ends.items() if end is None and self._ever_read(name)]
        if never:
            raise ValueError(
                f"Mix: with stop='all' the mix never ends: the sources {never} stop being read (their weight "
                f"becomes 0) before running out; give num_samples= or stop='first'"
            )
        return stop, max(end for end in ends.values() if end is not None)

    def _ever_read(self, name: str) -> bool:
        s = self.names.index(name)
        count = self._blocks.count()
        return count is None or any(self._blocks.weights(b)[s] > 0 for b in range(count))

    def __len__(self) -> int:
        return self._length

    # -- the map --------------------------------------------------------------

    def _position(self, position: Any) -> int:
        p = operator.index(position)
        if p < 0:
            p += self._length
        if not 0 <= p < self._length:
            raise IndexError(f"Mix: position {position} is outside the mix's {self._length} positions")
        return p

    def _permutation(self, source: int, epoch: int) -> KeyedPermutation:
        key = (source, epoch)
        permutation = self._permutations.get(key)
        if permutation is None:
            if len(self._permutations) >= _PERMUTATIONS_KEPT * len(self.names):
                self._permutations.clear()
            permutation = KeyedPermutation(self.lengths[source], _source_key(self.seed, self.names[source], epoch))
            self._permutations[key] = permutation
        return permutation

    def _table(self, source: int, epoch: int) -> Optional[np.ndarray]:
        """Source ``source``'s permutation of ``epoch`` written out (None for a long source)."""
        if self.lengths[source] > _TABULATED_MAX:
            return None
        key = (source, epoch)
        table = self._tables.get(key)
        if table is None:
            if len(self._tables) >= _PERMUTATIONS_KEPT * len(self.names):
                self._tables.clear()
            table = self._permutation(source, epoch).block(0, self.lengths[source]).astype(np.int32)
            self._tables[key] = table
        return table

    def _index(self, source: int, count: int) -> int:
        epoch, within = divmod(count, self.lengths[source])
        return self._permutation(source, epoch)[within] if self.shuffle else within

    def locate(self, position: int) -> tuple[str, int]:
        """(source name, index in that source) of ``position``."""
        source, count = self._order.locate(self._position(position))
        return self.names[source], self._index(source, count)

    def locate_many(self, positions: "Sequence[int] | np.ndarray") -> tuple[np.ndarray, np.ndarray]:
        """(source numbers, indices in them) of ``positions``, two int64 arrays
        (``Mix.names[source]`` names a source)."""
        given = np.asarray(positions).reshape(-1)
        if given.size and given.dtype.kind not in "iu":  # (as one position is an int: 1.5 is not truncated to 1)
            raise TypeError(f"Mix: positions must be ints, got an array of {given.dtype}")
        if given.size and given.dtype.kind == "u" and int(given.max()) >= self._length:
            raise IndexError(f"Mix: positions outside the mix's {self._length} positions")  # (before a wrap to int64)
        p = given.astype(np.int64, copy=False)
        if p.size and (p.min() < -self._length or p.max() >= self._length):
            raise IndexError(f"Mix: positions outside the mix's {self._length} positions")
        p = np.where(p < 0, p + self._length, p)
        sources, counts = self._order.locate_many(p)
        indices = counts.copy()
        for s in np.unique(sources).tolist():
            where = np.flatnonzero(sources == s)
            epochs, within = np.divmod(counts[where], self.lengths[s])
            if not self.shuffle:
                indices[where] = within
                continue
            for epoch in np.unique(epochs).tolist():
                sel = epochs == epoch
                table = self._table(s, epoch)
                chosen = within[sel]
                indices[where[sel]] = table[chosen] if table is not None else self._permutation(s, epoch).take(chosen)
        return sources, indices

    def __getitem__(self, position: int) -> Any:
        name, index = self.locate(position)
        return self.sources[self.names.index(name)][index]

    def __getitems__(self, positions: list[int]) -> list[Any]:
        """The samples at ``positions``: one ``__getitems__`` (or ``[]`` each) per source."""
        sources, indices = self.locate_many(positions)
        out: list[Any] = [None] * len(sources)
        for s in np.unique(sources).tolist():
            where = np.flatnonzero(sources == s).tolist()
            source, wanted = self.sources[s], indices[where].tolist()
            many = getattr(source, "__getitems__", None)
            samples = many(wanted) if callable(many) else [source[i] for i in wanted]
            for slot, sample in zip(where, samples):
                out[slot] = sample
        return out

    # -- what it says about itself --------------------------------------------

    @property
    def shares(self) -> dict[str, float]:
        """Each source's exact share of the positions (the first block's, with a schedule)."""
        shares = self._blocks.shares(0)
        return {name: shares.share(s) for s, name in enumerate(self.names)}

    def counts(self, position: int) -> dict[str, int]:
        """Samples each source has served in positions ``[0, position)``."""
        counts = self._order.counts(self._bounded(position))
        return {name: int(c) for name, c in zip(self.names, counts)}

    def account(self, positions: "Sequence[int] | np.ndarray") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per source, over ``positions`` (any set: a loader's delivered
        batches): its samples there (int64), its target there (the sum over
        the positions of its share at each, float64), and one past the
        highest count among them (int64; 0 where it has none: its epoch is
        ``divmod`` of that by its length)."""
        p = np.asarray(positions, dtype=np.int64).reshape(-1)
        n = len(self.names)
        served, target, reached = np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64)
        if not p.size:
            return served, target, reached
        p = np.where(p < 0, p + self._length, p)
        sources, counts = self._order.locate_many(p)
        served += np.bincount(sources, minlength=n)
        np.maximum.at(reached, sources, counts + 1)
        blocks, at = np.unique(self._blocks.blocks_at(p), return_counts=True)
        for block, many in zip(blocks.tolist(), at.tolist()):
            shares = self._blocks.shares(block)
            target += many * np.asarray(shares.units, dtype=np.float64) / shares.period
        return served, target, reached

    def _bounded(self, position: Any) -> int:
        p = operator.index(position)
        if not 0 <= p <= self._length:
            raise ValueError(f"Mix: a position in [0, {self._length}] (a prefix of the mix), got {position}")
        return p

    def report(self, position: int) -> MixReport:
        """Per source, its samples served in the first ``position`` positions
        against its target, and its epoch (:class:`MixReport`; ``.table()``
        prints it)."""
        p = self._bounded(position)
        counts, targets = self._order.counts(p), self._order.target(p)
        rows = []
        for s, name in enumerate(self.names):
            served, length = int(counts[s]), self.lengths[s]
            epoch, in_epoch = divmod(served, length)
            share = served / p if p else 0.0
            target_share = float(targets[s]) / p if p else self._blocks.shares(0).share(s)
            rows.append(SourceReport(name, served, float(targets[s]), share, target_share, epoch, in_epoch, length))
        return MixReport(p, tuple(rows))

    def resume_settings(self) -> dict[str, Any]:
        """What a loader's state records of the mix, and checks on load: a
        state saved over other sources, weights, seed or length is refused,
        naming the keys that differ."""
        return {
            "mix_sources": list(self.names),
            "mix_lengths": list(self.lengths),
            "mix_weights": self._blocks.fingerprint(),
            "mix_seed": self.seed,
            "mix_shuffle": self.shuffle,
            "mix_length": self._length,
        }

    def __repr__(self) -> str:
        shares = ", ".join(f"{name}: {share:.4g}" for name, share in self.shares.items())
        return f"Mix({{{shares}}}, {self._length} positions, stop={self.stop!r}, seed={self.seed})"
