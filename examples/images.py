"""A small image-classification input pipeline, for trying conveyor's stats.

    python examples/images.py                 # a short "training" run, then loader.stats().summary()
    conveyor tune examples/images.py:dataset --step-ms 5 --workers 0,1,2,3 --seconds 2
                                              # sweep num_workers x prefetch_factor (the README's run)

The data is the demo's synthetic JPEG folder (written once under
~/.cache/conveyor): 1,000 images, so a pass is 32 batches of 32, often
shorter than what ``conveyor tune`` measures of a setting; it then runs as
many passes as it needs, keeping the workers between them. Each sample is
decoded, randomly cropped and flipped (conveyor.cli.demo.ImageFolder). The
"training step" is a sleep, standing for the time a model takes on a batch.
"""

from __future__ import annotations

import argparse
import time

from conveyor.cli.demo import ImageFolder, default_cache_dir, make_synthetic_images


def dataset() -> ImageFolder:
    """The map-style dataset (the factory ``conveyor tune`` calls)."""
    return ImageFolder(make_synthetic_images(default_cache_dir() / "synthetic-jpeg-v1"), crop=224)


def main() -> None:
    import conveyor.torch as data

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=20.0, help="the training step per batch, in ms")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    loader = data.DataLoader(
        dataset(), batch_size=32, shuffle=True, num_workers=args.workers, persistent_workers=args.workers > 0
    )
    for _ in range(args.epochs):
        for images, labels in loader:
            time.sleep(args.step_ms / 1e3)  # the model's forward and backward pass
    loader.stats().summary()


if __name__ == "__main__":
    main()
