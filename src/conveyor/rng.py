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
import threading
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, TypeGuard, Union

import numpy as np

if TYPE_CHECKING:  # (the core imports no framework: torch only for the checker)
    import torch

#: What a user may pass as ``generator``: see :func:`source_for`.
GeneratorLike = Union[np.random.Generator, "torch.Generator", int, np.integer, None]

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
    "SampleRandom",
    "sample_rng",
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
    return int(np.random.randint(0, _MASK63, dtype=np.int64))


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


# ------------------------------------------------------------------ samples
class SampleRandom:
    """Random generators for the one sample being loaded, the same whoever
    loads it: a worker process, a worker thread, the main process
    (``num_workers=0``), one read of many in flight.

    Seeded from the batch's seed and the sample's place in the batch
    (``derive_seed(batch_seed, k)``; the batch's own seed while collating
    and for a dataset's ``__getitems__``), so a sample's draws do not depend
    on the number or kind of workers, nor on what other threads draw. Each
    generator is made on first use, for this sample only: ask for it where
    the sample is loaded (``conveyor.sample_rng().numpy_generator``) rather
    than keeping it. Outside a DataLoader, the seed comes from the OS.
    """

    __slots__ = ("_root", "_key", "_seed", "_random", "_numpy", "_torch")

    _root: Optional[int]
    _seed: Optional[int]
    _random: Optional[random.Random]
    _numpy: Optional[np.random.Generator]
    _torch: Optional[torch.Generator]

    def __init__(self) -> None:
        self.reset(None)

    def reset(self, root: Optional[int], key: int = -1) -> None:
        """Be the generators of sample ``key`` (-1: the whole batch) of the batch seeded ``root``."""
        self._root, self._key = root, key
        self._seed = self._random = self._numpy = self._torch = None

    def at(self, key: int) -> None:
        """Move on to sample ``key`` of the same batch (cheap: runs per sample)."""
        self._key = key
        if self._seed is not None:  # (generators exist only once the seed does)
            self._seed = self._random = self._numpy = self._torch = None

    @property
    def root(self) -> Optional[int]:
        """The batch's seed (None outside a DataLoader)."""
        return self._root

    @property
    def seed(self) -> int:
        """This sample's 63-bit seed."""
        if self._seed is None:
            if self._root is None:
                self._seed = random.SystemRandom().getrandbits(63)
            else:
                self._seed = derive_seed(self._root, self._key) if self._key >= 0 else derive_seed(self._root)
        return self._seed

    @property
    def random_generator(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(self.seed)
        return self._random

    @property
    def numpy_generator(self) -> np.random.Generator:
        if self._numpy is None:
            self._numpy = np.random.Generator(np.random.PCG64(self.seed))
        return self._numpy

    @property
    def torch_generator(self) -> torch.Generator:
        """A CPU ``torch.Generator`` (imports torch)."""
        if self._torch is None:
            import torch

            self._torch = torch.Generator().manual_seed(self.seed)
        return self._torch

    def __repr__(self) -> str:
        return f"SampleRandom(seed={self.seed})"


_here = threading.local()


def thread_sample_random() -> SampleRandom:
    """This thread's SampleRandom, the one the loader resets for each sample it loads here."""
    sample = getattr(_here, "sample", None)
    if sample is None:
        sample = _here.sample = SampleRandom()
    return sample


def sample_rng() -> SampleRandom:
    """Random generators for the sample being loaded in this thread::

        def __getitem__(self, i):
            g = conveyor.sample_rng().numpy_generator
            return augment(load(i), flip=g.random() < 0.5)

    The same draws for a sample whatever loads it (``num_workers=0``,
    processes, ``worker_method="thread"``, ``reads_in_flight``), unlike the
    global generators, which thread workers share with the training loop
    (see docs/differences.md). Outside a DataLoader, freshly seeded from the OS.
    """
    sample = getattr(_here, "sample", None)
    if sample is None or sample.root is None:
        return SampleRandom()
    return sample
