"""Weights, checked, and the exact shares a mix realises from them.

A mix serves its sources in a period of ``D`` positions in which source
``s`` has exactly ``m_s`` of them (``sum(m) == D``): its share is the exact
fraction ``m_s / D``. When the weights are ratios of small integers
(``{"web": 7, "code": 2, "books": 1}``, ``0.7 / 0.2 / 0.1``) that fraction
is the weight itself, normalised, and ``D`` is the least common
denominator; otherwise the shares are the weights rounded to multiples of
``1 / MAX_PERIOD`` (largest remainder; a positive weight keeps at least
one position per period), each within ``k * 2**-20`` of its normalised
weight for ``k`` sources (1 unit of rounding, and the units that very small
weights keep are taken from the largest shares).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = ["MAX_PERIOD", "Shares", "check_weights", "shares_of"]

#: The longest period (positions) a mix's shares are realised over: the
#: resolution of shares that are not simple fractions (2**-20), against a
#: table of 6 bytes per position built once per weights, as far as read.
MAX_PERIOD = 1 << 20
#: The largest denominator a weight may have to count as a simple fraction.
_SIMPLE_DENOMINATOR = 10**6


@dataclass(frozen=True)
class Shares:
    """Per source, ``units[s]`` positions of every ``period`` (an int each)."""

    units: tuple[int, ...]
    period: int

    def share(self, source: int) -> float:
        """Source ``source``'s share of the positions, in [0, 1]."""
        return self.units[source] / self.period


def check_weights(weights: Any, names: tuple[str, ...], argument: str = "weights") -> tuple[float, ...]:
    """``weights`` (a mapping name -> number) as floats in the order of
    ``names``, or a ValueError/TypeError naming what is wrong and the fix."""
    if not isinstance(weights, Mapping):
        raise TypeError(
            f"Mix: {argument} must be a mapping from source name to weight (a number), got "
            f"{type(weights).__name__}; e.g. weights={{{', '.join(f'{n!r}: 1.0' for n in names[:3])}}}"
        )
    extra = [key for key in weights if key not in names]
    missing = [name for name in names if name not in weights]
    if extra or missing:
        parts = []
        if extra:
            parts.append(f"weights for sources the mix does not have: {extra}")
        if missing:
            parts.append(f"no weight for the sources {missing}")
        raise ValueError(
            f"Mix: {argument} has {' and '.join(parts)}; the mix's sources are {list(names)}. Give one weight "
            f"per source (0 leaves a source out)"
        )
    values = []
    for name in names:
        value = weights[name]
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"Mix: {argument}[{name!r}] must be a number, got {type(value).__name__} {value!r}")
        try:
            value = float(value)
        except OverflowError:
            raise ValueError(
                f"Mix: {argument}[{name!r}] is an int too large for a float; weights must be finite numbers >= 0 "
                f"(only their ratios count: divide them all by one number)"
            ) from None
        if math.isnan(value) or math.isinf(value):
            raise ValueError(f"Mix: {argument}[{name!r}] is {value}; weights must be finite numbers >= 0")
        if value < 0:
            raise ValueError(f"Mix: {argument}[{name!r}] is {value}; weights must be >= 0 (0 leaves a source out)")
        values.append(value)
    if not any(values):
        raise ValueError(f"Mix: {argument} are all zero; give at least one source a positive weight")
    return tuple(values)


def _as_fraction(value: float) -> Fraction | None:
    """``value`` as a simple fraction, or None when it is none."""
    fraction = Fraction(value).limit_denominator(_SIMPLE_DENOMINATOR)
    return fraction if abs(float(fraction) - value) <= 1e-12 * value else None


def shares_of(weights: tuple[float, ...]) -> Shares:
    """The exact shares of ``weights`` (checked by :func:`check_weights`)."""
    maybe = [_as_fraction(w) for w in weights]
    fractions = [f for f in maybe if f is not None]
    if len(fractions) == len(maybe):
        total = sum(fractions, Fraction(0))
        normalised = [f / total for f in fractions]
        period = math.lcm(*(f.denominator for f in normalised))
        if period <= MAX_PERIOD:
            return Shares(tuple(int(f * period) for f in normalised), period)
    return _rounded(weights, MAX_PERIOD)


def _rounded(weights: tuple[float, ...], period: int) -> Shares:
    """Largest remainder to ``period`` units, a positive weight keeping one."""
    try:
        total, scaled = math.fsum(weights), weights
    except OverflowError:  # (weights near the largest float sum past it: scaled by the largest first)
        scaled = tuple(w / max(weights) for w in weights)
        total = math.fsum(scaled)
    exact = [w / total * period for w in scaled]
    units = [max(1, math.floor(x)) if w > 0 else 0 for w, x in zip(weights, exact)]
    # Too many (a small weight kept one): take from the largest; too few: give to the largest remainders.
    by_remainder = sorted(
        range(len(weights)), key=lambda s: (exact[s] - math.floor(exact[s]), weights[s]), reverse=True
    )
    short = period - sum(units)
    while short > 0:
        for s in by_remainder:
            if short == 0:
                break
            if weights[s] > 0:
                units[s] += 1
                short -= 1
    while short < 0:
        s = max(range(len(units)), key=lambda i: units[i])
        units[s] -= 1
        short += 1
    return Shares(tuple(units), period)
