"""A dataset whose samples take a little CPU, so that the main process spends
its time inside conveyor's own frames (for the signal tests). A plain module:
spawn workers import it by reference."""

from __future__ import annotations

import numpy as np

import conveyor


class BusySamples(conveyor.Dataset):
    """Map-style: sample ``i`` is ``[i, i, i, i]``, after a short loop of Python work."""

    def __init__(self, n: int, work: int = 300):
        self.n, self.work = n, work

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        total = 0
        for k in range(self.work):
            total += k
        return np.full(4, i)
