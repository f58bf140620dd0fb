"""Decoding one crop box of an encoded image into an output array.

    encoded bytes + box ──TurboJPEG (a JPEG it can read)──▶ plan_decode: DCT scale, region
                        │                                ──▶ the region decoded into a scratch array
                        └─Pillow (PNG, CMYK, no TurboJPEG)─▶ draft (DCT scaling for a JPEG),
                                                             then an antialiased crop-and-resize
                        ──▶ OutputFormat.write: resize, flip, layout, dtype ──▶ out

:func:`read_size` reads only the header (a few µs with TurboJPEG), so the
box can be drawn before anything is decoded.
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import numpy as np

from .boxes import Box
from .geometry import choose_scale, plan_decode
from .resample import OutputFormat, scratch
from .turbojpeg import TurboJpegError, decode_region, library, read_header

TURBOJPEG = "turbojpeg"
PILLOW = "pillow"


class Source(NamedTuple):
    """An encoded image's size, and which decoder reads it (``mcu_width``: TurboJPEG's iMCU width, else 0)."""

    height: int
    width: int
    decoder: str
    mcu_width: int = 0


def read_size(data: Any, use_turbojpeg: bool = True) -> Source:
    """The image's size from its header, and the decoder that will read it."""
    if use_turbojpeg and library() is not None:
        try:
            header = read_header(data)
            return Source(header.height, header.width, TURBOJPEG, header.mcu_width)
        except TurboJpegError:
            pass  # not a JPEG TurboJPEG decodes to RGB: Pillow's turn
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
    return Source(height, width, PILLOW)


def decode_box(data: Any, source: Source, box: Box, flip: bool, output: OutputFormat, out: np.ndarray) -> None:
    """The ``box`` of the image ``data``, resized to the output, flipped when ``flip``, into ``out``."""
    out_h, out_w = output.size
    if source.decoder == TURBOJPEG:
        plan = plan_decode(box, source.height, source.width, source.mcu_width, out_h, out_w)
        x, y, w, h = plan.region
        region = scratch((h, w, 3))
        decode_region(data, plan.scale, plan.region, region)
        output.write(region, plan.inside, flip, out)
    else:
        output.write(_pillow_crop(data, source, box, out_h, out_w), (0, 0, out_h, out_w), flip, out)


def _pillow_crop(data: Any, source: Source, box: Box, out_h: int, out_w: int) -> np.ndarray:
    """Pillow: the box resized to the output (antialiased), decoded at a DCT scale when the file is a JPEG."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if image.format == "JPEG":
            scale = choose_scale(box, out_h, out_w)
            image.draft("RGB", (max(1, int(source.width * scale)), max(1, int(source.height * scale))))
        rgb = image.convert("RGB")
        sx, sy = rgb.width / source.width, rgb.height / source.height
        area = (box.left * sx, box.top * sy, (box.left + box.width) * sx, (box.top + box.height) * sy)
        return np.asarray(rgb.resize((out_w, out_h), Image.Resampling.BILINEAR, box=area))
