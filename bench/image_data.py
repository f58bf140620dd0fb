"""The image benchmark's data (bench/images.py), made once and cached:
photo-like JPEGs (a photo's spectrum, correlated channels, sharp-edged
shapes, sensor noise), quality 90, in the root/<class>/<file> layout.

  imagenet: 1,000 files of 400-500 x 300-400 pixels (ImageNet's typical sizes)
  large:    256 photos of 2,000-3,000 x 1,500-2,250 pixels (64 before 2026-12-01)
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("CONVEYOR_BENCH_CACHE", Path.home() / ".cache" / "conveyor")) / "bench-images-v1"


def photo_like(height: int, width: int, seed: int, detail: int = 1) -> np.ndarray:
    """An RGB uint8 image with a 1/f spectrum; ``detail`` > 1 makes it at
    1/detail of the size and enlarges it (fast for large photos), fine
    texture added back as noise."""
    g = np.random.default_rng(seed)
    h, w = -(-height // detail), -(-width // detail)
    fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
    f = np.hypot(fy, fx)
    f[0, 0] = 1.0
    image, base = np.empty((h, w, 3), np.float32), None
    for c in range(3):
        spectrum = (g.normal(size=f.shape) + 1j * g.normal(size=f.shape)) / f
        spectrum[0, 0] = 0
        channel = np.fft.irfft2(spectrum, s=(h, w))
        channel = (channel - channel.mean()) / (channel.std() + 1e-9)
        base = channel if base is None else 0.6 * base + 0.4 * channel
        image[..., c] = 128 + 45 * base
    yy, xx = np.mgrid[0:h, 0:w]
    for _ in range(6):
        cy, cx, r = g.uniform(0, h), g.uniform(0, w), g.uniform(0.05, 0.3) * min(h, w)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        image[disc] = image[disc] * 0.5 + g.uniform(0, 255, 3) * 0.5
    if detail > 1:
        import cv2

        image = cv2.resize(image, (width, height), interpolation=cv2.INTER_CUBIC)
    image += g.normal(0, 4 if detail == 1 else 6, image.shape).astype(np.float32)
    return np.clip(image, 0, 255).astype(np.uint8)


def _write(root: Path, count: int, size_of, detail: int, classes: int = 10) -> Path:
    done = root / ".complete"
    if done.exists():
        return root
    from PIL import Image

    g = np.random.default_rng(len(root.name))
    for i in range(count):
        height, width = size_of(g)
        folder = root / f"class_{i % classes:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.fromarray(photo_like(height, width, i, detail)).save(buffer, "JPEG", quality=90)
        (folder / f"img_{i:05d}.jpg").write_bytes(buffer.getvalue())
    done.touch()
    return root


def imagenet_sized(count: int = 1000) -> Path:
    def size(g):
        width, height = int(g.integers(400, 501)), int(g.integers(300, 401))
        return (height, width) if g.random() < 0.8 else (width, height)  # (a fifth in portrait)

    return _write(CACHE / f"imagenet-{count}", count, size, 1)


def large_photos(count: int = 256) -> Path:
    def size(g):
        width = int(g.integers(2000, 3001))
        return int(width * 3 / 4), width

    return _write(CACHE / f"large-{count}", count, size, 4)


def files(root: Path) -> list[tuple[str, int]]:
    """(path, label) of every file, classes numbered in sorted order."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    return [(str(p), label) for label, name in enumerate(classes) for p in sorted((root / name).iterdir())]
