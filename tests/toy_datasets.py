"""Small datasets that several test files share.

A plain module, not conftest.py: test modules import these classes, and
workers started by spawn or forkserver unpickle them by reference, so
this module must import in a fresh interpreter (the engine gives spawn
workers the parent's ``sys.path``, which holds this directory). It imports
numpy and conveyor only, never torch: a spawn worker that unpickles
``Squares`` should not pay for importing torch (about 1.7 s a worker).

Not ``datasets.py``: that name would shadow Hugging Face's ``datasets``
package for the whole test session.
"""

from __future__ import annotations

import time

import conveyor


class Squares(conveyor.Dataset):
    """Map-style: sample ``i`` is ``i * i`` (a Python int); ``n`` samples."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i * i


class SlowAt1:
    """Map-style: sample ``i`` is ``i``; sample 1 takes ``seconds`` (far
    longer than a stall_warning or timeout setting), the others are instant."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == 1:
            time.sleep(self.seconds)
        return i


class Sleepy:
    """Map-style: sample ``i`` is ``i``, after sleeping ``seconds`` (a read
    that waits, as on network storage: it takes time but no CPU, so two
    cores do not blur it)."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.seconds)
        return i
