"""random_split: a dataset cut into non-overlapping Subsets of given lengths
or fractions, in an order drawn from a generator (as torch.utils.data)."""

from __future__ import annotations

import itertools
import math
import operator
import warnings
from collections.abc import Sequence
from typing import Any, SupportsIndex

from conveyor.rng import GeneratorLike, source_for

from ._views import Subset

__all__ = ["random_split"]


def _lengths_from_fractions(fractions: Sequence[float], total: int) -> list[int]:
    """floor(total * fraction) each, then the remainder one by one, round robin."""
    lengths = []
    for i, fraction in enumerate(fractions):
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Fraction at index {i} is not between 0 and 1 (got {fraction})")
        lengths.append(math.floor(total * fraction))
    for i in range(total - sum(lengths)):
        lengths[i % len(lengths)] += 1
    for i, length in enumerate(lengths):
        if length == 0:
            warnings.warn(
                f"Length of split at index {i} is 0. This might result in an empty dataset.",
                stacklevel=4,  # the caller of random_split
            )
    return lengths


def _as_index(length: int | float) -> int:
    """``operator.index(length)``: the TypeError for a float, said to the checker."""
    if not isinstance(length, SupportsIndex):
        raise TypeError(f"{length!r} is not an int")
    return operator.index(length)


def _as_split_lengths(lengths: Sequence[int | float], total: int) -> list[int]:
    as_given: Sequence[int | float] = list(lengths)
    # torch also demands sum <= 1, so fractions whose float sum rounds just
    # above 1 (twenty 0.05s) fall through to a confusing length-sum error
    # (pytorch/pytorch#128116). Dropping it only accepts inputs torch rejects.
    if math.isclose(sum(as_given), 1):
        as_given = _lengths_from_fractions(as_given, total)
    if sum(as_given) != total:
        raise ValueError(
            f"Sum of input lengths does not equal the length of the input dataset! "
            f"Lengths {as_given} sum to {sum(as_given)}, the dataset has {total} samples; "
            f"pass lengths that sum to {total} or fractions that sum to 1"
        )
    try:
        ints = [_as_index(length) for length in as_given]
    except TypeError:
        raise TypeError(f"random_split lengths must be ints, or fractions that sum to 1; got {as_given}") from None
    if any(length < 0 for length in ints):
        raise ValueError(f"random_split lengths must not be negative; got {ints}")
    return ints


def random_split(dataset: Any, lengths: Sequence[int | float], generator: GeneratorLike = None) -> list[Subset]:
    """Split ``dataset`` at random into non-overlapping :class:`Subset` s.

    ``lengths`` are sample counts summing to ``len(dataset)``, or fractions
    summing to 1: each split then gets ``floor(fraction * len(dataset))`` and
    the leftover samples go one each to the splits in order, round robin.

    The order comes from ``generator`` (a ``numpy.random.Generator``, a
    ``torch.Generator``, an int seed, or ``None`` for numpy's global state).
    With a ``torch.Generator`` the splits equal ``torch.utils.data.random_split``'s
    for the same generator state::

        >>> a, b = random_split(range(10), [0.3, 0.7], generator=0)
        >>> len(a), len(b), sorted(list(a) + list(b)) == list(range(10))
        (3, 7, True)
    """
    split_lengths = _as_split_lengths(lengths, len(dataset))
    order = source_for(generator, "numpy").permutation(sum(split_lengths))
    ends = itertools.accumulate(split_lengths)
    return [Subset(dataset, order[end - length : end]) for end, length in zip(ends, split_lengths)]
