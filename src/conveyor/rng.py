"""Seed derivation, and the generators seeded from it.

Every random draw conveyor makes comes from one root seed per epoch through
:func:`derive_seed`, a documented, framework-free function:

    derive_seed(root, *keys) = fold of splitmix64 over (root, key_0, key_1, ...)

so ``derive_seed(base_seed, batch_index)`` is the seed of one batch, the same
on every machine and for any number of workers. From a batch's seed come:

* the global generators (``random``, ``numpy.random``, torch's) of whoever
  loads the batch: :func:`seed_global_generators`, with a snapshot and a
  restore for loading in the loop's own process;
* each sample's own generators, :class:`SampleRandom`, which a dataset asks
  for with :func:`sample_rng`.

The random sources samplers draw their shuffles from (:func:`source_for`:
numpy's or torch's generator) live in random_sources.py and are named here too.
"""

from __future__ import annotations

import random
import sys
import threading
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from .random_sources import (
    SEED_MASK,
    GeneratorLike,
    NumpySource,
    RandomSource,
    TorchSource,
    draw_seed,
    is_torch_generator,
    source_for,
)

if TYPE_CHECKING:  # (the core imports no framework: torch only for the checker)
    import torch

__all__ = [
    "last_global_seed",
    "derive_seed",
    "GeneratorLike",
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
    return h & SEED_MASK


#: The seed most recently given to :func:`seed_global_generators` in this
#: process (a worker seeds torch with it if a dataset imports torch late).
current_seed: Any = None


def last_global_seed() -> Any:
    """The seed most recently given to :func:`seed_global_generators` in this process (None before)."""
    return current_seed


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
