"""Where a random resized crop cuts: torchvision's ``RandomResizedCrop`` box
distribution, drawn before anything is decoded (only the image's size is needed).

The algorithm is torchvision's, as its documentation and source describe it:

1. up to 10 attempts: an area uniform in ``scale`` × the image's area, an
   aspect ratio uniform *in log space* between ``ratio[0]`` and ``ratio[1]``;
   the box is ``w = round(sqrt(area * aspect))``, ``h = round(sqrt(area /
   aspect))``; it is kept when it fits (``0 < w <= width``, ``0 < h <= height``),
   placed uniformly (``top`` in ``[0, height - h]``, ``left`` in ``[0, width - w]``);
2. when no attempt fits, the fallback: the largest centred box whose aspect
   ratio lies within ``ratio`` (the whole image when the image's own does).

Draws come from the generator given (``conveyor.sample_rng().random_generator``
in a loader), so a sample's box does not depend on the number of workers.
The boxes are torchvision's in distribution, not draw for draw: torchvision
draws from torch's global generator.
"""

from __future__ import annotations

import math
import random
from typing import NamedTuple

#: torchvision's number of attempts before the centred fallback.
ATTEMPTS = 10


class Box(NamedTuple):
    """A crop box in pixels of the source image: rows ``top .. top+height``,
    columns ``left .. left+width`` (torchvision's ``i, j, h, w``)."""

    top: int
    left: int
    height: int
    width: int


def check_range(name: str, value: tuple[float, float], positive: bool = True) -> tuple[float, float]:
    """``value`` as a (low, high) pair of floats; a ValueError naming ``name`` otherwise."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high) of numbers, got {value!r}") from None
    if low > high or (positive and low <= 0) or not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} must be (low, high) with 0 < low <= high, got {value!r}")
    return low, high


def random_resized_crop_box(
    height: int, width: int, scale: tuple[float, float], ratio: tuple[float, float], rng: random.Random
) -> Box:
    """A box of torchvision's RandomResizedCrop for an image of ``height`` × ``width``.

    >>> random_resized_crop_box(375, 500, (0.08, 1.0), (3 / 4, 4 / 3), random.Random(0))
    Box(top=3, left=5, height=372, width=432)
    """
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(ATTEMPTS):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_low, log_high))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return Box(rng.randint(0, height - h), rng.randint(0, width - w), h, w)
    return centre_fallback(height, width, ratio)


def centre_fallback(height: int, width: int, ratio: tuple[float, float]) -> Box:
    """The centred box torchvision takes when no attempt fits."""
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif aspect > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return Box((height - h) // 2, (width - w) // 2, h, w)
