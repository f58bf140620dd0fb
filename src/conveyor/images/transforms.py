"""The transform a dataset calls on encoded bytes, and the lazy image it
returns: decoded only when the loader writes it into its row of the batch.

    dataset[i]: RandomResizedCrop(size)(bytes) ──▶ header read, box and flip drawn
                                                   (conveyor.sample_rng()) ──▶ PendingImage
    worker:     the row placement sees ``fill_into`` ──▶ pending.fill_into(row of the
                batch in shared memory): decoded, resized, flipped there, no copy
    elsewhere:  collate (num_workers=0, a user's collate_fn through default_collate)
                decodes each into an array of its own (``np.asarray(pending)``)

A PendingImage holds the encoded bytes, the box and the flip: it decodes
the same wherever and whenever it is filled, so batches are the same for
any number of workers.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ..collate import register_collate
from ..rng import sample_rng
from .boxes import Box, check_range, random_resized_crop_box
from .decode import Source, decode_box, read_size
from .resample import OutputFormat, opencv
from .turbojpeg import library


class PendingImage:
    """An image still encoded, with the crop box and flip already drawn.

    A leaf of the ``fill_into`` protocol: ``shape`` and ``dtype`` say what
    it becomes; ``fill_into(out)`` decodes it into ``out`` (an array of that
    shape and dtype, e.g. its row of the batch). ``np.asarray(pending)``
    decodes it into a new array.
    """

    __slots__ = ("data", "source", "box", "flip", "output")

    def __init__(self, data: Any, source: Source, box: Box, flip: bool, output: OutputFormat):
        self.data, self.source, self.box, self.flip, self.output = data, source, box, flip, output

    @property
    def shape(self) -> tuple[int, ...]:
        return self.output.shape

    @property
    def dtype(self) -> np.dtype:
        return self.output.dtype

    def fill_into(self, out: np.ndarray) -> None:
        """Decode into ``out`` (shape ``self.shape``, dtype ``self.dtype``)."""
        if out.shape != self.shape or out.dtype != self.dtype:
            raise ValueError(f"fill_into: out must be {self.dtype} {self.shape}, got {out.dtype} {out.shape}")
        decode_box(self.data, self.source, self.box, self.flip, self.output, out)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        self.fill_into(out)
        return out if dtype is None else out.astype(dtype, copy=False)

    def __repr__(self) -> str:
        source = self.source
        return (
            f"PendingImage({source.width}x{source.height} {source.decoder}, box={tuple(self.box)}, flip={self.flip} "
            f"-> {self.dtype} {self.shape})"
        )


def _collate_pending(batch: Sequence[Any], *, collate: Any) -> Any:
    """Where no row placement ran (``num_workers=0``, thread workers, ``__getitems__``): decode each, then stack."""
    return collate([np.asarray(sample) if isinstance(sample, PendingImage) else sample for sample in batch])


register_collate(PendingImage, _collate_pending)


def _pair(size: Any) -> tuple[int, int]:
    try:
        values = [size, size] if isinstance(size, int) else [int(s) for s in size]
    except TypeError:
        values = []
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"size must be an int or (height, width) of positive ints, got {size!r}")
    return values[0], values[1]


class RandomResizedCrop:
    """Decode, RandomResizedCrop and flip in one step, from the encoded bytes.

    ``RandomResizedCrop(224)(jpeg_bytes)`` draws torchvision's
    RandomResizedCrop box (``scale``, ``ratio``: its parameters and
    distribution) and a horizontal flip (probability ``flip``) from
    ``conveyor.sample_rng()``, and returns a :class:`PendingImage`, which the
    loader decodes into the batch: only the box, at the smallest DCT scale
    that keeps it at least ``size``. Output: uint8 ``(H, W, 3)`` (``layout="CHW"``:
    ``(3, H, W)``), or float32 ``(x / 255 - mean) / std`` with ``mean`` and ``std``.
    ``decode(data)`` returns the array at once. Example::

        crop = RandomResizedCrop(224)

        def __getitem__(self, i):
            return crop(self.files[i].read_bytes()), self.labels[i]

    ``use_turbojpeg=False`` decodes with Pillow (as it does for PNG and CMYK).
    """

    def __init__(
        self,
        size: Any,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        layout: str = "HWC",
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        use_turbojpeg: bool = True,
    ):
        self.size = _pair(size)
        self.scale = check_range("scale", scale)
        self.ratio = check_range("ratio", ratio)
        if not 0 <= flip <= 1:
            raise ValueError(f"flip is a probability (0 to 1), got {flip!r}")
        self.flip = float(flip)
        self.output = OutputFormat(self.size, layout, mean, std)
        self.use_turbojpeg = bool(use_turbojpeg)
        # Load the libraries now, in the main process: forked workers then start with them.
        if self.use_turbojpeg:
            library()
        opencv()

    def __call__(self, data: Any) -> PendingImage:
        source = read_size(data, self.use_turbojpeg)
        rng = sample_rng().random_generator
        box = random_resized_crop_box(source.height, source.width, self.scale, self.ratio, rng)
        flip = self.flip > 0 and rng.random() < self.flip
        return PendingImage(data, source, box, flip, self.output)

    def decode(self, data: Any) -> np.ndarray:
        """The crop as an array now (e.g. for torch.utils.data's own DataLoader)."""
        return np.asarray(self(data))

    def __repr__(self) -> str:
        return (
            f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, flip={self.flip}, "
            f"layout={self.output.layout!r}, dtype={self.output.dtype})"
        )
