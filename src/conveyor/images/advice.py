"""What ``conveyor doctor --data DIR`` says about JPEG files: whether
conveyor.images can decode them fast here, and whether they are large
enough to be worth storing smaller (``conveyor pack --max-side``)."""

from __future__ import annotations

from typing import Optional, Sequence

#: Mean pixels per image above which decoding is mostly the rows the crop never needs.
LARGE_PIXELS = 2_000_000
#: Headers read to judge the sizes (a few µs to a ms each).
_HEADERS_READ = 50


def jpeg_advice(paths: Sequence[str]) -> Optional[tuple[str, str, str]]:
    """(status, what was seen, what to do) for the JPEGs among ``paths``; None when there are none."""
    jpegs = [path for path in paths if path.lower().endswith((".jpg", ".jpeg"))]
    if not jpegs:
        return None
    from PIL import Image

    sizes = []
    for path in jpegs[:_HEADERS_READ]:
        try:
            with Image.open(path) as image:
                sizes.append(image.size)
        except Exception:  # (not an image after all: the data check reads it as bytes anyway)
            continue
    if not sizes:
        return None
    width = sum(w for w, _ in sizes) / len(sizes)
    height = sum(h for _, h in sizes) / len(sizes)
    seen = f"{len(jpegs)} of {len(paths)} files read are JPEGs, mean {width:.0f}x{height:.0f}"
    from . import decoders

    if decoders() != {"jpeg": "turbojpeg", "resize": "opencv"}:
        return (
            "WARN",
            f"{seen}; conveyor.images would decode them with Pillow here (no TurboJPEG 3 or OpenCV)",
            "pip install 'conveyor[images]', then decode with conveyor.images.RandomResizedCrop: only the crop box "
            "is decoded, straight into the batch (docs/images.md)",
        )
    if width * height > LARGE_PIXELS:
        return (
            "WARN",
            f"{seen}: large photos; a crop still entropy-decodes every row above it",
            "store them smaller: conveyor pack SRC OUT --max-bytes 1G --max-side 512, then read the shards with "
            "ShardDataset and conveyor.images (docs/images.md)",
        )
    return (
        "OK",
        f"{seen}; for decode + random crop, conveyor.images.RandomResizedCrop decodes only the crop box of each "
        f"(TurboJPEG, OpenCV; docs/images.md)",
        "",
    )
