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
    inside: tuple[float, float, float, float]


def choose_scale(box: Box, out_height: int, out_width: int) -> Fraction:
    """The smallest DCT scale at which the box still covers the output on both axes."""
    for scale in SCALES:
        num, den = scale.numerator, scale.denominator
        if box.height * num >= out_height * den and box.width * num >= out_width * den:
            return scale
    return SCALES[-1]


def scaled_size(size: int, scale: Fraction) -> int:
    """An image side after DCT scaling (libjpeg rounds up)."""
    return -(-size * scale.numerator // scale.denominator)


def plan_decode(
    box: Box, image_height: int, image_width: int, mcu_width: int, out_height: int, out_width: int
) -> DecodePlan:
    """The DecodePlan of ``box`` in an image of that size and iMCU width
    (integer arithmetic: this runs for every sample).

    >>> plan_decode(Box(100, 50, 200, 300), 375, 500, 16, 224, 224)
    DecodePlan(scale=Fraction(1, 1), region=(48, 100, 302, 200), inside=(0.0, 2.0, 200.0, 300.0))
    >>> plan_decode(Box(414, 621, 997, 1004), 1536, 2048, 16, 224, 224).inside
    (0.5, 3.25, 249.25, 251.0)
    """
    scale = choose_scale(box, out_height, out_width)
    num, den = scale.numerator, scale.denominator
    full_w, full_h = -(-image_width * num // den), -(-image_height * num // den)
    top, left = box.top * num, box.left * num  # (in 1/den pixels of the scaled image)
    bottom, right = (box.top + box.height) * num, (box.left + box.width) * num
    step = max(1, mcu_width * num // den)
    x0 = (left // den) // step * step
    y0 = min(top // den, full_h - 1)
    x1 = min(full_w, max(x0 + 1, -(-right // den)))
    y1 = min(full_h, max(y0 + 1, -(-bottom // den)))
    # (the scaled image is rounded up, so a box that reaches the source's edge stays inside it)
    inside = (
        (top - y0 * den) / den,
        (left - x0 * den) / den,
        (min(bottom, y1 * den) - top) / den,
        (min(right, x1 * den) - left) / den,
    )
    return DecodePlan(scale, (x0, y0, x1 - x0, y1 - y0), inside)
