"""The index samplers: Sampler (the base class), SequentialSampler, RandomSampler,
SubsetRandomSampler and WeightedRandomSampler.

They carry torch.utils.data's names, arguments, lengths and error messages,
and are resumable at any item (:mod:`.resumable`); the random ones draw as
:mod:`.draws` says.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Sized
from typing import Any, Generic, Optional, TypeVar

import numpy as np

from conveyor.rng import GeneratorLike, derive_seed, is_torch_generator, source_for

from .arguments import _check_bool, _check_int, _check_positive_int, checked_length
from .draws import _DrawsFromGenerator
from .fingerprint import Crc32Of
from .order import check_saved_order, computed_blocks, order_setting, resolve_order, uniform_blocks
from .resumable import _Resumable, in_blocks

T_co = TypeVar("T_co", covariant=True)

# torch draws sampling-with-replacement indices 32 at a time; drawing the same
# chunks keeps a shared torch.Generator in step with torch.utils.data.
_REPLACEMENT_CHUNK_ITEMS = 32


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

    ``order=`` (conveyor): ``"stored"`` draws each permutation as an array,
    as torch does; ``"computed"`` maps each position through a keyed
    permutation (``KeyedPermutation(n, key)``, :mod:`.order`), holding nothing
    of the dataset's size: its key is ``derive_seed(seed, e)`` with ``seed=``,
    else one seed drawn from the generator (or a fresh one from the global
    generator) where the stored order draws its permutation; ``num_samples``
    past ``n`` chains permutations keyed ``derive_seed(key, j)``, and
    ``replacement=True`` draws position ``p``'s index from a hash of
    (key, p). A resume then starts at its position at once, however far into
    the epoch. ``"auto"`` (default): computed for more than
    ``order.COMPUTED_ABOVE`` (2**24) items, unless a ``torch.Generator``, or
    torch's global generator in ``conveyor.torch``, drives the order (torch's
    exact order is then kept); else stored. ``sampler.order`` says which.

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
    #: "stored" or "computed" (set at construction); a sampler pickled before order= existed has the stored one.
    order = "stored"

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: GeneratorLike = None,
        *,
        seed: int | None = None,
        order: str = "auto",
    ) -> None:
        self.data_source = data_source
        self.replacement = _check_bool("replacement", replacement, TypeError)
        self._num_samples = num_samples
        self.generator = generator
        self.seed = seed
        self._check_arguments()
        torch_exact = is_torch_generator(generator) or (self._flavor == "torch" and seed is None and generator is None)
        #: "stored" or "computed" (``order="auto"`` resolved at construction).
        self.order = resolve_order(type(self).__name__, order, len(data_source), torch_exact)
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
        common: dict[str, Any] = {
            "dataset_length": len(self.data_source),
            "num_samples": int(self.num_samples),
            "replacement": self.replacement,
            **order_setting(self.order),
        }
        if self.seed is not None:
            return {**common, "flavor": self._flavor, "generator": "seed", "seed": int(self.seed)}
        return {**common, **self._generator_settings(), "seed": None}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        """The epoch's random source (stored order) or its key (computed),
        and the record that draws it again."""
        if self.order == "computed" and self.seed is not None:
            return derive_seed(self.seed, epoch), None
        if self.seed is None:
            source, record = super()._open(epoch, record)
        else:
            source, record = source_for(derive_seed(self.seed, epoch), self._flavor), None
        return (source.draw_seed(), record) if self.order == "computed" else (source, record)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (see ``_Resumable``); a state saved with the
        other ``order`` is refused, naming both."""
        check_saved_order(type(self).__name__, state, self.order)
        super().load_state_dict(state)

    def _idle_record(self) -> Any:
        return None if self.seed is not None else super()._idle_record()

    def _restore_idle(self, record: Any) -> None:
        if self.seed is None:
            super()._restore_idle(record)

    def _record_problem(self, record: Any, in_iteration: bool) -> Optional[str]:
        return None if self.seed is not None else super()._record_problem(record, in_iteration)

    def _max_position(self) -> int:
        return int(self.num_samples)

    def _chunks_from(self, context: Any, position: int) -> Iterable[Sequence[int]]:
        if self.order == "computed":
            blocks = uniform_blocks if self.replacement else computed_blocks
            return blocks(len(self.data_source), context, int(self.num_samples), position)
        if self.replacement:
            return super()._chunks_from(context, position)  # (each chunk drawn again, and dropped)
        return self._stored_from(context, position)

    def _stored_from(self, source: Any, position: int) -> Iterator[list[int]]:
        """The stored permutations' indices from ``position`` on. Every
        permutation is drawn (the generator stays in step with torch's draws);
        only the indices from the position on become lists."""
        n, total = len(self.data_source), int(self.num_samples)
        skip = position
        for _ in range(total // n):
            permutation = source.permutation_array(n)
            yield from in_blocks(permutation[skip:])
            skip = max(0, skip - n)
        # Drawn even when empty: torch draws it, and the generator must stay in step.
        tail = source.permutation_array(n)[: total % n]
        yield from in_blocks(tail[skip:]) if len(tail) > skip else iter([[]])

    def _chunks(self, source: Any) -> Iterator[list[int]]:
        """Draws with replacement, as torch draws them (32 at a time)."""
        n, total = len(self.data_source), int(self.num_samples)
        for _ in range(total // _REPLACEMENT_CHUNK_ITEMS):
            yield source.randint(n, _REPLACEMENT_CHUNK_ITEMS)
        yield source.randint(n, total % _REPLACEMENT_CHUNK_ITEMS)

    def __iter__(self) -> Iterator[int]:
        return self._iterate()

    def __len__(self) -> int:
        return checked_length(type(self).__name__, self.num_samples)


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

    def __init__(self, indices: Sequence[int], generator: GeneratorLike = None) -> None:
        if not hasattr(indices, "__len__") or not hasattr(indices, "__getitem__"):
            raise TypeError(f"SubsetRandomSampler needs a sequence of indices, got {type(indices).__name__}")
        self.indices = indices
        self.generator = generator
        if generator is not None:
            self._draws().own(generator)
        self._indices_crc32 = Crc32Of()
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        # The indices' values shape the order (the count alone does not): their fingerprint.
        return {
            "num_indices": len(self.indices),
            "indices_crc32": self._indices_crc32(self.indices),
            **self._generator_settings(),
        }

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
        self, weights: Sequence[float], num_samples: int, replacement: bool = True, generator: GeneratorLike = None
    ) -> None:
        self.num_samples = _check_positive_int("num_samples", num_samples)
        self.replacement = _check_bool("replacement", replacement)
        self.weights = _check_weights(weights, self.num_samples, replacement)
        self.generator = generator
        if generator is not None:
            self._draws().own(generator)
        self._weights_crc32 = Crc32Of()
        self._init_progress()

    def _settings(self) -> dict[str, Any]:
        return {
            "num_weights": len(self.weights),
            "weights_crc32": self._weights_crc32(self.weights),
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


class _InfiniteConstantSampler:
    """For iterable datasets: an endless stream of ``None`` (the dataset
    decides); torch's name, which saved states show."""

    def __iter__(self) -> Iterator[None]:
        while True:
            yield None
