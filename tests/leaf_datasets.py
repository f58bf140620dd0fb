"""Datasets for tests/engine/test_leaf_lifetime.py, importable by spawn workers."""

import numpy as np


def fill(i: int) -> int:
    """The byte value of sample ``i``'s arrays: never 0, so a page lost to a hole reads wrong."""
    return i % 250 + 1


class ImagesMasksLabels:
    """Sample ``i``: a (3, 64, 64) float32 image (48 KiB) and a (side, side)
    uint8 mask, both filled with ``fill(i)``, and the label ``i``."""

    def __init__(self, n: int, side: int = 48):
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        value = fill(i)
        return {
            "image": np.full((3, 64, 64), value, np.float32),
            "mask": np.full((self.side, self.side), value, np.uint8),
            "label": i,
        }
