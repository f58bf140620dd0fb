"""Resizing a decoded region to the output size, flipping it, and writing
it in the output's layout and dtype.

    region (uint8 H×W×3) and the box in it ──▶ resize to the output size (bilinear,
        OpenCV); ratio ≤ 1.25: one step; above, two steps of √ratio each, which
        keeps the aliasing of a plain bilinear step small (docs/images.md: PSNR);
        a box with fractional edges (after DCT scaling) is mapped exactly by an
        affine warp, the flip folded into it
    ──▶ flip (mirrored left to right)
    ──▶ out: HWC uint8 as it is; CHW uint8 split by channel; float32
        normalised ((x / 255 - mean) / std), in either layout

DCT scaling leaves the region at most twice the output's size (below 1/8
at most the box itself), so the ratio here is small, and the antialiasing
the two steps give is enough. Without OpenCV, Pillow resizes (antialiased,
slower).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Optional, Sequence

import numpy as np

#: Above this downscaling ratio, two bilinear steps instead of one.
_TWO_STEP_RATIO = 1.25

_cv2: Any = False  # False: not imported yet; None: not installed


def opencv() -> Any:
    """The cv2 module, or None (imported once)."""
    global _cv2
    if _cv2 is False:
        try:
            import cv2

            _cv2 = cv2
        except ImportError:
            _cv2 = None
    return _cv2


_local = threading.local()


def scratch(shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
    """A reusable array of this thread (a fresh array of a few hundred KB costs
    the kernel's zeroed pages at every sample)."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    buffer = getattr(_local, "buffer", None)
    if buffer is None or buffer.size < size:
        buffer = _local.buffer = np.empty(max(size, 1 << 20), np.uint8)
    view: np.ndarray = buffer[:size].view(dtype).reshape(shape)
    return view


def _two_steps(height: float, width: float, out_h: int, out_w: int) -> Optional[tuple[int, int]]:
    """The (width, height) of the first of two bilinear steps, when the ratio calls for two; else None."""
    ratio_h, ratio_w = height / out_h, width / out_w
    if max(ratio_h, ratio_w) <= _TWO_STEP_RATIO:
        return None
    return max(out_w, round(width / math.sqrt(max(ratio_w, 1)))), max(out_h, round(height / math.sqrt(max(ratio_h, 1))))


def _resize(region: np.ndarray, inside: tuple[float, float, float, float], flip: bool, out: np.ndarray) -> None:
    """The box ``inside`` = (top, left, height, width) of ``region``
    resized into ``out`` (uint8 H×W×3, rows may be strided), mirrored when
    ``flip``. A box in whole pixels is cut out and resized; a fractional
    one (DCT scaling) is mapped exactly with an affine warp."""
    cv2 = opencv()
    out_h, out_w = out.shape[:2]
    top, left, height, width = inside
    if cv2 is None:
        from PIL import Image

        area = (float(left), float(top), float(left + width), float(top + height))
        image = Image.fromarray(np.ascontiguousarray(region)).resize(
            (out_w, out_h), Image.Resampling.BILINEAR, box=area
        )
        out[...] = np.asarray(image)[:, ::-1] if flip else np.asarray(image)
        return
    y0, x0 = math.floor(top), math.floor(left)
    y1, x1 = math.ceil(top + height), math.ceil(left + width)
    source = region[y0:y1, x0:x1]
    top, left = top - y0, left - x0
    middle = _two_steps(height, width, out_h, out_w)
    whole = top == 0 and left == 0 and height == source.shape[0] and width == source.shape[1]
    if middle is not None:
        fy, fx = middle[1] / source.shape[0], middle[0] / source.shape[1]
        source = cv2.resize(source, middle, interpolation=cv2.INTER_LINEAR)
        top, left, height, width = top * fy, left * fx, height * fy, width * fx
    if whole:
        cv2.resize(source, (out_w, out_h), dst=out, interpolation=cv2.INTER_LINEAR)
        if flip:
            cv2.flip(out, 1, dst=out)
        return
    # Output pixel x (centre x + 0.5) samples the source at left + (x + 0.5) * a, a pixel centre lying at + 0.5.
    a, b = width / out_w, height / out_h
    if flip:
        row_x = (-a, 0.0, left + (out_w - 0.5) * a - 0.5)
    else:
        row_x = (a, 0.0, left + 0.5 * a - 0.5)
    matrix = np.array([row_x, (0.0, b, top + 0.5 * b - 0.5)])
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    cv2.warpAffine(source, matrix, (out_w, out_h), dst=out, flags=flags, borderMode=cv2.BORDER_REPLICATE)


class OutputFormat:
    """How an output image is laid out: ``size`` (height, width), ``layout``
    "HWC" or "CHW", and, when ``mean`` and ``std`` are given (per channel,
    on the 0-1 scale), float32 normalised values instead of uint8."""

    def __init__(
        self,
        size: tuple[int, int],
        layout: str = "HWC",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
    ):
        if layout not in ("HWC", "CHW"):
            raise ValueError(f"layout must be 'HWC' or 'CHW', got {layout!r}")
        if (mean is None) != (std is None):
            raise ValueError("give both mean and std (per channel, on the 0-1 scale) to normalise, or neither")
        self.size, self.layout = size, layout
        self.normalise: Optional[tuple[np.ndarray, np.ndarray]] = None
        if mean is not None:
            mean_a, std_a = np.asarray(mean, np.float32).reshape(-1), np.asarray(std, np.float32).reshape(-1)
            if mean_a.size not in (1, 3) or std_a.size not in (1, 3) or np.any(std_a == 0):
                raise ValueError(f"mean and std need 1 or 3 values, std none zero; got {mean!r}, {std!r}")
            # x / 255 - mean) / std == x * scale + offset
            self.normalise = ((1 / (255 * std_a)).astype(np.float32), (-mean_a / std_a).astype(np.float32))
        self.dtype = np.dtype(np.float32 if self.normalise else np.uint8)
        height, width = size
        self.shape = (height, width, 3) if layout == "HWC" else (3, height, width)

    def write(self, region: np.ndarray, inside: tuple[float, float, float, float], flip: bool, out: np.ndarray) -> None:
        """The box ``inside`` = (top, left, height, width) of ``region``
        (uint8 H×W×3) resized, flipped when ``flip``, into ``out`` (of
        ``self.shape`` and dtype)."""
        direct = self.layout == "HWC" and self.normalise is None and out.strides[1:] == (3, 1)
        hwc = out if direct else scratch(self.size + (3,), np.uint8)
        _resize(region, inside, flip, hwc)
        if direct:
            return
        cv2 = opencv()
        if self.layout == "CHW" and self.normalise is None and cv2 is not None and out.strides[1:] == (out.shape[2], 1):
            cv2.split(hwc, [out[0], out[1], out[2]])
            return
        target = out if self.layout == "HWC" else out.transpose(1, 2, 0)
        if self.normalise is None:
            target[...] = hwc
        else:
            scale, offset = self.normalise
            np.multiply(hwc, scale, out=target, casting="unsafe")
            target += offset
