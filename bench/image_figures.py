"""The figures docs/images.md and the README quote from
bench/results-images.json (bench/images.py), each a function of that
file's data; bench/docs_figures.py writes them between ``images:`` markers."""

from __future__ import annotations

from typing import Callable

from figures import count, seconds, times

_NAMES = {
    "torch": "torch.utils.data + Pillow",
    "conveyor_pillow": "conveyor + Pillow (today's way)",
    "conveyor_images": "conveyor.images",
    "dali_cpu": "NVIDIA DALI 2.4, CPU pipeline",
    "ffcv": "FFCV 1.0.2",
    "spdl": "spdl 0.8, thread pipeline + Pillow",
    "spdl_images": "spdl 0.8, thread pipeline + conveyor.images' decode",
}
_LIBS = {
    "pillow": "Pillow 13 (decode, crop+resize antialiased)",
    "pillow_simd": "Pillow-SIMD 12.1",
    "opencv": "OpenCV imread + INTER_AREA resize",
    "simplejpeg": "simplejpeg + OpenCV INTER_AREA resize",
    "conveyor_images": "conveyor.images (TurboJPEG region, DCT scaling, OpenCV)",
}


def speed_table(data: dict) -> str:
    """Each loader on both sets of files: median samples/s and the ratio to torch + Pillow."""
    small, large = data["imagenet_sized"]["median"], data["large_photos"]["median"]
    rows = [
        "| loader (2 workers) | ImageNet-sized, samples/s | × torch | large photos, samples/s | × torch |",
        "|---|---|---|---|---|",
    ]
    for kind, name in _NAMES.items():
        if kind in small:
            rows.append(
                f"| {name} | {count(small[kind])} | {times(small[kind] / small['torch'])} | "
                f"{count(large[kind]) if kind in large else '-'} | "
                f"{times(large[kind] / large['torch']) if kind in large else '-'} |"
            )
    return "\n".join(rows)


def ceiling_table(data: dict) -> str:
    """Twice one process's rate with each decode library, no loader."""
    small, large = data["ceilings_imagenet_sized"]["median"], data["ceilings_large_photos"]["median"]
    rows = [
        "| decode library, one process × 2 | ImageNet-sized, samples/s | large photos, samples/s |",
        "|---|---|---|",
    ]
    for lib, name in _LIBS.items():
        if lib in small:
            rows.append(f"| {name} | {count(small[lib])} | {count(large[lib]) if lib in large else '-'} |")
    return "\n".join(rows)


def first_table(data: dict) -> str:
    first = data["first_batch_s"]["median"]
    rows = ["| loader (2 workers) | seconds to the first batch |", "|---|---|"]
    rows += [f"| {name} | {seconds(first[kind], 3)} |" for kind, name in _NAMES.items() if kind in first]
    return "\n".join(rows)


def _ratio(part: str, other: str) -> Callable[[dict], str]:
    return lambda d: times(d[part]["median"]["conveyor_images"] / d[part]["median"][other])


IMAGES: dict[str, Callable[[dict], str]] = {
    "table.speed": speed_table,
    "table.ceilings": ceiling_table,
    "table.first": first_table,
    "rounds": lambda d: str(d["rounds"]),
    "load": lambda d: f"{d['machine']['load_before'][0]:.1f} before, {d['machine']['load_after'][0]:.1f} after",
    "imagenet.vs_torch": _ratio("imagenet_sized", "torch"),
    "imagenet.vs_ffcv": _ratio("imagenet_sized", "ffcv"),
    "imagenet.vs_dali": _ratio("imagenet_sized", "dali_cpu"),
    "large.vs_torch": _ratio("large_photos", "torch"),
    "large.vs_dali": _ratio("large_photos", "dali_cpu"),
    "packed.vs_torch": lambda d: times(
        d["large_photos_packed"]["median"]["conveyor_images_packed"] / d["large_photos_packed"]["median"]["torch"]
    ),
    "previous.load": lambda d: f"{d['previous_run']['machine']['load_before'][0]:.1f}",
    "previous.imagenet.vs_torch": lambda d: _ratio("imagenet_sized", "torch")(d["previous_run"]),
    "previous.imagenet.vs_ffcv": lambda d: _ratio("imagenet_sized", "ffcv")(d["previous_run"]),
    "previous.imagenet.vs_dali": lambda d: _ratio("imagenet_sized", "dali_cpu")(d["previous_run"]),
    "previous.large.vs_torch": lambda d: _ratio("large_photos", "torch")(d["previous_run"]),
    "previous.first.vs_spdl": lambda d: times(
        d["previous_run"]["first_batch_s"]["median"]["conveyor_images"]
        / d["previous_run"]["first_batch_s"]["median"]["spdl"]
    ),
    "previous.first.vs_dali": lambda d: times(
        d["previous_run"]["first_batch_s"]["median"]["conveyor_images"]
        / d["previous_run"]["first_batch_s"]["median"]["dali_cpu"]
    ),
    "previous.first.conveyor": lambda d: seconds(d["previous_run"]["first_batch_s"]["median"]["conveyor_images"], 3),
    "first.conveyor": lambda d: seconds(d["first_batch_s"]["median"]["conveyor_images"], 3),
    "ceiling.imagenet.vs_pillow": lambda d: times(
        d["ceilings_imagenet_sized"]["median"]["conveyor_images"] / d["ceilings_imagenet_sized"]["median"]["pillow"]
    ),
    "ceiling.large.vs_pillow": lambda d: times(
        d["ceilings_large_photos"]["median"]["conveyor_images"] / d["ceilings_large_photos"]["median"]["pillow"]
    ),
    "first.vs_spdl": lambda d: times(
        d["first_batch_s"]["median"]["conveyor_images"] / d["first_batch_s"]["median"]["spdl"]
    ),
    "first.vs_dali": lambda d: times(
        d["first_batch_s"]["median"]["conveyor_images"] / d["first_batch_s"]["median"]["dali_cpu"]
    ),
    "first.vs_ffcv": lambda d: times(
        d["first_batch_s"]["median"]["conveyor_images"] / d["first_batch_s"]["median"]["ffcv"]
    ),
    "first.vs_spdl_images": lambda d: times(
        d["first_batch_s"]["median"]["conveyor_images"] / d["first_batch_s"]["median"]["spdl_images"]
    ),
}
