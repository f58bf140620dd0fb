"""The random sources samplers draw their shuffles from.

A sampler never holds a user's generator directly; :func:`source_for` wraps
whatever was passed as ``generator`` into a :class:`RandomSource`:

* :class:`NumpySource` wraps a ``numpy.random.Generator`` (the core's default);
* :class:`TorchSource` wraps a ``torch.Generator`` and calls the same torch
  functions as ``torch.utils.data`` (``randperm``, ``randint``,
  ``multinomial``), so a user who switches sees the same order.

Each source saves and loads its generator's state as plain values (the
loader's ``generator_state``). torch is imported only when the user hands us
a ``torch.Generator`` or asks for the torch flavour (``conveyor.torch``).
"""

from __future__ import annotations

import base64
import sys
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, TypeGuard, Union

import numpy as np

if TYPE_CHECKING:  # (the core imports no framework: torch only for the checker)
    import torch

#: What a user may pass as ``generator``: see :func:`source_for`.
GeneratorLike = Union[np.random.Generator, "torch.Generator", int, np.integer, None]

__all__ = [
    "GeneratorLike",
    "RandomSource",
    "NumpySource",
    "TorchSource",
    "source_for",
    "draw_seed",
    "is_torch_generator",
    "SEED_MASK",
]

#: Every seed is 63 bits: non-negative, and it fits an int64 (rng.derive_seed's and the drawn ones).
SEED_MASK = (1 << 63) - 1


def is_torch_generator(obj: object) -> TypeGuard[torch.Generator]:
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

    def state_problem(self, state: Any) -> Optional[str]:
        """Why ``state`` cannot be loaded by ``set_state`` (None: it can), without loading it."""


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
        return int(self.generator.integers(0, SEED_MASK, dtype=np.int64))

    def get_state(self) -> Any:
        """JSON-serialisable state of the bit generator.

        Bit generators other than PCG64 keep arrays in their state (MT19937's
        key, SFC64's words); those come back as lists, which ``set_state``
        accepts as they are.
        """
        return _plain(self.generator.bit_generator.state)

    def set_state(self, state: Any) -> None:
        self.generator.bit_generator.state = state

    def state_problem(self, state: Any) -> Optional[str]:
        """Why ``state`` cannot be this generator's (None: it can). Tried on
        a fresh bit generator of the same kind; this one is left alone."""
        try:
            type(self.generator.bit_generator)().state = state
        except Exception as exc:
            return f"it is not a {type(self.generator.bit_generator).__name__} state ({type(exc).__name__}: {exc})"
        return None


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

    def __init__(self, generator: torch.Generator):
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

    def state_problem(self, state: Any) -> Optional[str]:
        """Why ``state`` cannot be this generator's (None: it can). Tried on
        a fresh generator of the same device; this one is left alone."""
        t = self._torch
        try:
            if not isinstance(state, str):
                raise TypeError(f"a {type(state).__name__}, not the base64 text state_dict() writes")
            raw = np.frombuffer(base64.b64decode(state, validate=True), dtype=np.uint8).copy()
            t.Generator(device=self.generator.device).set_state(t.from_numpy(raw))
        except Exception as exc:
            return f"it is not a torch.Generator state ({type(exc).__name__}: {exc})"
        return None


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
    return int(np.random.randint(0, SEED_MASK, dtype=np.int64))


def source_for(generator: GeneratorLike = None, flavor: str = "numpy") -> RandomSource:
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
