"""How a shuffling sampler holds its epoch's order: stored (an array drawn
whole) or computed (a keyed permutation, per position).

::

    order= ("auto" | "stored" | "computed") ──resolve_order──▶ "stored": the epoch's permutation drawn as an array
                                                              "computed": KeyedPermutation(n, key), per position
    key (seed, epoch) ──▶ chain_key(key, j): the j-th permutation of an iteration longer than n

* ``"stored"`` is the order torch's samplers give (``randperm`` of ``n``):
  ``8 n`` bytes held for the epoch, its draw at the start of the epoch.
* ``"computed"``: nothing of size ``n`` is held (but a table of at most
  ``permutation.TABLE_UP_TO`` items, 32 KiB), any position is reached in
  O(1) (a resume at 90% of an epoch costs what one at its start does), and a
  state holds only the key's record.
* ``"auto"`` (the default): computed above :data:`COMPUTED_ABOVE` items,
  where torch's exact order is not at stake, else stored.

The state of a sampler with a computed order records ``order: "computed"``;
one with a stored order records nothing (so states saved before ``order=``
existed load as before), and a state of the other order is refused
(:func:`check_saved_order`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from conveyor.rng import derive_seed

from .permutation import KeyedPermutation
from .resumable import BLOCK_ITEMS, _state_error

__all__ = [
    "ORDERS",
    "COMPUTED_ABOVE",
    "resolve_order",
    "check_saved_order",
    "order_setting",
    "chain_key",
    "block_bounds",
    "computed_blocks",
    "uniform_blocks",
]

#: The values ``order=`` takes.
ORDERS = ("auto", "stored", "computed")

#: ``order="auto"`` computes the order of an epoch of more items than this.
#: A stored permutation of 2**24 items already holds 128 MiB (int64) for the
#: whole epoch, and twice that while it is drawn, in the main process of
#: every rank, and it is drawn again each epoch before the first batch;
#: a computed one holds a few hundred bytes. Below it the stored order is
#: kept: it is the order earlier versions gave (saved states and seeds
#: reproduce their runs), and for so few items its memory and draw are small.
COMPUTED_ABOVE = 1 << 24

_MASK64 = (1 << 64) - 1

#: Items in an iteration's first block: small, so that the first batch (or a
#: resumed one) waits for a few thousand indices, not ``BLOCK_ITEMS``.
FIRST_BLOCK_ITEMS = 1 << 12


def block_bounds(start: int, stop: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` in blocks: ``FIRST_BLOCK_ITEMS``, then ``BLOCK_ITEMS`` each."""
    first = min(stop, start + FIRST_BLOCK_ITEMS)
    if start < first:
        yield start, first
    for begin in range(first, stop, BLOCK_ITEMS):
        yield begin, min(begin + BLOCK_ITEMS, stop)


def resolve_order(kind: str, order: Any, length: int, torch_exact: bool) -> str:
    """``"stored"`` or ``"computed"`` for a sampler of ``length`` items built
    with ``order``; ``torch_exact``: torch's generator drives the order, which
    ``"auto"`` then keeps (stored) whatever the length."""
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(
            f"{kind}: order must be one of {', '.join(repr(o) for o in ORDERS)}, got {order!r} "
            f"('stored': the epoch's permutation as an array, as torch; 'computed': a keyed permutation "
            f"computed per position, nothing of the dataset's size held; 'auto': computed above "
            f"{COMPUTED_ABOVE} items)"
        )
    if order != "auto":
        return order
    return "computed" if length > COMPUTED_ABOVE and not torch_exact else "stored"


def order_setting(order: str) -> dict[str, str]:
    """What a sampler's settings record of its order: nothing when stored
    (as states saved before ``order=`` existed)."""
    return {"order": "computed"} if order == "computed" else {}


def check_saved_order(kind: str, state: Any, order: str) -> None:
    """Refuse a state saved with the other order, naming both: its positions
    would name other samples."""
    saved = state.get("order", "stored") if isinstance(state, Mapping) else order
    if saved != order:
        raise _state_error(
            kind,
            f"the state was saved with the {saved} order and this sampler has the {order} one: the same "
            f"position holds another sample in each (build the sampler with the state's order to resume it).",
            {"order": saved},
            {"order": order},
        )


def chain_key(key: int, j: int) -> int:
    """The key of the ``j``-th permutation of an iteration (``num_samples``
    past ``n`` chains permutations): ``key`` itself for the first, so one
    epoch of ``n`` is ``KeyedPermutation(n, key)``."""
    return key if j == 0 else derive_seed(key, j)


def computed_blocks(n: int, key: int, total: int, start: int) -> Iterator[list[int]]:
    """Positions ``start .. total - 1`` of an iteration that chains keyed
    permutations of ``[0, n)`` (position ``p`` is ``p % n`` of permutation
    ``p // n``), as lists of indices (:func:`block_bounds`; a block that
    crosses into the next permutation comes in two)."""
    j, at = divmod(start, n) if n else (0, 0)
    permutation = KeyedPermutation(n, chain_key(key, j)) if n else None
    for first, stop in block_bounds(start, total):
        while first < stop:
            assert permutation is not None  # (n > 0 when there are positions)
            if at == n:
                j, at = j + 1, 0
                permutation = KeyedPermutation(n, chain_key(key, j))
            end = min(at + stop - first, n)
            yield permutation.block(at, end).tolist()
            first += end - at
            at = end


def uniform_blocks(n: int, key: int, total: int, start: int) -> Iterator[list[int]]:
    """Positions ``start .. total - 1`` of draws with replacement, each a
    function of (key, position) alone: the position's 64-bit hash modulo
    ``n`` (an index's chance is off from ``1/n`` by at most ``n / 2**64``
    of it)."""
    # splitmix64 of the key's stream at the position: z = key + (p + 1) * golden, then its two mixes.
    golden, mix1, mix2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    salt, modulus = np.uint64(key & _MASK64), np.uint64(n)
    for first, stop in block_bounds(start, total):
        z = np.arange(first, stop, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z += np.uint64(1)
            z *= golden
            z += salt
            z ^= z >> np.uint64(30)
            z *= mix1
            z ^= z >> np.uint64(27)
            z *= mix2
            z ^= z >> np.uint64(31)
        yield (z % modulus).tolist()
