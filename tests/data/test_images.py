"""conveyor.images: decode + RandomResizedCrop + flip straight into the batch.

What a user would notice: the crop boxes follow torchvision's
RandomResizedCrop distribution; a crop matches a full decode followed by an
antialiased resize (PSNR, on photo-like images made here); flips, layouts
and normalisation are what they say; batches are the same for any number
and kind of workers; PNG and CMYK files decode too (through Pillow).
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest

pytest.importorskip("cv2")
from PIL import Image  # noqa: E402

import conveyor  # noqa: E402
from conveyor.images import Box, ImageFolder, PendingImage, RandomResizedCrop, decoders, random_resized_crop_box  # noqa: E402
from conveyor.images.boxes import centre_fallback  # noqa: E402
from conveyor.images.geometry import plan_decode  # noqa: E402

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


# ------------------------------------------------------------------ images
def photo_like(height: int, width: int, seed: int) -> np.ndarray:
    """An RGB image with a photo's spectrum (amplitude ~ 1/frequency),
    correlated channels, a few sharp-edged discs and a little sensor noise."""
    g = np.random.default_rng(seed)
    fy, fx = np.fft.fftfreq(height)[:, None], np.fft.rfftfreq(width)[None, :]
    f = np.hypot(fy, fx)
    f[0, 0] = 1.0
    image, base = np.empty((height, width, 3), np.float64), None
    for c in range(3):
        spectrum = (g.normal(size=f.shape) + 1j * g.normal(size=f.shape)) / f
        spectrum[0, 0] = 0
        channel = np.fft.irfft2(spectrum, s=(height, width))
        channel = (channel - channel.mean()) / (channel.std() + 1e-9)
        base = channel if base is None else 0.6 * base + 0.4 * channel
        image[..., c] = 128 + 45 * base
    yy, xx = np.mgrid[0:height, 0:width]
    for _ in range(5):
        cy, cx, r = g.uniform(0, height), g.uniform(0, width), g.uniform(0.05, 0.3) * min(height, width)
        disc = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        image[disc] = image[disc] * 0.5 + g.uniform(0, 255, 3) * 0.5
    image += g.normal(0, 4, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def encode(pixels: np.ndarray, fmt: str = "JPEG", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt, **options)
    return buffer.getvalue()


def jpeg(height: int, width: int, seed: int = 0, **options) -> bytes:
    return encode(photo_like(height, width, seed), "JPEG", quality=90, **options)


def reference(data: bytes, box: Box, size: tuple[int, int]) -> np.ndarray:
    """A full-resolution decode (Pillow) and an antialiased bilinear resize of the box: torchvision's PIL path."""
    with Image.open(io.BytesIO(data)) as image:
        area = (box.left, box.top, box.left + box.width, box.top + box.height)
        return np.asarray(image.convert("RGB").resize(size[::-1], Image.Resampling.BILINEAR, box=area))


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return 10 * math.log10(255**2 / max(mse, 1e-12))


def crop_of(transform: RandomResizedCrop, data: bytes, box: Box, flip: bool = False) -> np.ndarray:
    """The transform's output for a given box (the box chosen here, not drawn)."""
    pending = transform(data)
    return np.asarray(PendingImage(data, pending.source, box, flip, pending.output))


# ------------------------------------------------------------------- boxes
def independent_boxes(height: int, width: int, n: int, seed: int) -> np.ndarray:
    """torchvision's algorithm written again, vectorised over ``n`` draws: (top, left, h, w) per row."""
    g = np.random.default_rng(seed)
    area = height * width * g.uniform(SCALE[0], SCALE[1], (n, 10))
    aspect = np.exp(g.uniform(np.log(RATIO[0]), np.log(RATIO[1]), (n, 10)))
    w, h = np.round(np.sqrt(area * aspect)).astype(int), np.round(np.sqrt(area / aspect)).astype(int)
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.argmax(axis=1)
    rows = np.arange(n)
    w, h = w[rows, first], h[rows, first]
    top = (g.random(n) * (height - h + 1)).astype(int)
    left = (g.random(n) * (width - w + 1)).astype(int)
    boxes = np.stack([top, left, h, w], axis=1)
    fallback = centre_fallback(height, width, RATIO)
    boxes[~fits.any(axis=1)] = tuple(fallback)
    return boxes


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two empirical CDFs."""
    values = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize("height,width", [(375, 500), (500, 333), (1200, 160)])
def test_the_boxes_follow_torchvisions_distribution(height, width):
    n = 20000
    rng = random.Random(1)
    ours = np.array([random_resized_crop_box(height, width, SCALE, RATIO, rng) for _ in range(n)])
    theirs = independent_boxes(height, width, n, seed=2)
    # KS at a significance of 0.001 for two samples of n: 1.95 * sqrt(2 / n).
    critical = 1.95 * math.sqrt(2 / n)
    for column, name in enumerate(("top", "left", "height", "width")):
        assert ks_statistic(ours[:, column], theirs[:, column]) < critical, name
    area = lambda b: b[:, 2] * b[:, 3] / (height * width)  # noqa: E731
    assert ks_statistic(area(ours), area(theirs)) < critical
    fallback = tuple(centre_fallback(height, width, RATIO))
    share = lambda b: np.mean(np.all(b == fallback, axis=1))  # noqa: E731
    assert abs(share(ours) - share(theirs)) < 4 * math.sqrt(max(share(theirs), 1 / n) / n) + 1e-3
    assert np.all(ours[:, 0] + ours[:, 2] <= height) and np.all(ours[:, 1] + ours[:, 3] <= width)


def test_the_centre_fallback_is_torchvisions():
    assert centre_fallback(100, 1000, RATIO) == Box(0, 433, 100, 133)  # too wide: the widest box of ratio 4/3
    assert centre_fallback(1000, 100, RATIO) == Box(433, 0, 133, 100)  # too tall
    assert centre_fallback(300, 300, RATIO) == Box(0, 0, 300, 300)  # within the ratios: the whole image
    assert random_resized_crop_box(100, 1000, (0.9, 1.0), RATIO, random.Random(0)) == Box(0, 433, 100, 133)


def test_bad_arguments_fail_at_construction():
    with pytest.raises(ValueError, match="scale"):
        RandomResizedCrop(224, scale=(0.5, 0.1))
    with pytest.raises(ValueError, match="size"):
        RandomResizedCrop(0)
    with pytest.raises(ValueError, match="flip"):
        RandomResizedCrop(224, flip=2)
    with pytest.raises(ValueError, match="layout"):
        RandomResizedCrop(224, layout="NCHW")
    with pytest.raises(ValueError, match="mean"):
        RandomResizedCrop(224, mean=(0.5, 0.5, 0.5))


# ----------------------------------------------------------------- quality
#: The stated tolerance (docs/images.md): every crop within MIN_PSNR_DB of a
#: full decode + antialiased resize, and half of them within MEDIAN_PSNR_DB.
MIN_PSNR_DB, MEDIAN_PSNR_DB = 35.0, 38.0


@pytest.mark.parametrize("height,width", [(375, 500), (333, 450), (1536, 2048)])
def test_a_crop_matches_a_full_decode_and_an_antialiased_resize(height, width):
    transform, size = RandomResizedCrop(224), (224, 224)
    scores, scales = [], set()
    for seed in range(4):
        data = jpeg(height, width, seed)
        rng = random.Random(seed)
        boxes = [random_resized_crop_box(height, width, SCALE, RATIO, rng) for _ in range(6)]
        boxes += [Box(0, 0, height, width), Box(height - 150, width - 130, 150, 130)]  # whole image; a small corner
        for box in boxes:
            scales.add(plan_decode(box, height, width, 16, 224, 224).scale)
            scores.append(psnr(crop_of(transform, data, box), reference(data, box, size)))
    assert min(scores) >= MIN_PSNR_DB, sorted(scores)[:5]
    assert float(np.median(scores)) >= MEDIAN_PSNR_DB, np.median(scores)
    if height > 1000:
        assert len(scales) >= 3  # DCT scaling was used: 1/8 .. 1/2 as well as 1


def test_pillow_decodes_what_turbojpeg_does_not_and_agrees_with_it():
    pixels = photo_like(300, 400, 5)
    box, size = Box(20, 30, 250, 300), (224, 224)
    png = encode(pixels, "PNG")
    assert RandomResizedCrop(224)(png).source.decoder == "pillow"
    assert psnr(crop_of(RandomResizedCrop(224), png, box), reference(png, box, size)) >= 40
    cmyk = io.BytesIO()
    Image.fromarray(pixels).convert("CMYK").save(cmyk, "JPEG", quality=95)
    assert RandomResizedCrop(224)(cmyk.getvalue()).source.decoder == "pillow"
    data = jpeg(300, 400, 5)
    with_pillow = crop_of(RandomResizedCrop(224, use_turbojpeg=False), data, box)
    assert psnr(with_pillow, crop_of(RandomResizedCrop(224), data, box)) >= MIN_PSNR_DB


def test_grayscale_jpegs_come_out_as_rgb():
    gray = encode(photo_like(240, 320, 3)[..., 0], "JPEG", quality=90)
    out = RandomResizedCrop(64).decode(gray)
    assert out.shape == (64, 64, 3)
    assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 1], out[..., 2])


def test_flip_layout_and_normalisation_are_what_they_say():
    data, box = jpeg(300, 400, 7), Box(10, 20, 200, 260)
    plain = crop_of(RandomResizedCrop((96, 128)), data, box)
    assert plain.shape == (96, 128, 3) and plain.dtype == np.uint8
    assert np.array_equal(crop_of(RandomResizedCrop((96, 128)), data, box, flip=True), plain[:, ::-1])
    chw = crop_of(RandomResizedCrop((96, 128), layout="CHW"), data, box)
    assert np.array_equal(chw, plain.transpose(2, 0, 1))
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    normalised = crop_of(RandomResizedCrop((96, 128), layout="CHW", mean=mean, std=std), data, box)
    expected = (plain.transpose(2, 0, 1) / 255.0 - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    assert normalised.dtype == np.float32 and np.allclose(normalised, expected, atol=1e-5)


def test_a_crop_is_drawn_with_the_samples_generators():
    transform, data = RandomResizedCrop(224), jpeg(200, 300, 1)
    first = [transform(data) for _ in range(20)]
    assert len({(p.box, p.flip) for p in first}) > 10  # outside a loader: fresh draws from the OS


# ------------------------------------------------------------------ loader
@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    for label in range(2):
        (root / f"class_{label}").mkdir()
        for i in range(12):
            height, width = (180 + 17 * i, 240 - 9 * i) if i % 2 else (240, 320)
            data = jpeg(height, width, seed=100 * label + i) if i != 5 else encode(photo_like(160, 200, i), "PNG")
            (root / f"class_{label}" / f"{i:03d}.{'png' if i == 5 else 'jpg'}").write_bytes(data)
    return str(root)


def _epoch(folder: str, **kwargs) -> list:
    dataset = ImageFolder(folder, RandomResizedCrop(64, layout="CHW"))
    loader = conveyor.DataLoader(dataset, batch_size=5, shuffle=True, seed=3, **kwargs)
    return [(images.copy(), labels.copy()) for images, labels in loader]


@pytest.mark.timeout(120)
def test_batches_are_the_same_for_any_number_and_kind_of_workers(folder):
    inline = _epoch(folder)
    assert len(inline) == 5 and inline[0][0].shape == (5, 3, 64, 64) and inline[0][0].dtype == np.uint8
    for kwargs in (
        {"num_workers": 2},
        {"num_workers": 3, "worker_method": "thread"},
        {"num_workers": 1, "reads_in_flight": 4},
    ):
        other = _epoch(folder, **kwargs)
        assert len(other) == len(inline)
        for (a, la), (b, lb) in zip(inline, other):
            assert np.array_equal(a, b) and np.array_equal(la, lb), kwargs


@pytest.mark.timeout(120)
def test_the_torch_facade_gives_uint8_tensors(folder):
    torch = pytest.importorskip("torch")
    import conveyor.torch as data

    loader = data.DataLoader(ImageFolder(folder, RandomResizedCrop(32)), batch_size=4, num_workers=2)
    images, labels = next(iter(loader))
    assert isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and tuple(images.shape) == (4, 32, 32, 3)
    assert labels.dtype == torch.int64


def test_the_libraries_in_use_are_named():
    assert decoders() == {"jpeg": "turbojpeg", "resize": "opencv"}


# -------------------------------------------------------------------- pack
@pytest.mark.timeout(120)
def test_pack_stores_large_images_smaller_and_shards_read_them_through_the_same_path(tmp_path, capsys):
    from conveyor.cli import main as cli
    from conveyor.shards import ShardDataset

    root = tmp_path / "photos"
    (root / "a").mkdir(parents=True)
    large, small = jpeg(900, 1200, 1), jpeg(240, 320, 2)
    (root / "a" / "large.jpg").write_bytes(large)
    (root / "a" / "small.jpg").write_bytes(small)
    (root / "a" / "wide.png").write_bytes(encode(photo_like(300, 800, 3), "PNG"))
    out = tmp_path / "shards"
    args = ["pack", str(root), str(out), "--max-bytes", "1M", "--max-side", "400", "--keep-original", "--workers", "1"]
    assert cli(args) == 0
    dataset = ShardDataset(out)
    samples = [dataset[i] for i in range(3)]
    (shrunk,) = [s for s in samples if s.get("orig.jpg") == large]
    with Image.open(io.BytesIO(shrunk["jpg"])) as image:
        assert image.format == "JPEG" and image.size == (400, 300)
    (wide,) = [s for s in samples if "orig.png" in s]
    with Image.open(io.BytesIO(wide["jpg"])) as image:  # (the PNG became a JPEG of 400 x 150)
        assert image.size == (400, 150)
    assert [s for s in samples if s.get("jpg") == small and "orig.jpg" not in s]  # within 400: kept as it was
    # The same crop of the stored copy and of the original (the box in each one's pixels) agree.
    transform = RandomResizedCrop(128)
    stored = crop_of(transform, shrunk["jpg"], Box(30, 40, 240, 300))
    assert psnr(stored, reference(large, Box(90, 120, 720, 900), (128, 128))) >= 30
    loader = conveyor.DataLoader(
        ShardDataset(out, transform=lambda s: (transform(s["jpg"]), s["cls"])), batch_size=3, num_workers=2
    )
    images, labels = next(iter(loader))
    assert images.shape == (3, 128, 128, 3) and list(labels) == [0, 0, 0]
    assert cli(["pack", str(root), str(tmp_path / "o2"), "--max-samples", "2", "--keep-original"]) == 2
    assert "--keep-original goes with --max-side" in capsys.readouterr().err


# ------------------------------------------------------------------ doctor
def test_doctor_points_jpeg_data_to_the_image_path_and_large_photos_to_max_side(tmp_path, capsys):
    import json

    from conveyor.cli import main as cli

    small, large = tmp_path / "small" / "a", tmp_path / "large" / "a"
    small.mkdir(parents=True)
    large.mkdir(parents=True)
    for i in range(3):
        (small / f"{i}.jpg").write_bytes(jpeg(300, 400, i))
        (large / f"{i}.jpg").write_bytes(encode(np.full((1500, 2000, 3), 90 + i, np.uint8), "JPEG", quality=90))

    def images_check(folder):
        cli(["doctor", "--data", str(folder), "--num-workers", "0", "--json"])
        return {c["name"]: c for c in json.loads(capsys.readouterr().out)}["images"]

    ok = images_check(tmp_path / "small")
    assert ok["status"] == "OK" and "conveyor.images" in ok["detail"] and "400x300" in ok["detail"]
    warned = images_check(tmp_path / "large")
    assert warned["status"] == "WARN" and "--max-side 512" in warned["fix"]
