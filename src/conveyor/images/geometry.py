"""From a crop box to what to decode: the DCT scale, the region of the
scaled image, and where the box lies inside that region.

    box (source pixels) ──▶ scale: the smallest of 1/8, 1/4, 1/2, 1 that keeps the
                            box at least as large as the output on both axes
                        ──▶ region: the scaled box, widened left to the scaled iMCU
                            grid (TurboJPEG's rule), cut to whole pixels
                        ──▶ inside: the scaled box within the region (fractional
                            when the box's edges fall between scaled pixels)

Only power-of-two scales are used: libjpeg-turbo's 3/8 … 7/8 inverse DCTs
are plain C and cost as much as a full decode, or more, on this project's
machine, where 1/2, 1/4 and 1/8 cost less (docs/images.md).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import NamedTuple

from .boxes import Box

#: DCT scales tried, smallest first.
SCALES = (Fraction(1, 8), Fraction(1, 4), Fraction(1, 2), Fraction(1))


class DecodePlan(NamedTuple):
    """What to decode for one box: ``region`` = (x, y, width, height) of the
    image scaled by ``scale``; ``inside`` = (top, left, height, width) of
    the box within the decoded region, in pixels of the region (whole
    numbers at scale 1)."""

    scale: Fraction
    region: tuple[int, int, int, int]
    inside: tuple[Fraction, Fraction, Fraction, Fraction]


def choose_scale(box: Box, out_height: int, out_width: int) -> Fraction:
    """The smallest DCT scale at which the box still covers the output on both axes."""
    for scale in SCALES:
        if box.height * scale >= out_height and box.width * scale >= out_width:
            return scale
    return SCALES[-1]


def scaled_size(size: int, scale: Fraction) -> int:
    """An image side after DCT scaling (libjpeg rounds up)."""
    return -(-size * scale.numerator // scale.denominator)


def plan_decode(box: Box, image_height: int, image_width: int, mcu_width: int, out_height: int, out_width: int) -> DecodePlan:
    """The DecodePlan of ``box`` in an image of that size and iMCU width.

    >>> plan_decode(Box(100, 50, 200, 300), 375, 500, 16, 224, 224)
    DecodePlan(scale=Fraction(1, 1), region=(48, 100, 302, 200), inside=(Fraction(0, 1), Fraction(2, 1), Fraction(200, 1), Fraction(300, 1)))
    """
    scale = choose_scale(box, out_height, out_width)
    full_w, full_h = scaled_size(image_width, scale), scaled_size(image_height, scale)
    top, left = box.top * scale, box.left * scale
    bottom, right = (box.top + box.height) * scale, (box.left + box.width) * scale
    step = max(1, int(mcu_width * scale))
    x0 = (math.floor(left) // step) * step
    y0 = min(math.floor(top), full_h - 1)
    x1 = min(full_w, max(x0 + 1, math.ceil(right)))
    y1 = min(full_h, max(y0 + 1, math.ceil(bottom)))
    # (the scaled image is rounded up, so a box that reaches the source's edge stays inside it)
    inside = (top - y0, left - x0, min(bottom, y1) - top, min(right, x1) - left)
    return DecodePlan(scale, (x0, y0, x1 - x0, y1 - y0), inside)
