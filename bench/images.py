"""The image pipeline side by side: conveyor.images against torch + Pillow,
conveyor with Pillow (today's way), NVIDIA DALI's CPU pipeline and FFCV, in
one run on the same cores.

    bash bench/images_env.sh                       # once: bench/.venv-images (DALI, FFCV, spdl, ...)
    bench/.venv-images/bin/python bench/images.py --json > bench/results-images.json

Workload: decode a JPEG, RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3),
flip half, uint8 224 x 224 x 3 batches, 2 workers (processes, or the
library's threads), shuffled; samples/s over an epoch after the first batch
(FFCV after a warm-up epoch: it compiles). Two sets of files
(bench/image_data.py): 1,000 ImageNet-sized JPEGs (400-500 x 300-400,
quality 90) and 256 large photos (2,000-3,000 px; 16 batches an epoch, so
that an epoch's start and end are a small part of it), these also packed with
``conveyor pack --max-side 512`` and read through ShardDataset by
conveyor.images (against torch on the files). Each contender runs in a
process of its own; in each round the contenders take turns (the order
reversed every other round), and the report gives medians, every round,
and ratios to torch + Pillow, to FFCV and to DALI. The ceiling of each
decode library: twice the rate of one process doing the same work with it,
no loader. First batch: seconds from building the loader to its first
batch, 2 workers, ImageNet-sized files, in a process that has built one
before (median of 5), conveyor against torch, spdl's thread pipeline
(with Pillow, and with conveyor.images' decode: the same work per sample),
DALI's CPU pipeline and FFCV (one after its warm-up: it takes seconds).
The load average before and after says how busy the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import image_data  # noqa: E402

RATE_KINDS = ("torch", "conveyor_pillow", "conveyor_images", "dali_cpu", "ffcv")
FIRST_KINDS = ("torch", "conveyor_pillow", "conveyor_images", "spdl", "spdl_images", "dali_cpu", "ffcv")
#: PyTurboJPEG is left out: it needs a system libturbojpeg 3 (Debian 12 has 2.1), and its module
#: name (turbojpeg) is the one the turbojpeg wheel, which conveyor[images] installs, takes.
CEILING_LIBS = ("pillow", "opencv", "simplejpeg", "conveyor_images")
#: Large photos: 16 batches of 16 an epoch (with 4, as before 2026-12-01, one epoch after its first
#: batch was 3 batches on 2 workers, and the epoch's start and end weighed as much as its middle).
LARGE_FILES = 256
SIMD_PYTHON = HERE / ".venv-pillow-simd" / "bin" / "python"


def _run(*args: str, python: str = sys.executable, timeout: int = 900) -> float:
    out = subprocess.run([python, str(HERE / "image_peers.py"), *args], capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def _rounds(measure, kinds: tuple, rounds: int) -> dict:
    """``measure(kind)`` for every kind, ``rounds`` times, taking turns (reversed every other round)."""
    samples: dict = {kind: [] for kind in kinds}
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            try:
                samples[kind].append(measure(kind))
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"images.py: {kind}: {exc}", file=sys.stderr)
    return samples


def _summary(samples: dict, digits: int = 1) -> dict:
    medians = {k: round(statistics.median(v), digits) for k, v in samples.items() if v}
    return {"median": medians, "samples": {k: [round(x, 4) for x in v] for k, v in samples.items()}}


def _ratios(medians: dict, kind: str) -> dict:
    mine = medians.get(kind)
    return {
        f"{kind}_vs_{other}": round(mine / medians[other], 3)
        for other in medians
        if other != kind and mine and medians.get(other)
    }


def rates(root: Path, batch: int, rounds: int) -> dict:
    result = _summary(_rounds(lambda kind: _run("rate", kind, str(root), str(batch)), RATE_KINDS, rounds))
    result["ratios"] = _ratios(result["median"], "conveyor_images")
    return result


def ceilings(root: Path, rounds: int) -> dict:
    """Twice one process's rate with each decode library (Pillow-SIMD from its own environment)."""
    libs = CEILING_LIBS + (("pillow_simd",) if SIMD_PYTHON.exists() else ())

    def measure(lib: str) -> float:
        if lib == "pillow_simd":
            return 2 * _run("ceiling", "pillow", str(root), python=str(SIMD_PYTHON))
        return 2 * _run("ceiling", lib, str(root))

    return _summary(_rounds(measure, libs, rounds))


def first_batch(root: Path, batch: int, rounds: int) -> dict:
    result = _summary(_rounds(lambda kind: _run("first", kind, str(root), str(batch)), FIRST_KINDS, rounds), 4)
    medians = result["median"]
    result["ratios"] = {
        f"{kind}_vs_{other}": round(medians[kind] / medians[other], 3)
        for kind in ("conveyor_images", "conveyor_pillow")
        for other in ("spdl", "spdl_images", "torch", "dali_cpu", "ffcv")
        if medians.get(kind) and medians.get(other)
    }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per measurement (default 5)")
    parser.add_argument("--only", default="imagenet,large,packed,ceilings,first", help="comma-separated parts to run")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    only = set(args.only.split(","))
    imagenet, large = image_data.imagenet_sized(), image_data.large_photos(LARGE_FILES)
    for path in list(imagenet.rglob("*.jpg")) + list(large.rglob("*.jpg")):
        path.read_bytes()  # (every contender then reads from the page cache)
    import numpy

    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": numpy.__version__,
            "platform": platform.platform(),
            "load_before": os.getloadavg(),
        },
        "workload": "JPEG decode + RandomResizedCrop(224, scale 0.08-1, ratio 3/4-4/3) + flip, uint8 224x224x3, "
        "2 workers, shuffled, samples/s after the first batch",
        "rounds": args.rounds,
    }
    if "imagenet" in only:
        report["imagenet_sized"] = {"files": 1000, "batch": 32, **rates(imagenet, 32, args.rounds)}
    if "large" in only:
        report["large_photos"] = {"files": LARGE_FILES, "batch": 16, **rates(large, 16, args.rounds)}
    if (
        "packed" in only
    ):  # large photos stored at most 512 px (conveyor pack --max-side 512), against torch on the files
        kinds = ("torch", "conveyor_images_packed")
        packed = _summary(_rounds(lambda kind: _run("rate", kind, str(large), "16"), kinds, args.rounds))
        report["large_photos_packed"] = {"files": LARGE_FILES, "batch": 16, "max_side": 512, **packed}
    if "ceilings" in only:
        report["ceilings_imagenet_sized"] = ceilings(imagenet, args.rounds)
        report["ceilings_large_photos"] = ceilings(large, max(1, args.rounds // 2))
    if "first" in only:
        report["first_batch_s"] = {"batch": 32, **first_batch(imagenet, 32, 2 * args.rounds)}
    report["machine"]["load_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for part, value in report.items():
            if isinstance(value, dict) and "median" in value:
                print(f"{part}: {value['median']} {value.get('ratios', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
