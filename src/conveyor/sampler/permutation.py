"""A keyed permutation of ``[0, n)``, computed per position: an order that is
never stored.

``KeyedPermutation(n, key)[i]`` is the index at position ``i`` of a
pseudo-random permutation of ``[0, n)`` chosen by ``key``. Nothing of size
``n`` is held past :data:`TABLE_UP_TO` positions: a position's index costs a
few multiplications, whatever ``n`` is (up to ``2**64 - 1``), so an epoch
over ``10**10`` samples starts at once, any position is reached in O(1), and
a state needs only the key.

How: a Feistel network over ``b`` bits, the smallest width with
``2**b >= n`` (at least 2), so the domain is under ``2n``. The value is cut
into a high part of ``b // 2`` bits and a low part of the rest; each round
maps ``(high, low)`` to ``(low, high ^ F(low))``, ``F`` cut to the high
part's width, so the parts swap widths each round (for an odd ``b`` they
differ by one bit) and are back in place after an even number of rounds.
``F`` is a 64-bit multiply-xorshift mix of the part and the round's key.
Each round is a bijection whatever ``F`` is (``high`` is recovered as
``low' ^ F(high')``), so the network is one of the domain; a value that lands
at ``n`` or above is mapped again ("cycle walking") until it lands below
``n``. The walk stays on the value's cycle, which holds ``i`` itself, so it
ends, and restricted to ``[0, n)`` the map is again a bijection. The
expected number of walks is under 2 (the domain is under ``2n``).

Up to :data:`TABLE_UP_TO` positions, the permutation is a table instead,
drawn once (32 KiB at most): the positions sorted by a 64-bit hash of
(key, position), a uniform shuffle. A Feistel network over a few bits is
not one: its rounds reach only some orders, unevenly (over 8 items, a third
of them; over 16, 64 or 256, the even ones alone), and an index is up to
7% likelier at some positions than at others over 5 or 6 items, the sizes
of shard orders and of small windows (``block_order.py``).

Eight rounds: four rounds of a pseudo-random function already make a
strong pseudo-random permutation (Luby and Rackoff); the others are margin
against the round function's weaknesses, for the cost of four mixes. The
quality tests (tests/data/test_permutation.py) check the bijection, the
uniformity of positions and the independence of neighbours and of keys.

:meth:`take` maps a numpy array of positions at once (uint64 arithmetic,
which wraps as the mix needs); ``[i]`` maps one position with Python ints.
Both give the same indices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .arguments import checked_length

__all__ = ["KeyedPermutation", "MAX_LENGTH", "ROUNDS", "TABLE_UP_TO"]

#: The largest ``n`` a permutation may have (its positions fit in 64 bits).
MAX_LENGTH = (1 << 64) - 1
#: Feistel rounds.
ROUNDS = 8
#: A permutation of at most this many positions is a table, drawn once (see the module).
TABLE_UP_TO = 1 << 12

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_M1, _M2 = np.uint64(_MIX1), np.uint64(_MIX2)
#: Mixed into the key for a table's hashes (which then share nothing with the Feistel round keys).
_TABLE_SALT = 0x5851F42D4C957F2D
_S29, _S32 = np.uint64(29), np.uint64(32)
#: The largest n whose indices fit an int64 (take and block return int64 up to it).
_INT64_LIMIT = 1 << 63
#: Positions mapped at a time: four uint64 arrays of it (x, its other half and two
#: scratch ones), 2 MiB, stay in a core's L2 cache between the rounds' operations, and each
#: numpy call's fixed cost is spread over enough items.
_CHUNK_ITEMS = 1 << 16


def _splitmix(x: int) -> int:
    x = (x + _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    return x ^ (x >> 31)


def _check_length(n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"a permutation's length must be an int, got {type(n).__name__}")
    n = int(n)
    if not 0 <= n <= MAX_LENGTH:
        raise ValueError(
            f"a permutation's length must be in [0, 2**64 - 1], got {n}: positions past 2**64 do not fit in 64 bits"
        )
    return n


class KeyedPermutation:
    """A pseudo-random permutation of ``[0, n)`` chosen by ``key`` (an int;
    two keys give independent permutations), computed per position in O(1)
    time and memory (up to :data:`TABLE_UP_TO` positions, a table drawn when
    it is built)."""

    __slots__ = ("n", "key", "_low_bits", "_masks", "_keys", "_np_keys", "_np_masks", "_table")

    def __init__(self, n: int, key: int) -> None:
        self.n = _check_length(n)
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"a permutation's key must be an int, got {type(key).__name__}")
        self.key = int(key) & _MASK64
        bits = max(2, (self.n - 1).bit_length())
        high_bits = bits // 2
        self._low_bits = bits - high_bits
        # Round r's F is cut to the high part's width, which alternates between the two.
        self._masks = tuple((1 << (high_bits if r % 2 == 0 else self._low_bits)) - 1 for r in range(ROUNDS))
        keys, state = [], self.key
        for _ in range(ROUNDS):
            state = _splitmix(state)
            keys.append(state)
        self._keys = tuple(keys)
        self._np_keys = tuple(np.uint64(k) for k in keys)
        self._np_masks = tuple(np.uint64(m) for m in self._masks)
        #: The permutation itself, up to TABLE_UP_TO positions (None past it).
        self._table = self._draw_table() if self.n <= TABLE_UP_TO else None

    def _draw_table(self) -> np.ndarray:
        """The positions sorted by splitmix64 of ``(position + 1) * golden + salt``:
        the hashes of distinct positions are distinct (each step is a bijection
        of 64 bits), so the order has no ties, and it is a uniform shuffle."""
        z = np.arange(1, self.n + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z *= np.uint64(_GOLDEN)
            z += np.uint64(_splitmix(self.key ^ _TABLE_SALT))
            z ^= z >> np.uint64(30)
            z *= _M1
            z ^= z >> np.uint64(27)
            z *= _M2
            z ^= z >> np.uint64(31)
        table = np.argsort(z, kind="stable").astype(np.int64)
        table.flags.writeable = False
        return table

    def __len__(self) -> int:
        # (len() stops at sys.maxsize; a permutation past it still maps positions, and says so)
        return checked_length("KeyedPermutation", self.n, "n")

    def __repr__(self) -> str:
        return f"KeyedPermutation(n={self.n}, key={self.key})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeyedPermutation) and (self.n, self.key) == (other.n, other.key)

    def __hash__(self) -> int:
        return hash((self.n, self.key))

    def __getstate__(self) -> tuple[int, int]:
        return self.n, self.key

    def __setstate__(self, state: tuple[int, int]) -> None:
        self.__init__(*state)  # type: ignore[misc]

    def _feistel(self, x: int) -> int:
        low_bits = self._low_bits
        high, low = x >> low_bits, x & ((1 << low_bits) - 1)
        for k, mask in zip(self._keys, self._masks):
            f = ((low ^ k) * _MIX1) & _MASK64
            f = ((f ^ (f >> 29)) * _MIX2) & _MASK64
            high, low = low, high ^ ((f ^ (f >> 32)) & mask)
        return (high << low_bits) | low  # (an even number of rounds: the parts are back at their widths)

    def __getitem__(self, position: int) -> int:
        """The index at ``position`` (negative positions count from the end)."""
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)):
            raise TypeError(f"a permutation's positions are ints, got {type(position).__name__}")
        i = int(position)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"position {position} is outside a permutation of {self.n}")
        if self._table is not None:
            return int(self._table[i])
        x = self._feistel(i)
        while x >= self.n:
            x = self._feistel(x)
        return x

    def _feistel_array(self, x: np.ndarray, scratch: np.ndarray) -> None:
        """The Feistel network over ``x`` (uint64), in place; ``scratch`` is
        as long as ``x``. Every operation writes into an array already held,
        so a chunk of ``_CHUNK_ITEMS`` stays in the CPU's cache."""
        low_bits = np.uint64(self._low_bits)
        left = np.right_shift(x, low_bits)
        right = np.bitwise_and(x, np.uint64((1 << self._low_bits) - 1), out=x)
        f, t = scratch, np.empty_like(scratch)
        for k, mask in zip(self._np_keys, self._np_masks):
            np.bitwise_xor(right, k, out=f)
            np.multiply(f, _M1, out=f)
            np.right_shift(f, _S29, out=t)
            np.bitwise_xor(f, t, out=f)
            np.multiply(f, _M2, out=f)
            np.right_shift(f, _S32, out=t)
            np.bitwise_xor(f, t, out=f)
            np.bitwise_and(f, mask, out=f)
            np.bitwise_xor(left, f, out=left)  # the new right half
            left, right = right, left
        # (left and right are x's buffer and one of its own, in either order: the result goes into x)
        np.left_shift(left, low_bits, out=t)
        np.bitwise_or(t, right, out=x)

    def _map_chunk(self, x: np.ndarray) -> None:
        """Positions ``x`` (uint64, each below n) to their indices, in place."""
        scratch = np.empty_like(x)
        n = np.uint64(self.n)
        with np.errstate(over="ignore"):
            self._feistel_array(x, scratch)
            out = np.flatnonzero(x >= n)
            while out.size:  # cycle walking: a few values at a time, each on its own cycle
                walked = x[out]
                self._feistel_array(walked, np.empty_like(walked))
                x[out] = walked
                out = out[walked >= n]

    def take(self, positions: Any) -> np.ndarray:
        """The indices at ``positions`` (an array-like of ints in ``[0, n)``,
        negative ones not allowed), as int64 (uint64 when ``n`` is past
        ``2**63``), in the shape of ``positions``. The same indices as ``[i]``."""
        given = np.asarray(positions)
        if given.size and not np.issubdtype(given.dtype, np.integer):
            raise TypeError(f"a permutation's positions are ints, got an array of {given.dtype}")
        if given.size and ((given.dtype.kind == "i" and int(given.min()) < 0) or int(given.max()) >= self.n):
            low, high = int(given.min()), int(given.max())
            raise IndexError(f"positions {low}..{high} reach outside a permutation of {self.n} (positions 0..n-1)")
        if self._table is not None:
            return self._table[given.astype(np.intp)]
        flat = given.astype(np.uint64, copy=True).reshape(-1)
        for start in range(0, flat.size, _CHUNK_ITEMS):
            self._map_chunk(flat[start : start + _CHUNK_ITEMS])
        x = flat.reshape(given.shape)
        return x.view(np.int64) if self.n <= _INT64_LIMIT else x

    def block(self, start: int, stop: int) -> np.ndarray:
        """The indices at positions ``start, start + 1, ..., stop - 1`` (``0 <= start <= stop <= n``)."""
        if (
            isinstance(start, bool)
            or isinstance(stop, bool)
            or not all(isinstance(v, (int, np.integer)) for v in (start, stop))
        ):
            raise TypeError(f"a block's start and stop are ints, got {start!r} and {stop!r}")
        start, stop = int(start), int(stop)
        if not 0 <= start <= stop <= self.n:
            raise IndexError(
                f"block [{start}, {stop}) is not inside a permutation of {self.n} (0 <= start <= stop <= n)"
            )
        if self._table is not None:
            return self._table[start:stop].copy()
        x = np.arange(stop - start, dtype=np.uint64)
        x += np.uint64(start)
        for first in range(0, x.size, _CHUNK_ITEMS):
            self._map_chunk(x[first : first + _CHUNK_ITEMS])
        return x.view(np.int64) if self.n <= _INT64_LIMIT else x
