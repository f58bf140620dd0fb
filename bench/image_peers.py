"""One contender of bench/images.py, run in a process of its own:

    python bench/image_peers.py rate KIND ROOT BATCH       # samples/s over an epoch, after the first batch
    python bench/image_peers.py first KIND ROOT BATCH      # seconds from building the loader to its first batch
    python bench/image_peers.py ceiling LIB ROOT           # samples/s of one process decoding without a loader

Every kind does the same work: decode a JPEG, take a RandomResizedCrop box
(scale 0.08-1, ratio 3/4-4/3) resized to 224 x 224, flip half of them, and
hand uint8 224 x 224 x 3 batches to the loop; 2 workers (processes, or
threads where the library has only those).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image_data  # noqa: E402

# (imported here, before any loader starts, so that no kind's workers import it on their first batch)
from conveyor.images.boxes import random_resized_crop_box  # noqa: E402

SIZE, SCALE, RATIO, WORKERS = 224, (0.08, 1.0), (3 / 4, 4 / 3), 2


def _box(height: int, width: int, rng: random.Random):
    return random_resized_crop_box(height, width, SCALE, RATIO, rng)


def pillow_sample(path: str, rng: random.Random) -> np.ndarray:
    """torchvision's PIL path: decode, crop the box and resize it (bilinear, antialiased), flip."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        top, left, h, w = _box(image.height, image.width, rng)
        image = image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
        if rng.random() < 0.5:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(image)


class PillowFolder:
    """The Pillow pipeline as a map-style dataset (torch and conveyor today);
    draws from ``random``, which both seed per worker or batch."""

    def __init__(self, root: str):
        self.samples = image_data.files(Path(root))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return pillow_sample(path, random), label


# ------------------------------------------------------------------ loaders
def _torch(root: str, batch: int):
    import torch.utils.data as tud

    return tud.DataLoader(PillowFolder(root), batch_size=batch, shuffle=True, num_workers=WORKERS)


def _conveyor_pillow(root: str, batch: int):
    import conveyor.torch as ct

    return ct.DataLoader(PillowFolder(root), batch_size=batch, shuffle=True, num_workers=WORKERS)


def _conveyor_images(root: str, batch: int):
    import conveyor.torch as ct
    from conveyor.images import ImageFolder, RandomResizedCrop

    return ct.DataLoader(
        ImageFolder(root, RandomResizedCrop(SIZE)), batch_size=batch, shuffle=True, num_workers=WORKERS
    )


def _conveyor_images_packed(root: str, batch: int):
    """conveyor.images over shards packed with --max-side 512 (made once, beside the files)."""
    import conveyor.torch as ct
    from conveyor.cli import main as cli
    from conveyor.images import RandomResizedCrop
    from conveyor.shards import ShardDataset

    shards = Path(root).parent / (Path(root).name + "-max-side-512")
    if not (shards / "manifest.json").exists():
        assert cli(["pack", root, str(shards), "--max-bytes", "256M", "--max-side", "512"]) == 0
    crop = RandomResizedCrop(SIZE)
    dataset = ShardDataset(str(shards), transform=lambda s: (crop(s["jpg"]), s["cls"]))
    return ct.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=WORKERS)


def _dali(root: str, batch: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=WORKERS, device_id=None, prefetch_queue_depth=2)
    def pipeline():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="reader")
        images = fn.decoders.image_random_crop(
            jpegs,
            device="cpu",
            output_type=types.RGB,
            random_area=list(SCALE),
            random_aspect_ratio=list(RATIO),
            num_attempts=10,
        )
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE, antialias=True)
        images = fn.flip(images, horizontal=fn.random.coin_flip())
        return images, labels

    pipe = pipeline()
    pipe.build()
    epoch = pipe.epoch_size("reader")

    def batches():
        for _ in range(-(-epoch // batch)):
            images, labels = pipe.run()
            yield images.as_array(), labels.as_array()

    return batches()


def _ffcv(root: str, batch: int):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip
    from ffcv.writer import DatasetWriter

    beton = Path(root) / "ffcv.beton"
    if not beton.exists():  # FFCV stores each image re-encoded at quality 90 (as the files are)
        from PIL import Image

        class Decoded:
            samples = image_data.files(Path(root))

            def __len__(self):
                return len(self.samples)

            def __getitem__(self, i):
                path, label = self.samples[i]
                with Image.open(path) as image:
                    return np.asarray(image.convert("RGB")), label

        fields = {"image": RGBImageField(write_mode="jpg", jpeg_quality=90), "label": IntField()}
        DatasetWriter(str(beton) + ".tmp", fields, num_workers=WORKERS).from_indexed_dataset(Decoded())
        Path(str(beton) + ".tmp").rename(beton)
    pipelines = {
        "image": [RandomResizedCropRGBImageDecoder((SIZE, SIZE)), RandomHorizontalFlip()],
        "label": [IntDecoder()],
    }
    return Loader(
        str(beton), batch_size=batch, num_workers=WORKERS, order=OrderOption.RANDOM, os_cache=True, pipelines=pipelines
    )


class _Spdl:
    """spdl's thread pipeline: the Pillow pipeline (or, with ``decode="images"``,
    conveyor.images' decode) in 2 threads, batches of ``batch``."""

    def __init__(self, root: str, batch: int, decode: str = "pillow"):
        from spdl.pipeline import PipelineBuilder

        samples = image_data.files(Path(root))
        order = list(range(len(samples)))
        random.shuffle(order)
        if decode == "images":
            from conveyor.images import RandomResizedCrop

            crop = RandomResizedCrop(SIZE)

            def load(i):
                path, label = samples[i]
                return crop.decode(Path(path).read_bytes()), label

        else:

            def load(i):
                path, label = samples[i]
                return pillow_sample(path, random.Random(i)), label

        def collate(items):
            return np.stack([image for image, _ in items]), np.array([label for _, label in items])

        builder = PipelineBuilder().add_source(order).pipe(load, concurrency=WORKERS).aggregate(batch).pipe(collate)
        self.pipeline = builder.add_sink(2).build(num_threads=WORKERS)

    def __iter__(self):
        with self.pipeline.auto_stop():
            yield from self.pipeline


LOADERS = {
    "torch": _torch,
    "conveyor_pillow": _conveyor_pillow,
    "conveyor_images": _conveyor_images,
    "conveyor_images_packed": _conveyor_images_packed,
    "dali_cpu": _dali,
    "ffcv": _ffcv,
    "spdl": _Spdl,
    "spdl_images": lambda root, batch: _Spdl(root, batch, "images"),
}


def _count(batch) -> int:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    first = batch[0]
    return len(first)


def rate(kind: str, root: str, batch: int) -> float:
    """Samples per second over one epoch, after the first batch (a warm-up
    epoch first for FFCV: it compiles with numba)."""
    if kind == "ffcv":
        for _ in LOADERS[kind](root, batch):
            pass
    it = iter(LOADERS[kind](root, batch))
    next(it)
    start, samples = time.perf_counter(), 0
    for batch_ in it:
        samples += _count(batch_)
    return samples / (time.perf_counter() - start)


#: What each kind imports, done before the clock starts (a training script has them loaded).
_IMPORTS = {
    "torch": ("torch.utils.data",),
    "conveyor_pillow": ("conveyor.torch",),
    "conveyor_images": ("conveyor.torch", "conveyor.images", "cv2"),
    "spdl": ("spdl.pipeline", "torch"),
    "spdl_images": ("spdl.pipeline", "torch", "conveyor.images", "cv2"),
    "dali_cpu": ("nvidia.dali",),
    "ffcv": ("ffcv.loader",),
}


def first(kind: str, root: str, batch: int, repeats: int = 5) -> float:
    """Seconds from building the loader to holding its first batch, in a
    process that has built one before (its modules imported, the libraries'
    first-call costs paid, the files in the page cache): the median of
    ``repeats``, each loader dropped before the next."""
    import gc
    import statistics

    def once() -> float:
        start = time.perf_counter()
        it = iter(LOADERS[kind](root, batch))
        next(it)
        elapsed = time.perf_counter() - start
        del it
        gc.collect()
        return elapsed

    once()  # (imports and first-call costs: a training script has paid them)
    if kind == "ffcv":  # (seconds per loader, where the others take milliseconds: one is enough)
        repeats = 1
    return statistics.median(once() for _ in range(repeats))


# ----------------------------------------------------------------- ceilings
def _decode_crop(lib: str):
    """One sample of the pipeline done with ``lib`` alone: (path, rng) -> uint8 224x224x3."""
    if lib == "pillow":
        return pillow_sample
    import cv2

    cv2.setNumThreads(1)

    def finish(pixels: np.ndarray, rng: random.Random) -> np.ndarray:
        top, left, h, w = _box(pixels.shape[0], pixels.shape[1], rng)
        out = cv2.resize(pixels[top : top + h, left : left + w], (SIZE, SIZE), interpolation=cv2.INTER_AREA)
        return cv2.flip(out, 1) if rng.random() < 0.5 else out

    if lib == "opencv":
        return lambda path, rng: finish(cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB), rng)
    if lib == "simplejpeg":
        import simplejpeg

        return lambda path, rng: finish(simplejpeg.decode_jpeg(Path(path).read_bytes(), "RGB"), rng)
    if lib == "conveyor_images":
        from conveyor.images import RandomResizedCrop

        crop = RandomResizedCrop(SIZE)
        return lambda path, rng: crop.decode(Path(path).read_bytes())
    raise ValueError(lib)


def ceiling(lib: str, root: str, samples: int = 300) -> float:
    """Samples per second of one process doing the pipeline with ``lib``, no loader (files in the page cache)."""
    fn = _decode_crop(lib)
    paths = [path for path, _ in image_data.files(Path(root))]
    order = random.Random(0).sample(paths, min(samples, len(paths)))
    rng = random.Random(1)
    fn(order[0], rng)
    start = time.perf_counter()
    for path in order:
        fn(path, rng)
    return len(order) / (time.perf_counter() - start)


if __name__ == "__main__":
    what, kind, root = sys.argv[1:4]
    if what == "ceiling":
        print(ceiling(kind, root))
    else:
        batch = int(sys.argv[4])
        print((rate if what == "rate" else first)(kind, root, batch))
