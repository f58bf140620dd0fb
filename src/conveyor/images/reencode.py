"""Images stored smaller: ``conveyor pack --max-side N`` re-encodes each
image whose longer side exceeds N as a JPEG at most N pixels on a side
(FFCV's trick for large sources: decoding cost grows with the pixels stored,
and a RandomResizedCrop to 224 rarely needs more than ~512 of them).

    member "jpg"/"png"/... larger than N ──▶ Pillow: draft (DCT scaling) + Lanczos resize
                                             ──▶ JPEG, quality Q ──▶ member "jpg"
                                             (+ "orig.<ext>": the original, with --keep-original)
    an image within N, anything else ──▶ kept as it is

Deterministic (the same bytes for the same file), so packing stays
reproducible. EXIF orientation is not applied, as torchvision's loader
does not apply it either.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

#: Member extensions taken as images.
IMAGE_MEMBERS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "tif", "tiff")


@dataclass(frozen=True)
class Reencode:
    """How ``conveyor pack`` stores images: at most ``max_side`` pixels on
    the longer side, as JPEG of ``quality``; ``keep_original`` also stores the
    file as it was, under ``orig.<ext>``."""

    max_side: int
    quality: int = 90
    keep_original: bool = False

    def __post_init__(self) -> None:
        if self.max_side < 1:
            raise ValueError(f"max_side must be at least 1, got {self.max_side}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"quality must be 1 to 100, got {self.quality}")

    def describe(self) -> str:
        kept = ", originals kept" if self.keep_original else ""
        return f"images at most {self.max_side} px, JPEG quality {self.quality}{kept}"

    def members(self, members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """A sample's members with its images stored as this says."""
        out = []
        for ext, data in members:
            smaller = shrink(data, self.max_side, self.quality) if ext.lower() in IMAGE_MEMBERS else None
            if smaller is None:
                out.append((ext, data))
                continue
            out.append(("jpg", smaller))
            if self.keep_original:
                out.append((f"orig.{ext}", data))
        return out


def shrink(data: bytes, max_side: int, quality: int = 90) -> bytes | None:
    """``data`` re-encoded as an RGB JPEG whose longer side is ``max_side``;
    None when the image is no larger than that already (kept as it is)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        if max(width, height) <= max_side:
            return None
        scale = max_side / max(width, height)
        size = (max(1, round(width * scale)), max(1, round(height * scale)))
        if image.format == "JPEG":
            image.draft(
                "RGB", (size[0] * 2, size[1] * 2)
            )  # (decode at no less than twice the target: Lanczos does the rest)
        resized = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    resized.save(out, "JPEG", quality=quality)
    return out.getvalue()
