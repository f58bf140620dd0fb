"""The demo's data: a synthetic JPEG folder, written once and cached, and
the map-style dataset that reads such a folder (or a real one) as
``(image, label)`` samples, decoded with Pillow, randomly cropped and flipped.

examples/images.py and bench/run.py import ImageFolder, default_cache_dir and
make_synthetic_images from ``conveyor.cli.demo``, which names them too.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

#: Bump when the synthetic images change, so old caches are not reused.
_SYNTHETIC_VERSION = 1
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "conveyor"


def synthetic_folder() -> Path:
    """Where :func:`make_synthetic_images` caches the demo's images (by version)."""
    return default_cache_dir() / f"synthetic-jpeg-v{_SYNTHETIC_VERSION}"


def is_made(root: Path) -> bool:
    """Whether the synthetic images under ``root`` are complete (written by this version)."""
    return (Path(root) / f".complete-v{_SYNTHETIC_VERSION}").exists()


def _require_pillow() -> ModuleType:
    try:
        from PIL import Image
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SystemExit("the demo needs Pillow: pip install 'conveyor[images]'") from exc
    return Image


def make_synthetic_images(root: Path, classes: int = 10, per_class: int = 100, size: int = 256, seed: int = 0) -> Path:
    """Write ``classes × per_class`` JPEGs under ``root`` (once; reused after).

    Each image is a smooth colour field plus noise, so that JPEG decoding does
    realistic work. Writing goes to a temporary folder renamed at the end, so
    an interrupted run never leaves a half-made cache behind.
    """
    root = Path(root)
    if is_made(root):
        return root
    Image = _require_pillow()
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    gen = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    for c in range(classes):
        folder = tmp / f"class_{c:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            a, b, d = gen.uniform(0, 255, size=3)
            base = np.stack([a * xx, b * yy, d * (1 - xx * yy)], axis=-1)
            noise = gen.normal(0, 18, size=(size, size, 3))
            pixels = np.clip(base + noise, 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i:05d}.jpg", quality=90)
    (tmp / f".complete-v{_SYNTHETIC_VERSION}").touch()
    if root.exists():
        import shutil

        shutil.rmtree(root)
    tmp.rename(root)
    return root


class ImageFolder:
    """A map-style dataset over ``root/<class>/<image>`` files.

    Sample ``i`` is ``(image, label)``: ``image`` is a ``uint8`` array of
    shape ``(3, crop, crop)``, randomly cropped and flipped with Python's
    ``random`` (which conveyor seeds per batch, so augmentations are
    reproducible and identical for any number of workers).
    """

    def __init__(self, root: str | Path, crop: int = 224):
        root = Path(root)
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        if not classes:
            raise ValueError(f"{root} has no class subfolders; expected root/<class>/<image>.jpg")
        self.classes = classes
        self.samples = [
            (str(path), label)
            for label, name in enumerate(classes)
            for path in sorted((root / name).iterdir())
            if path.suffix.lower() in _IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise ValueError(f"no images ({', '.join(_IMAGE_SUFFIXES)}) under {root}")
        self.crop = crop

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[np.ndarray, int]:
        from PIL import Image

        path, label = self.samples[index]
        with Image.open(path) as img:
            img = img.convert("RGB")
            img = _random_crop(img, self.crop)
            if random.random() < 0.5:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            pixels = np.asarray(img)
        return np.ascontiguousarray(pixels.transpose(2, 0, 1)), label


def _random_crop(img: Any, size: int) -> Any:
    width, height = img.size
    if width < size or height < size:
        scale = size / min(width, height)
        img = img.resize((max(size, round(width * scale)), max(size, round(height * scale))))
        width, height = img.size
    left = random.randint(0, width - size)
    top = random.randint(0, height - size)
    return img.crop((left, top, left + size, top + size))
