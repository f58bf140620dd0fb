"""Run an image-classification input pipeline through conveyor and report its speed.

On first run it writes a small synthetic JPEG folder (cached; no download),
in the usual class-per-subfolder layout; ``--data DIR`` uses a real folder
laid out the same way. Each sample is decoded with Pillow, randomly cropped
and flipped, and batches are collated into ``uint8`` arrays of shape
``(B, 3, crop, crop)`` plus ``int64`` labels.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

#: Bump when the synthetic images change, so old caches are not reused.
_SYNTHETIC_VERSION = 1
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "conveyor"


def _require_pillow():
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
    done = root / f".complete-v{_SYNTHETIC_VERSION}"
    if done.exists():
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
    (tmp / done.name).touch()
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None, help="an image folder (root/<class>/<image>); default: synthetic")
    parser.add_argument("--workers", type=int, default=2, help="num_workers (default 2)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def measure(loader: Any, epochs: int) -> dict[str, float]:
    """Iterate ``loader`` for ``epochs`` and time it, touching every byte of each batch."""
    samples = 0
    first_batch_s: Optional[float] = None
    start = time.perf_counter()
    checksum = 0
    for _ in range(epochs):
        for images, labels in loader:
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - start
            checksum += int(np.asarray(images).sum(dtype=np.uint64)) + int(np.asarray(labels).sum())
            samples += len(labels)
    elapsed = time.perf_counter() - start
    return {
        "samples": samples,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed if elapsed > 0 else float("nan"),
        "first_batch_s": first_batch_s if first_batch_s is not None else float("nan"),
        "checksum": checksum,
    }


def run(args: argparse.Namespace) -> int:
    from .. import DataLoader

    if args.data is None:
        root = default_cache_dir() / f"synthetic-jpeg-v{_SYNTHETIC_VERSION}"
        if not (root / f".complete-v{_SYNTHETIC_VERSION}").exists():
            print(f"writing synthetic JPEGs to {root} (once) ...", file=sys.stderr)
        make_synthetic_images(root)
    else:
        root = args.data
    dataset = ImageFolder(root, crop=args.crop)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        seed=args.seed,
        persistent_workers=args.workers > 0,
    )
    result = measure(loader, args.epochs)
    report = {
        "pipeline": "JPEG decode + random crop + flip + collate",
        "images": len(dataset),
        "batch_size": args.batch_size,
        "num_workers": args.workers,
        "epochs": args.epochs,
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()},
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"conveyor demo: {report['samples']} images ({len(dataset)} per epoch, {args.epochs} epochs), "
            f"batch {args.batch_size}, {args.workers} workers\n"
            f"  {result['samples_per_s']:.1f} samples/s, first batch after {result['first_batch_s'] * 1000:.0f} ms, "
            f"{result['seconds']:.2f} s in all"
        )
    return 0
