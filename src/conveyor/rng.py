"""Seed derivation and random sources.

Every random draw conveyor makes comes from one root seed per epoch through
:func:`derive_seed`, a documented, framework-free function:

    derive_seed(root, *keys) = fold of splitmix64 over (root, key_0, key_1, ...)

so ``derive_seed(base_seed, batch_index)`` is the seed of one batch, the same
on every machine and for any number of workers.

Samplers draw their shuffles from a :class:`RandomSource`:

* :class:`NumpySource` wraps a ``numpy.random.Generator`` (the core's default);
* :class:`TorchSource` wraps a ``torch.Generator`` and calls the same torch
  functions as ``torch.utils.data`` (``randperm``, ``randint``,
  ``multinomial``), so a user who switches sees the same order.

:func:`source_for` turns whatever a user passed as ``generator`` into a source.
torch is imported only when the user hands us a ``torch.Generator`` or asks for
the torch flavour (``conveyor.torch``).
"""

from __future__ import annotations

import base64
import random
import sys
from typing import Any, Protocol, Sequence

import numpy as np

__all__ = [
    "derive_seed",
    "RandomSource",
    "NumpySource",
    "TorchSource",
    "source_for",
    "draw_seed",
    "is_torch_generator",
    "seed_global_generators",
    "global_generator_states",
    "restore_global_generators",
]

_MASK64 = (1 << 64) - 1
_MASK63 = (1 << 63) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(root: int, *keys: int) -> int:
    """Mix ``root`` and ``keys`` into a 63-bit seed (non-negative, fits int64).

    Cheap (a few multiplications per key), stable across versions, platforms
    and worker counts. Used for per-epoch and per-batch seeds::

        >>> derive_seed(0, 3) == derive_seed(0, 3)
        True
        >>> derive_seed(0, 3) != derive_seed(0, 4)
        True
    """
    h = _splitmix64(int(root) & _MASK64)
    for key in keys:
        h = _splitmix64(h ^ (int(key) & _MASK64))
    return h & _MASK63


def is_torch_generator(obj: Any) -> bool:
    """True when ``obj`` is a ``torch.Generator`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Generator)


class RandomSource(Protocol):
    """What samplers need from a random number generator."""

    def permutation(self, n: int) -> list[int]: ...

    def permutation_array(self, n: int) -> np.ndarray: ...

    def randint(self, high: int, size: int) -> list[int]: ...

    def multinomial(self, weights: Sequence[float], num_samples: int, replacement: bool) -> list[int]: ...

    def draw_seed(self) -> int: ...

    def get_state(self) -> Any: ...

    def set_state(self, state: Any) -> None: ...


class NumpySource:
    """A :class:`RandomSource` over a ``numpy.random.Generator``.

    The generator is used in place, as torch uses a ``torch.Generator``: each
    draw advances it.
    """

    def __init__(self, generator: np.random.Generator):
        self.generator = generator

    @classmethod
    def from_seed(cls, seed: int) -> "NumpySource":
        return cls(np.random.Generator(np.random.PCG64(seed)))

    def permutation(self, n: int) -> list[int]:
        return self.permutation_array(n).tolist()

    def permutation_array(self, n: int) -> np.ndarray:
        """The same draw as :meth:`permutation`, as an int64 array."""
        return self.generator.permutation(n)

    def randint(self, high: int, size: int) -> list[int]:
        return self.generator.integers(0, high, size=size, dtype=np.int64).tolist()

    def multinomial(self, weights: Sequence[float], num_samples: int, replacement: bool) -> list[int]:
        p = np.asarray(weights, dtype=np.float64)
        p = p / p.sum()
        return self.generator.choice(len(p), size=num_samples, replace=replacement, p=p).tolist()

    def draw_seed(self) -> int:
        return int(self.generator.integers(0, _MASK63, dtype=np.int64))

    def get_state(self) -> Any:
        """JSON-serialisable state of the bit generator.

        Bit generators other than PCG64 keep arrays in their state (MT19937's
        key, SFC64's words); those come back as lists, which ``set_state``
        accepts as they are.
        """
        return _plain(self.generator.bit_generator.state)

    def set_state(self, state: Any) -> None:
        self.generator.bit_generator.state = state


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars turned into lists and ints."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


class TorchSource:
    """A :class:`RandomSource` over a ``torch.Generator``, drawing exactly as
    ``torch.utils.data`` does so that orders match for the same state."""

    def __init__(self, generator: Any):
        import torch  # noqa: F401  (fails here, not at the first draw, without torch)

        self.generator = generator

    @property
    def _torch(self) -> Any:
        # Looked up, not stored: a module attribute would make the source,
        # and every sampler holding one, impossible to pickle or deepcopy.
        return sys.modules["torch"]

    @classmethod
    def from_seed(cls, seed: int) -> "TorchSource":
        import torch

        g = torch.Generator()
        g.manual_seed(seed)
        return cls(g)

    def permutation(self, n: int) -> list[int]:
        return self.permutation_array(n).tolist()

    def permutation_array(self, n: int) -> np.ndarray:
        """The same draw as :meth:`permutation`, as an int64 array."""
        return self._torch.randperm(n, generator=self.generator).numpy()

    def randint(self, high: int, size: int) -> list[int]:
        t = self._torch
        return t.randint(high=high, size=(size,), dtype=t.int64, generator=self.generator).tolist()

    def multinomial(self, weights: Sequence[float], num_samples: int, replacement: bool) -> list[int]:
        t = self._torch
        w = weights if isinstance(weights, t.Tensor) else t.as_tensor(weights, dtype=t.double)
        return t.multinomial(w, num_samples, replacement, generator=self.generator).tolist()

    def draw_seed(self) -> int:
        t = self._torch
        return int(t.empty((), dtype=t.int64).random_(generator=self.generator).item())

    def get_state(self) -> Any:
        """The generator state as a base64 string (JSON-serialisable)."""
        return base64.b64encode(self.generator.get_state().numpy().tobytes()).decode("ascii")

    def set_state(self, state: Any) -> None:
        t = self._torch
        raw = np.frombuffer(base64.b64decode(state), dtype=np.uint8).copy()
        self.generator.set_state(t.from_numpy(raw))


def draw_seed(flavor: str = "numpy") -> int:
    """Draw a fresh 63-bit seed from the global generator of ``flavor``.

    ``"numpy"`` draws from ``numpy.random``'s global state (so
    ``np.random.seed`` makes it reproducible); ``"torch"`` draws from torch's
    default generator exactly as ``torch.utils.data`` does (so
    ``torch.manual_seed`` does).
    """
    if flavor == "torch":
        import torch

        return int(torch.empty((), dtype=torch.int64).random_().item())
    return int(np.random.randint(0, _MASK63, dtype=np.int64))


def source_for(generator: Any = None, flavor: str = "numpy") -> RandomSource:
    """A :class:`RandomSource` for what a user passed as ``generator``.

    ``generator`` may be a ``numpy.random.Generator``, a ``torch.Generator``,
    an ``int`` seed, or ``None``. With ``None`` a fresh source is seeded from
    the global generator of ``flavor`` (see :func:`draw_seed`), as torch's
    samplers do.
    """
    if generator is None:
        seed = draw_seed(flavor)
        return TorchSource.from_seed(seed) if flavor == "torch" else NumpySource.from_seed(seed)
    if isinstance(generator, np.random.Generator):
        return NumpySource(generator)
    if is_torch_generator(generator):
        return TorchSource(generator)
    if isinstance(generator, (int, np.integer)) and not isinstance(generator, bool):
        return TorchSource.from_seed(int(generator)) if flavor == "torch" else NumpySource.from_seed(int(generator))
    raise TypeError(
        f"generator must be a numpy.random.Generator, a torch.Generator, an int seed or None, "
        f"got {type(generator).__name__}"
    )


#: The seed most recently given to :func:`seed_global_generators` in this
#: process (a worker seeds torch with it if a dataset imports torch late).
current_seed: Any = None


def seed_global_generators(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and, when torch is loaded, torch's
    default generator, from one 63-bit seed.

    Python's ``random`` gets ``seed`` itself, numpy's legacy global state gets
    ``seed`` folded to 32 bits (its limit), torch gets ``seed``.
    """
    global current_seed
    current_seed = seed
    random.seed(seed)
    np.random.seed(derive_seed(seed, 0x6E70) & 0xFFFFFFFF)
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        # The CPU generator only: torch.manual_seed would also reseed CUDA's,
        # which belongs to the training loop when this runs in-process.
        torch.default_generator.manual_seed(seed)


def global_generator_states() -> tuple:
    """Snapshot of the global generators that :func:`seed_global_generators` touches."""
    torch = sys.modules.get("torch")
    torch_state = torch.get_rng_state() if torch is not None and hasattr(torch, "get_rng_state") else None
    return random.getstate(), np.random.get_state(), torch_state


def restore_global_generators(states: tuple) -> None:
    """Put back a snapshot taken by :func:`global_generator_states`."""
    py_state, np_state, torch_state = states
    random.setstate(py_state)
    np.random.set_state(np_state)
    if torch_state is not None:
        sys.modules["torch"].set_rng_state(torch_state)
