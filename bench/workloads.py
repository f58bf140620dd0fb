"""Datasets of the benchmarks, importable by child scripts (spawn workers
find them by module name)."""

import numpy as np


class FreshImages:
    """64-byte-aligned uint8 images of 3x224x224, made anew for every sample."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((3, 224, 224), i % 251, dtype=np.uint8)


class Ints:
    """Sample i is the int i."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i
