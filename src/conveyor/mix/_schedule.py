"""The weights of a mix over its positions: constant, or constant on
blocks (steps given as a list, or a function of the position read once per
block of ``schedule_every`` positions).

    weights={"web": 3, "code": 1}                      one block, [0, end)
    weights=[(0, {...}), (10_000, {...})]              a block from each step's position
    weights=lambda p: {...}, schedule_every=1000       block b = [1000 b, 1000 (b + 1)), weights(1000 b)

Why blocks: a position's source then depends only on its block's weights
and on each source's count at the block's start, and those counts are
computed once per block, lazily, and kept (a few ints per source per
block), so any position is reached without replaying the positions before
it, and the schedule holds no state.
"""

from __future__ import annotations

import bisect
import numbers
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from ._shares import Shares, check_weights, shares_of

__all__ = ["Blocks", "blocks_of"]

WeightsLike = Any  # a mapping, a list of (position, mapping), or a callable position -> mapping


class Blocks:
    """Block ``b`` covers positions ``[start(b), start(b + 1))`` (the last
    block of a list, or a constant, has no end) with ``shares(b)``."""

    def __init__(
        self,
        names: tuple[str, ...],
        starts: list[int],
        weights: list[tuple[float, ...]],
        function: Optional[Callable[[int], Any]] = None,
        every: Optional[int] = None,
    ) -> None:
        self.names = names
        self._starts = starts
        self._weights = weights
        self._function = function
        self.every = every
        self._shares: dict[tuple[float, ...], Shares] = {}
        self._runs: list[int] = []
        # (thread workers share the mix: the lazy lists grow under it; reads of what is there take none)
        self._lock = threading.RLock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._lock = threading.RLock()

    @property
    def kind(self) -> str:
        """ "constant", "steps" or "function"."""
        if self._function is not None:
            return "function"
        return "constant" if len(self._starts) == 1 else "steps"

    @property
    def finite(self) -> bool:
        """Whether the schedule has finitely many blocks (its last has no end)."""
        return self._function is None

    def count(self) -> Optional[int]:
        """How many blocks (None: a function's, without end)."""
        return len(self._starts) if self._function is None else None

    def start(self, block: int) -> int:
        """The first position of ``block``."""
        return block * self.every if self.every is not None else self._starts[block]

    def end(self, block: int) -> Optional[int]:
        """The position after ``block`` (None: it has no end)."""
        if self.every is not None:
            return (block + 1) * self.every
        return self._starts[block + 1] if block + 1 < len(self._starts) else None

    def block_at(self, position: int) -> int:
        """The block holding ``position``."""
        if self.every is not None:
            return position // self.every
        return bisect.bisect_right(self._starts, position) - 1

    def blocks_at(self, positions: np.ndarray) -> np.ndarray:
        """:meth:`block_at` of each of ``positions`` (int64)."""
        if self.every is not None:
            return positions // self.every
        return np.searchsorted(np.asarray(self._starts, dtype=np.int64), positions, side="right") - 1

    def weights(self, block: int) -> tuple[float, ...]:
        """``block``'s weights, checked (a function's read once, at the block's start)."""
        if self._function is None or block < len(self._weights):
            return self._weights[block]
        with self._lock:
            while len(self._weights) <= block:
                b = len(self._weights)
                position = b * self.every  # type: ignore[operator]
                self._weights.append(check_weights(self._function(position), self.names, f"weights({position})"))
        return self._weights[block]

    def shares(self, block: int) -> Shares:
        """``block``'s exact shares."""
        weights = self.weights(block)
        shares = self._shares.get(weights)
        if shares is None:
            shares = self._shares[weights] = shares_of(weights)
        return shares

    def run_of(self, block: int) -> int:
        """The first block of the run of blocks with ``block``'s weights: a
        period runs on across blocks of equal weights, so a function
        schedule gives the order its steps given as a list would."""
        if block >= len(self._runs):
            with self._lock:
                while len(self._runs) <= block:
                    b = len(self._runs)
                    same = b > 0 and self.weights(b) == self.weights(b - 1)
                    self._runs.append(self._runs[b - 1] if same else b)
        return self._runs[block]

    def fingerprint(self) -> list[Any]:
        """What a saved state records of the schedule: each step (the first
        block's weights and the block length, for a function)."""
        if self._function is None:
            return [[start, list(w)] for start, w in zip(self._starts, self._weights)]
        return [["every", self.every], [0, list(self.weights(0))]]


def blocks_of(weights: WeightsLike, names: tuple[str, ...], lengths: tuple[int, ...], every: Any) -> Blocks:
    """The ``Blocks`` of ``Mix(weights=, schedule_every=)``, every mistake a clear error."""
    if every is not None and not callable(weights):
        raise ValueError(
            "Mix: schedule_every= applies to weights given as a function of the position; with a mapping or "
            "a list of (position, weights) steps leave it out"
        )
    if weights is None:
        return Blocks(names, [0], [tuple(float(n) for n in lengths)])
    if isinstance(weights, Mapping):
        return Blocks(names, [0], [check_weights(weights, names)])
    if callable(weights):
        if every is None:
            raise ValueError(
                "Mix: weights given as a function of the position need schedule_every=N: the weights are read "
                "once per block of N positions (at its first position) and held constant in it"
            )
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or not 1 <= int(every) <= sys.maxsize:
            raise ValueError(
                f"Mix: schedule_every must be an int in [1, 2**63 - 1] (positions per block; a mix has at most "
                f"2**63 - 1 positions), got {every!r}"
            )
        blocks = Blocks(names, [], [], function=weights, every=int(every))
        blocks.weights(0)  # (checked now: a bad function fails at construction)
        return blocks
    if isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
        return _steps(weights, names)
    raise TypeError(
        f"Mix: weights must be a mapping name -> weight, a list of (position, mapping) steps, or a function of "
        f"the position returning a mapping (with schedule_every=), got {type(weights).__name__}"
    )


def _steps(steps: Sequence[Any], names: tuple[str, ...]) -> Blocks:
    starts: list[int] = []
    weights: list[tuple[float, ...]] = []
    for i, step in enumerate(steps):
        if not (isinstance(step, Sequence) and len(step) == 2):
            raise TypeError(f"Mix: weights[{i}] must be a (position, weights) pair, got {step!r}")
        position, mapping = step
        integral = not isinstance(position, bool) and isinstance(position, numbers.Integral)
        if not integral or not 0 <= int(position) <= sys.maxsize:
            raise ValueError(
                f"Mix: weights[{i}]'s position must be an int in [0, 2**63 - 1] (a mix has at most 2**63 - 1 "
                f"positions), got {position!r}"
            )
        if starts and position <= starts[-1]:
            raise ValueError(
                f"Mix: the steps' positions must increase: weights[{i}] starts at {position}, after {starts[-1]}"
            )
        if not starts and position != 0:
            raise ValueError(f"Mix: the first step must start at position 0 (weights[0] starts at {position})")
        starts.append(int(position))
        weights.append(check_weights(mapping, names, f"weights[{i}]"))
    if not starts:
        raise ValueError("Mix: weights is an empty list of steps; give at least [(0, {...})]")
    return Blocks(names, starts, weights)
