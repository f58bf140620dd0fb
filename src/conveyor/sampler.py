"""Samplers: the order in which a loader visits a dataset, resumable at any item.

::

    (seed, epoch) or generator ──▶ sampler.__iter__ ──▶ indices ──▶ BatchSampler ──▶ batches
                                        │ draws chunks (a permutation, 32 random ints, ...)
                                        └─ _Cursor: epoch, replay record, items yielded so far

* A sampler draws in chunks and yields the items of each chunk; a ``_Cursor``
  counts what has been handed out, so ``state_dict()`` is cheap at any moment.
* ``state_dict()`` records *what the current iteration was drawn from* (a seed,
  an epoch or a generator state taken before the first draw) and the
  *position* (items yielded so far). ``load_state_dict()`` makes the next
  ``__iter__`` draw again from that record and skip ``position`` items, chunk
  by chunk, so the generator ends where the uninterrupted run left it.

The samplers carry torch.utils.data's names, arguments, lengths and error
messages. Randomness comes from :mod:`conveyor.rng`: a class attribute
``_flavor`` (``"numpy"`` here, ``"torch"`` in ``conveyor.torch``) decides which
global generator is used when ``generator=None``; a ``torch.Generator`` passed
in is drawn from exactly as torch does, so orders match torch's item for item.

State dictionaries hold plain JSON values: ``version``, ``kind`` (the class
name), the settings that must match on load, then ``epoch``, ``position``,
``in_iteration`` and ``rng`` (the replay record). ``position`` may be lowered
before loading (a loader that prefetched can rewind to what it delivered).
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
import sys
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from conveyor.rng import TorchSource, derive_seed, draw_seed, is_torch_generator, source_for

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "TokenBudgetBatchSampler",
]

T_co = TypeVar("T_co", covariant=True)

_STATE_VERSION = 1
# torch draws sampling-with-replacement indices 32 at a time; drawing the same
# chunks keeps a shared torch.Generator in step with torch.utils.data.
_REPLACEMENT_CHUNK_ITEMS = 32
_PROGRESS_KEYS = ("epoch", "position", "in_iteration", "rng")


# ---------------------------------------------------------------------------
# argument checks


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_positive_int(name: str, value: Any, context: str = "") -> int:
    """``value`` as an int, or torch's ValueError for a non-positive or non-integer value."""
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value}{context}")
    return int(value)


def _check_bool(name: str, value: Any, error: type[Exception] = ValueError) -> bool:
    if not isinstance(value, bool):
        raise error(f"{name} should be a boolean value, but got {name}={value}")
    return value


def _check_int(name: str, value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"{name} should be an integer, but got {name}={value!r} ({type(value).__name__})")
    return int(value)


# ---------------------------------------------------------------------------
# resumable iteration


class _Cursor:
    """How far one iteration of a sampler got, and the record it was drawn from.

    Items are handed out with ``yield from cursor.feed(chunk)``; the position is
    read back from the chunk's iterator (``length_hint``) instead of being
    counted per item, which keeps the per-item cost at a plain ``yield from``.
    """

    __slots__ = ("epoch", "record", "done", "_base", "_items", "_size")

    def __init__(self, epoch: int, record: Any, position: int):
        self.epoch = epoch
        self.record = record
        self.done = False
        self._base = position
        self._items: Iterator[Any] = iter(())
        self._size = 0

    @property
    def position(self) -> int:
        return self._base + self._size - operator.length_hint(self._items)

    def feed(self, chunk: Sequence[Any]) -> Iterator[Any]:
        """Iterator over ``chunk``; the previous chunk must have been used up."""
        self._base += self._size
        self._items = iter(chunk)
        self._size = len(chunk)
        return self._items

    def advance(self) -> None:
        """Count one item handed out without ``feed`` (one batch of a BatchSampler)."""
        self._base += 1


def _drop(chunks: Iterable[Sequence[Any]], skip: int) -> Iterator[Sequence[Any]]:
    """``chunks`` without their first ``skip`` items; every chunk is still drawn."""
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        yield chunk[skip:] if skip else chunk
        skip = 0


class _Resume:
    """A loaded state waiting for the next ``__iter__``."""

    __slots__ = ("epoch", "position", "record")

    def __init__(self, epoch: int, position: int, record: Any):
        self.epoch, self.position, self.record = epoch, position, record


def _state_error(kind: str, what: str, saved: Mapping[str, Any], mine: Mapping[str, Any]) -> ValueError:
    saved_text = ", ".join(f"{key}={value!r}" for key, value in saved.items())
    mine_text = ", ".join(f"{key}={value!r}" for key, value in mine.items())
    return ValueError(
        f"{kind}.load_state_dict: {what}\n"
        f"  saved state:  {saved_text}\n"
        f"  this sampler: {mine_text}\n"
        f"Fix: build the sampler with the same dataset and arguments as the run that saved the "
        f"state (and the same conveyor version), or start without load_state_dict."
    )


def _check_state(kind: str, state: Any, expected: Mapping[str, Any]) -> None:
    """Raise ValueError, showing both sides, when ``state`` was not saved by a sampler like this one."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{kind}.load_state_dict expects the dict returned by state_dict(), got {type(state).__name__}")
    header = {"version": _STATE_VERSION, "kind": kind}
    saved_header = {key: state.get(key, "<missing>") for key in header}
    if saved_header != header:
        raise _state_error(kind, "the state comes from another kind of sampler or state version.", saved_header, header)
    saved = {key: state.get(key, "<missing>") for key in expected}
    differing = [key for key in expected if saved[key] != expected[key]]
    if differing:
        raise _state_error(
            kind,
            "the state was saved by a sampler with other settings.",
            {key: saved[key] for key in differing},
            {key: expected[key] for key in differing},
        )


def _read_progress(kind: str, state: Mapping[str, Any]) -> tuple[int, int, bool, Any]:
    missing = [key for key in _PROGRESS_KEYS if key not in state]
    if missing:
        raise ValueError(f"{kind}.load_state_dict: the state lacks {missing}; pass a dict returned by state_dict()")
    epoch, position, in_iteration = state["epoch"], state["position"], state["in_iteration"]
    if not _is_int(epoch) or not _is_int(position) or position < 0 or not isinstance(in_iteration, bool):
        raise ValueError(
            f"{kind}.load_state_dict: epoch and position must be integers (position >= 0) and "
            f"in_iteration a bool, got epoch={epoch!r}, position={position!r}, in_iteration={in_iteration!r}"
        )
    return int(epoch), int(position), in_iteration, state["rng"]


class _Resumable:
    """Shared ``__iter__`` skeleton, ``state_dict``, ``load_state_dict`` and ``set_epoch``.

    A subclass provides ``_settings()`` (what must match on load), ``_open(epoch,
    record)`` (the draw context for an iteration, from scratch when ``record`` is
    None, and the record to replay it) and ``_chunks(context)`` (the items, as
    sequences). Samplers whose draws do not follow from the epoch override
    ``_idle_record`` / ``_restore_idle`` to carry a generator's state between
    iterations.
    """

    #: Whether each iteration moves ``epoch`` on by one (torch's DistributedSampler does not).
    _auto_epoch = True

    epoch: int

    def _init_progress(self) -> None:
        self.epoch = 0
        self._cursor: _Cursor | None = None
        self._resume: _Resume | None = None

    # -- hooks -------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        return None, None

    def _chunks(self, context: Any) -> Iterable[Sequence[Any]]:
        raise NotImplementedError

    def _idle_record(self) -> Any:
        return None

    def _restore_idle(self, record: Any) -> None:
        return None

    def _max_position(self) -> int | None:
        return None

    # -- iteration ---------------------------------------------------------

    def _start(self) -> tuple[_Cursor, Any]:
        resume, self._resume = self._resume, None
        if resume is None:
            epoch, position = self.epoch, 0
            context, record = self._open(epoch, None)
        else:
            epoch, position = resume.epoch, resume.position
            context, record = self._open(epoch, resume.record)
        self.epoch = epoch + 1 if self._auto_epoch else epoch
        cursor = _Cursor(epoch, record, position)
        self._cursor = cursor
        return cursor, context

    def _iterate(self) -> Iterator[Any]:
        cursor, context = self._start()
        for chunk in _drop(self._chunks(context), cursor.position):
            yield from cursor.feed(chunk)
        cursor.done = True

    # -- public ------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (its shuffle follows from ``seed`` and ``epoch``).

        A resume point loaded by :meth:`load_state_dict` for another epoch is
        dropped, with a warning.
        """
        epoch = _check_int("epoch", epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            warnings.warn(
                f"{type(self).__name__}.set_epoch({epoch}) drops the resume point loaded by "
                f"load_state_dict (epoch {self._resume.epoch}, position {self._resume.position}); "
                f"call set_epoch({self._resume.epoch}) to resume it",
                stacklevel=2,
            )
            self._resume = None
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler stands, as a small dict of JSON values.

        Load it with :meth:`load_state_dict` into a sampler built the same way;
        its next iteration then yields exactly the items this one had not yet
        yielded, and later iterations follow as if never interrupted.
        """
        return {"version": _STATE_VERSION, "kind": type(self).__name__, **self._settings(), **self._progress()}

    def _progress(self) -> dict[str, Any]:
        if self._resume is not None:
            resume = self._resume
            return {"epoch": resume.epoch, "position": resume.position, "in_iteration": True, "rng": resume.record}
        cursor = self._cursor
        if cursor is not None and not cursor.done:
            return {"epoch": cursor.epoch, "position": cursor.position, "in_iteration": True, "rng": cursor.record}
        return {"epoch": self.epoch, "position": 0, "in_iteration": False, "rng": self._idle_record()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``__iter__``.

        Raises ValueError, showing both sides, when the state was saved by a
        sampler of another kind or with other settings.
        """
        kind = type(self).__name__
        _check_state(kind, state, self._settings())
        epoch, position, in_iteration, record = _read_progress(kind, state)
        limit = self._max_position()
        if limit is not None and position > limit:
            what = "the saved position is past the end of an iteration."
            raise _state_error(kind, what, {"position": position}, {"len": limit})
        self._cursor = None
        self.epoch = epoch
        self._resume = _Resume(epoch, position, record) if in_iteration else None
        if not in_iteration:
            self._restore_idle(record)


# ---------------------------------------------------------------------------
# where random draws come from


class _Draws:
    """The random source for one iteration, and a JSON record to draw it again.

    * ``generator`` given (numpy or torch Generator, or an int seed): that
      generator, used in place; record = its state before the first draw.
    * ``generator=None``, policy ``"reseed"`` (torch's RandomSampler): a fresh
      generator seeded from the global one of the flavour; record = the seed.
    * ``generator=None``, policy ``"global"`` (torch's SubsetRandomSampler and
      WeightedRandomSampler): torch's default generator itself, record = its
      state, replayed on a private copy. numpy has no global ``Generator``, so
      the numpy flavour reseeds instead.
    """

    def __init__(self, flavor: str, policy: str):
        self.flavor = flavor
        self.policy = policy
        self._for: Any = None
        self._source: Any = None
        #: A seed drawn ahead for the next iteration (see pin).
        self._pinned: Any = None

    def own(self, generator: Any) -> Any:
        if self._source is None or self._for is not generator:
            self._source = source_for(generator, self.flavor)
            self._for = generator
        return self._source

    def kind(self, generator: Any) -> str:
        if generator is None:
            return "global"
        return "torch" if isinstance(self.own(generator), TorchSource) else "numpy"

    def _reseeds(self, generator: Any) -> bool:
        return generator is None and not (self.policy == "global" and self.flavor == "torch")

    def begin(self, generator: Any) -> tuple[Any, Any]:
        if generator is not None:
            source = self.own(generator)
            return source, {"state": source.get_state()}
        if not self._reseeds(generator):
            import torch

            source = TorchSource(torch.default_generator)
            return source, {"state": source.get_state()}
        record, self._pinned = self._pinned, None
        seed = draw_seed(self.flavor) if record is None else int(record["seed"])
        return source_for(seed, self.flavor), {"seed": seed}

    def pin(self, generator: Any) -> None:
        """Draw the next iteration's seed from the global generator now, so
        that a state saved between iterations holds it (no-op when the draws
        come from a generator, whose state is saved anyway)."""
        if self._reseeds(generator) and self._pinned is None:
            self._pinned = {"seed": draw_seed(self.flavor)}

    def replay(self, generator: Any, record: Mapping[str, Any]) -> Any:
        if generator is not None:
            source = self.own(generator)
            source.set_state(record["state"])
            return source
        if "seed" in record:
            return source_for(int(record["seed"]), self.flavor)
        source = TorchSource.from_seed(0)
        source.set_state(record["state"])
        return source

    def idle_record(self, generator: Any) -> Any:
        if generator is None:
            return self._pinned
        return {"state": self.own(generator).get_state()}

    def restore_idle(self, generator: Any, record: Any) -> None:
        if generator is None:
            self._pinned = record if self._reseeds(generator) and isinstance(record, Mapping) else None
        elif record is not None:
            self.own(generator).set_state(record["state"])


class _DrawsFromGenerator(_Resumable):
    """A resumable sampler whose draws come from ``self.generator`` (see :class:`_Draws`)."""

    _flavor = "numpy"
    _none_policy = "global"
    generator: Any

    def _draws(self) -> _Draws:
        # Made on first use: subclasses set self.generator in their own __init__.
        draws = getattr(self, "_draws_cache", None)
        if draws is None:
            draws = self._draws_cache = _Draws(self._flavor, self._none_policy)
        return draws

    def _generator_settings(self) -> dict[str, Any]:
        return {"flavor": self._flavor, "generator": self._draws().kind(self.generator)}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        if record is None:
            return self._draws().begin(self.generator)
        return self._draws().replay(self.generator, record), record

    def _idle_record(self) -> Any:
        return self._draws().idle_record(self.generator)

    def _restore_idle(self, record: Any) -> None:
        self._draws().restore_idle(self.generator, record)

    def pin_next_draw(self) -> None:
        """Draw what the next iteration draws from the global generator now
        (its seed), so that a state saved between epochs holds it."""
        if getattr(self, "seed", None) is None:
            self._draws().pin(self.generator)


# ---------------------------------------------------------------------------
# samplers


class Sampler(Generic[T_co]):
    """Base class of samplers: an iterable over dataset indices (or batches of them).

    Subclasses implement ``__iter__`` and, when the length is known,
    ``__len__`` (no default is given, so ``len()`` of a sampler without one is
    a TypeError, as in torch). To be resumable inside a :class:`BatchSampler`
    or a loader, also implement ``state_dict()`` and ``load_state_dict(state)``.

    Example::

        class LongestFirst(Sampler[int]):
            def __init__(self, lengths):
                self.lengths = lengths

            def __iter__(self):
                return iter(sorted(range(len(self.lengths)), key=self.lengths.__getitem__, reverse=True))

            def __len__(self):
                return len(self.lengths)
    """

    #: Which global generator draws when no generator is given ("torch" in conveyor.torch).
    _flavor = "numpy"

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class SequentialSampler(_Resumable, Sampler[int]):
    """Yields ``0, 1, ..., len(data_source) - 1``, in that order.

    Example::

        >>> list(SequentialSampler(range(4)))
        [0, 1, 2, 3]
    """

    data_source: Sized

    def __init__(self, data_source: Sized) -> None:
        if not hasattr(data_source, "__len__"):
            raise TypeError(f"SequentialSampler needs a data_source with __len__, got {type(data_source).__name__}")
        self.data_source = data_source
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {"dataset_length": len(self.data_source)}

    def _chunks(self, context: Any) -> Iterable[Sequence[int]]:
        return (range(len(self.data_source)),)

    def _max_position(self) -> int:
        return len(self.data_source)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return len(self.data_source)


class RandomSampler(_DrawsFromGenerator, Sampler[int]):
    """Yields the indices of ``data_source`` in random order.

    Without replacement each pass is a permutation; ``num_samples`` larger
    than the dataset chains several permutations (the last one cut short).
    With ``replacement=True``, ``num_samples`` indices are drawn independently.

    Randomness, as in torch: with ``generator=None`` each iteration seeds a
    fresh generator from the global one (``numpy.random``; torch's in
    ``conveyor.torch``); a ``numpy.random.Generator`` or ``torch.Generator``
    is used in place (a ``torch.Generator`` gives torch's exact order).

    ``seed=`` (conveyor): epoch ``e`` is shuffled from
    ``derive_seed(seed, e)``, independent of any global state; ``e`` is the
    value given to :meth:`set_epoch`, else 0, 1, 2, ... per iteration.
    ``seed`` and ``generator`` exclude each other.

    Resuming: with ``generator=None`` the interrupted iteration is replayed
    from its recorded seed, but later iterations draw from the global
    generator, whose state belongs to the caller (use ``seed=`` to be
    independent of it). A passed generator is set back to its recorded state
    by :meth:`load_state_dict` / the resumed iteration.

    Example::

        >>> sorted(RandomSampler(range(5), seed=0)) == [0, 1, 2, 3, 4]
        True
    """

    data_source: Sized
    replacement: bool
    _none_policy = "reseed"

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
        *,
        seed: int | None = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = _check_bool("replacement", replacement, TypeError)
        self._num_samples = num_samples
        self.generator = generator
        self.seed = seed
        self._check_arguments()
        self._init_progress()

    def _check_arguments(self) -> None:
        length = len(self.data_source)
        context = f" (len(data_source) is {length})" if self._num_samples is None else ""
        _check_positive_int("num_samples", self.num_samples, context)
        if self._num_samples is not None and length == 0:
            raise ValueError(f"RandomSampler cannot draw num_samples={self._num_samples} from an empty data_source")
        if self.seed is not None:
            if self.generator is not None:
                raise ValueError(
                    "RandomSampler takes seed= or generator=, not both: seed= derives each epoch's "
                    "order from (seed, epoch); generator= is drawn from in place"
                )
            _check_int("seed", self.seed)
        elif self.generator is not None:
            self._draws().own(self.generator)  # rejects what is not a generator, now

    @property
    def num_samples(self) -> int:
        """Indices per iteration: ``num_samples`` if given, else ``len(data_source)`` (read each time)."""
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def _settings(self) -> dict[str, Any]:
        common = {
            "dataset_length": len(self.data_source),
            "num_samples": int(self.num_samples),
            "replacement": self.replacement,
        }
        if self.seed is not None:
            return {**common, "flavor": self._flavor, "generator": "seed", "seed": int(self.seed)}
        return {**common, **self._generator_settings(), "seed": None}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        if self.seed is None:
            return super()._open(epoch, record)
        return source_for(derive_seed(self.seed, epoch), self._flavor), None

    def _idle_record(self) -> Any:
        return None if self.seed is not None else super()._idle_record()

    def _restore_idle(self, record: Any) -> None:
        if self.seed is None:
            super()._restore_idle(record)

    def _max_position(self) -> int:
        return int(self.num_samples)

    def _chunks(self, source: Any) -> Iterator[list[int]]:
        n, total = len(self.data_source), int(self.num_samples)
        if self.replacement:
            for _ in range(total // _REPLACEMENT_CHUNK_ITEMS):
                yield source.randint(n, _REPLACEMENT_CHUNK_ITEMS)
            yield source.randint(n, total % _REPLACEMENT_CHUNK_ITEMS)
        else:
            for _ in range(total // n):
                yield source.permutation(n)
            # Drawn even when empty: torch draws it, and the generator must stay in step.
            yield source.permutation(n)[: total % n]

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(_DrawsFromGenerator, Sampler[int]):
    """Yields the given ``indices`` in random order, without replacement.

    With ``generator=None`` the torch flavour draws from torch's global
    generator, as torch does (its saved state then carries that generator's
    state, about 7 kB); the numpy flavour seeds a fresh generator from
    ``numpy.random`` per iteration.

    Example::

        >>> sorted(SubsetRandomSampler([3, 5, 7]))
        [3, 5, 7]
    """

    indices: Sequence[int]

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        if not hasattr(indices, "__len__") or not hasattr(indices, "__getitem__"):
            raise TypeError(f"SubsetRandomSampler needs a sequence of indices, got {type(indices).__name__}")
        self.indices = indices
        self.generator = generator
        if generator is not None:
            self._draws().own(generator)
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {"num_indices": len(self.indices), **self._generator_settings()}

    def _max_position(self) -> int:
        return len(self.indices)

    def _chunks(self, source: Any) -> Iterator[list[int]]:
        yield source.permutation(len(self.indices))

    def __iter__(self) -> Iterator[int]:
        indices = self.indices
        for i in self._iterate():
            yield indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(_DrawsFromGenerator, Sampler[int]):
    """Yields ``num_samples`` indices of ``weights``, index ``i`` drawn with probability ∝ ``weights[i]``.

    ``replacement=False`` never repeats an index within an iteration.
    conveyor checks the weights at construction (finite, non-negative, not all
    zero, enough non-zero ones without replacement), where torch fails at the
    first iteration.

    Example::

        >>> sampler = WeightedRandomSampler([0.1, 0.9, 0.0], num_samples=4)
        >>> 2 in list(sampler)
        False
    """

    weights: np.ndarray
    num_samples: int
    replacement: bool

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Any = None,
    ) -> None:
        self.num_samples = _check_positive_int("num_samples", num_samples)
        self.replacement = _check_bool("replacement", replacement)
        self.weights = _check_weights(weights, self.num_samples, replacement)
        self.generator = generator
        if generator is not None:
            self._draws().own(generator)
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "num_weights": len(self.weights),
            "num_samples": self.num_samples,
            "replacement": self.replacement,
            **self._generator_settings(),
        }

    def _max_position(self) -> int:
        return self.num_samples

    def _chunks(self, source: Any) -> Iterator[list[int]]:
        yield source.multinomial(self.weights, self.num_samples, self.replacement)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return self.num_samples


def _check_weights(weights: Any, num_samples: int, replacement: bool) -> np.ndarray:
    array = np.asarray(weights, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(array.shape)}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("weights should be finite and non-negative; found inf, nan or a negative weight")
    nonzero = int(np.count_nonzero(array))
    if nonzero == 0:
        raise ValueError("weights should not all be zero: no index could ever be drawn")
    if not replacement and num_samples > nonzero:
        raise ValueError(
            f"cannot draw num_samples={num_samples} distinct indices without replacement from "
            f"{nonzero} non-zero weights; lower num_samples or pass replacement=True"
        )
    return array


class _BatchRun:
    """One BatchSampler iteration: what replays the inner sampler's draw,
    items pulled since, and a fingerprint of the iteration's first batch."""

    __slots__ = ("inner_start", "items", "first_batch")

    def __init__(self) -> None:
        #: Jumping (a conveyor inner sampler): its state after the first
        #: batch. Replaying (any other): what reproduces its iteration, taken
        #: before the first draw (see replay_point).
        self.inner_start: Any = None
        self.items = 0
        self.first_batch: str | None = None


def batch_fingerprint(batch: Any) -> str:
    """A short fingerprint of a batch of indices (or of one index): the
    CRC-32 of their text, to check that a replayed iteration is the one
    that was saved."""
    text = ",".join(map(str, batch)) if isinstance(batch, (list, tuple)) else str(batch)
    return f"{zlib.crc32(text.encode()):08x}"


def replay(batches: Iterator[Any], skip: int, fingerprint: str | None, what: str) -> Iterator[Any]:
    """``batches`` without their first ``skip``, which are drawn to put the
    sampler where it was. The first batch must be the saved run's (its
    ``fingerprint``): otherwise the sampler does not give the same order on
    a new iteration, and resuming would yield other samples; that raises."""
    for number, batch in enumerate(batches):
        if number == 0 and fingerprint is not None and batch_fingerprint(batch) != fingerprint:
            raise RuntimeError(
                f"cannot resume exactly: {what} gave another first batch than in the run that saved the "
                f"state, so it does not repeat its order on a new iteration and the rest of the epoch would "
                f"hold other samples. Give it state_dict()/load_state_dict(), or a torch.Generator or "
                f"numpy Generator as its `generator` attribute, or use conveyor's samplers (which resume "
                f"exactly); or start the epoch over (set_epoch) instead of loading a mid-epoch state."
            )
        if number >= skip:
            yield batch


def replay_point(sampler: Any, flavor: str) -> Any:
    """What makes ``sampler`` draw its next iteration again, as plain
    values: its ``state_dict()``; else the state of its ``generator``
    attribute (torch's samplers draw from it); else, for a batch sampler,
    the replay point of its ``sampler``; else None."""
    if callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None)):
        return {"state": sampler.state_dict()}
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, np.random.Generator) or is_torch_generator(generator):
        return {"generator": source_for(generator, flavor).get_state()}
    inner = getattr(sampler, "sampler", None)
    if inner is not None and inner is not sampler:
        point = replay_point(inner, flavor)
        return None if point is None else {"inner": point}
    return None


def restore_replay_point(sampler: Any, point: Any, flavor: str) -> None:
    """Put ``sampler`` back where :func:`replay_point` found it."""
    if not isinstance(point, Mapping):
        return
    if "state" in point:
        sampler.load_state_dict(point["state"])
    elif "generator" in point:
        source_for(sampler.generator, flavor).set_state(point["generator"])
    elif "inner" in point:
        restore_replay_point(sampler.sampler, point["inner"], flavor)


def _has_position(state: Any) -> bool:
    """Whether ``state`` is a conveyor sampler state (its position can be set)."""
    return isinstance(state, Mapping) and "position" in state and "in_iteration" in state


class BatchSampler(_Resumable, Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    ``drop_last=True`` drops a final batch shorter than ``batch_size``.
    ``sampler`` may be any iterable of indices.

    Resuming: when ``sampler`` has ``state_dict``/``load_state_dict`` (every
    conveyor sampler does), the state wraps the inner sampler's state and the
    resumed iteration continues it directly. Otherwise only the batch count is
    saved, and the resumed iteration runs a fresh iteration of ``sampler`` and
    skips that many batches by iterating, which is exact only when ``sampler``
    yields the same order each time.

    Example::

        >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False))
        [[0, 1, 2], [3, 4, 5], [6]]
        >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=True))
        [[0, 1, 2], [3, 4, 5]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.batch_size = _check_positive_int("batch_size", batch_size)
        self.drop_last = _check_bool("drop_last", drop_last)
        if not hasattr(sampler, "__iter__") and not hasattr(sampler, "__getitem__"):
            raise TypeError(f"BatchSampler needs an iterable sampler of indices, got {type(sampler).__name__}")
        self.sampler = sampler
        self._init_progress()

    def _inner_resumable(self) -> bool:
        return callable(getattr(self.sampler, "state_dict", None)) and callable(
            getattr(self.sampler, "load_state_dict", None)
        )

    def _inner_jumps(self) -> bool:
        """Whether the inner sampler resumes at an item itself (a conveyor
        sampler); any other is replayed from the iteration's start."""
        return self._inner_resumable() and _has_position(self.sampler.state_dict())  # type: ignore[union-attr]

    def _settings(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "sampler_kind": type(self.sampler).__name__,
        }

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        run = _BatchRun()  # the context and the cursor's record: _progress reads it
        return run, run

    def _progress(self) -> dict[str, Any]:
        progress = super()._progress()
        record = progress["rng"]
        if self._resume is not None:
            saved = self._resume.record or {}
            return {**progress, "rng": None, "sampler": saved.get("sampler"), "replay": saved.get("replay"),
                    "first_batch": saved.get("first_batch")}
        if isinstance(record, _BatchRun) and not self._inner_jumps():
            # Replayed: what reproduces the iteration, and its first batch to check it by.
            return {**progress, "rng": None, "sampler": None, "replay": record.inner_start,
                    "first_batch": record.first_batch}
        return {**progress, "rng": None, "sampler": self._inner_state(record), "replay": None, "first_batch": None}

    def _inner_state(self, record: Any) -> Any:
        """The inner sampler's state that goes with this sampler's position."""
        if not self._inner_resumable():
            return None
        if isinstance(record, _BatchRun) and _has_position(record.inner_start):
            # From the capture, not the inner sampler now: it may have finished
            # (last, short batch) and no longer hold the draw to replay.
            return {**record.inner_start, "position": record.items, "in_iteration": True}
        return self.sampler.state_dict()  # type: ignore[union-attr]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; the inner sampler's state is loaded too.

        A conveyor inner sampler resumes at its item. Any other is put back
        to the start of the saved iteration (its own state, or its
        generator's) and the batches before ``position`` are drawn again and
        dropped; the first of them must match the saved run's, or the next
        iteration raises RuntimeError instead of yielding other samples.

        ``position`` (batches) may have been changed since saving to any batch
        of the same iteration: lowered (a loader that prefetched rewinding to
        what it delivered) or raised (a loader that kept the state of the
        iteration's first batch).
        """
        super().load_state_dict(state)
        inner, point = state.get("sampler"), state.get("replay")
        if self._resume is not None:
            self._resume.record = {"sampler": inner, "replay": point, "first_batch": state.get("first_batch")}
        if point is not None:
            restore_replay_point(self.sampler, point, self._flavor)
            return
        if inner is None or not self._inner_resumable():
            return
        if state["in_iteration"] and _has_position(inner) and inner["in_iteration"]:
            inner = {**inner, "position": self._items_behind(state["position"], inner["position"])}
            self._resume.record = {**self._resume.record, "sampler": inner}
        self.sampler.load_state_dict(inner)  # type: ignore[union-attr]

    def _items_behind(self, batches: int, saved_items: int) -> int:
        """Inner items handed out for the first ``batches`` batches: all full
        but the last of the iteration, which the inner sampler's end cuts."""
        items = batches * self.batch_size
        try:
            return min(items, len(self.sampler))  # type: ignore[arg-type]
        except TypeError:  # no len(): only lowering is possible
            return min(items, saved_items)

    def pin_next_draw(self) -> None:
        """Forwarded to the inner sampler (see RandomSampler.pin_next_draw)."""
        pin = getattr(self.sampler, "pin_next_draw", None)
        if callable(pin):
            pin()

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the inner sampler when it has ``set_epoch``."""
        self.epoch = _check_int("epoch", epoch)
        if not callable(getattr(self.sampler, "set_epoch", None)):
            return
        self.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        if self._resume is not None and self._inner_resumable():
            inner = self.sampler.state_dict()  # type: ignore[union-attr]
            if _has_position(inner) and not inner["in_iteration"]:
                self._resume = None  # the inner sampler dropped its resume point (and warned)

    def __iter__(self) -> Iterator[list[int]]:
        resume = self._resume
        saved = resume.record if resume is not None and isinstance(resume.record, Mapping) else {}
        cursor, run = self._start()
        jumps = self._inner_jumps()
        if not jumps:
            run.inner_start = replay_point(self.sampler, self._flavor)
        indices = iter(self.sampler)
        size, drop_last = self.batch_size, self.drop_last
        batches: Iterator[list[int]] = iter(lambda: list(itertools.islice(indices, size)), [])
        if not jumps and resume is not None:
            if saved.get("replay") is not None:
                run.inner_start = saved["replay"]  # the replayed iteration's start, for a later save
            run.first_batch = saved.get("first_batch")
            batches = replay(batches, cursor.position, run.first_batch, f"the sampler {type(self.sampler).__name__}")
        for batch in batches:
            if drop_last and len(batch) < size:
                break
            if run.first_batch is None:
                run.first_batch = batch_fingerprint(batch)
            if jumps and run.inner_start is None:
                run.inner_start = self.sampler.state_dict()  # type: ignore[union-attr]
                run.items = run.inner_start.get("position", 0) if _has_position(run.inner_start) else 0
            else:
                run.items += len(batch)
            cursor.advance()
            yield batch
        cursor.done = True

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# distributed


def _per_replica(total: int, num_replicas: int, drop_last: bool) -> int:
    """Items each replica gets: all of them, padded, or (drop_last) the even part."""
    if drop_last and total % num_replicas != 0:
        return math.ceil((total - num_replicas) / num_replicas)
    return math.ceil(total / num_replicas)


def _shard(items: list[Any], num_replicas: int, rank: int, drop_last: bool) -> list[Any]:
    """``rank``'s share of ``items``: padded by repeating from the start, or cut, to divide evenly."""
    total = _per_replica(len(items), num_replicas, drop_last) * num_replicas
    padding = total - len(items)
    if padding > 0:
        items = items + (items * math.ceil(padding / len(items)))[:padding]
    else:
        items = items[:total]
    return items[rank:total:num_replicas]


def _world_from_torch(name: str) -> int:
    """``num_replicas`` or ``rank`` from torch.distributed, only when the user's program initialised it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"DistributedSampler: {name} was not given and torch.distributed is not initialized; "
            f"pass num_replicas=<world size> and rank=<this process's rank>, "
            f"or call torch.distributed.init_process_group() first"
        )
    return dist.get_world_size() if name == "num_replicas" else dist.get_rank()


def _check_rank(num_replicas: Any, rank: Any) -> tuple[int, int]:
    num_replicas = _check_positive_int("num_replicas", num_replicas)
    if not _is_int(rank) or rank >= num_replicas or rank < 0:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
    return num_replicas, int(rank)


class DistributedSampler(_Resumable, Sampler[int]):
    """This replica's share of the dataset indices, for data-parallel training.

    As in torch: the indices (shuffled from ``seed + epoch`` when ``shuffle``)
    are padded by repeating from the start so every replica gets
    ``ceil(n / num_replicas)`` of them, or, with ``drop_last``, cut so every
    replica gets ``n // num_replicas``; replica ``rank`` takes every
    ``num_replicas``-th index from position ``rank``. Call :meth:`set_epoch`
    each epoch, or every epoch repeats the same order.

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
        self.num_samples = _per_replica(len(dataset), self.num_replicas, self.drop_last)
        self.total_size = self.num_samples * self.num_replicas
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "dataset_length": len(self.dataset),
            "num_replicas": self.num_replicas,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "flavor": self._flavor,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler stands (JSON values); ``rank`` is recorded but not checked on load."""
        return {**super().state_dict(), "rank": self.rank}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        return epoch, None

    def _max_position(self) -> int:
        return self.num_samples

    def _epoch_order(self, epoch: int) -> list[int]:
        n = len(self.dataset)
        if _per_replica(n, self.num_replicas, self.drop_last) != self.num_samples:
            raise RuntimeError(
                f"DistributedSampler: the dataset now has {n} samples, which changes the {self.num_samples} "
                f"per replica computed when the sampler was built; build a new DistributedSampler"
            )
        if not self.shuffle:
            return list(range(n))
        if self._flavor == "torch":
            return TorchSource.from_seed(self.seed + epoch).permutation(n)
        return source_for(derive_seed(self.seed, epoch), self._flavor).permutation(n)

    def _chunks(self, epoch: int) -> Iterator[list[int]]:
        yield _shard(self._epoch_order(epoch), self.num_replicas, self.rank, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return self.num_samples


# ---------------------------------------------------------------------------
# token budgets


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
        self._lengths_crc32 = zlib.crc32(self.lengths.tobytes())
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
