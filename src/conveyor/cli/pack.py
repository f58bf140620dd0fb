"""Pack a dataset into tar shards (WebDataset layout) with an index for random access.

``conveyor pack SRC OUT [--max-samples N] [--max-bytes B] [--workers W]``
packs SRC, a folder in the ``root/<class>/<file>`` layout or a map-style
dataset given as ``MODULE:FACTORY``, into ``OUT/shard-000000.tar`` ...,
each bounded by sample count and/or size. Beside each shard: its index
(``.idx``, where every sample lies) and its record (``.json``: samples,
bytes, SHA-256); ``manifest.json`` lists them all at the end.

    SRC ──plan (sizes: a file's from stat, a sample's by encoding it)──▶ shards as sample ranges
        ──W processes──▶ shard k: .tar.tmp ──▶ .idx ──▶ rename to .tar ──▶ .json (its record: done)
        ──▶ manifest.json

The same SRC and bounds give the same bytes, whatever W. An interrupted
run picks up where it stopped: shards with a record are kept, the rest are
written again. ``conveyor pack --verify OUT`` checks every shard and index
against the manifest and the tar (pack_verify.py) and exits 1 naming every
problem.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

from ..shards.index import ShardIndex, file_sha256
from ..shards.manifest import MANIFEST
from ..shards.records import BLOCK, encode_sample, open_shard_writer, tar_bytes, write_sample
from .factory import FactoryError, load_factory
from .pack_verify import verify

#: tarfile pads an archive to a multiple of this (20 blocks) when it closes.
_RECORD = 20 * BLOCK
_PLAN = "plan.json"


class PackError(Exception):
    """A source, bound or folder that cannot be packed: printed without traceback, exit status 2."""


# ----------------------------------------------------------------- sources
class FolderSource:
    """``root/<class>/<file>``: sample ``i`` is the file's bytes under its
    extension, and its class number as ``cls``."""

    def __init__(self, root: str):
        base = Path(root)
        self.classes = sorted(p.name for p in base.iterdir() if p.is_dir())
        if not self.classes:
            raise PackError(f"{root} has no class folders; expected {root}/<class>/<file>")
        self.files = [
            (str(path), label)
            for label, name in enumerate(self.classes)
            for path in sorted((base / name).iterdir())
            if path.is_file()
        ]
        if not self.files:
            raise PackError(f"no files under {root}/<class>/")
        self.description = f"folder {os.path.abspath(root)}"

    def __len__(self) -> int:
        return len(self.files)

    def members(self, i: int) -> list[tuple[str, bytes]]:
        path, label = self.files[i]
        with open(path, "rb") as f:
            data = f.read()
        return [(Path(path).suffix.lower().lstrip(".") or "bin", data), ("cls", str(label).encode())]

    def sizes(self, i: int) -> list[int]:
        path, label = self.files[i]
        return [os.path.getsize(path), len(str(label))]


class DatasetSource:
    """A map-style dataset from ``MODULE:FACTORY``: sample ``i`` encoded by
    records.encode_sample (a dict's keys are the extensions)."""

    def __init__(self, spec: str):
        dataset = load_factory(spec, "a map-style dataset")()
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise PackError(f"{spec} returned a {type(dataset).__name__}; conveyor pack needs a map-style dataset (len and [])")
        self.dataset, self.classes, self.description = dataset, None, f"factory {spec}"

    def __len__(self) -> int:
        return len(self.dataset)

    def members(self, i: int) -> list[tuple[str, bytes]]:
        return encode_sample(self.dataset[i])

    def sizes(self, i: int) -> list[int]:
        return [len(data) for _, data in self.members(i)]


def open_source(src: str) -> Any:
    if os.path.isdir(src):
        return FolderSource(src)
    if ":" in src:
        return DatasetSource(src)
    raise PackError(f"{src} is neither a folder nor MODULE:FACTORY")


# -------------------------------------------------------------------- plan
def plan_shards(sizes: list[list[int]], max_samples: Optional[int], max_bytes: Optional[int]) -> list[tuple[int, int]]:
    """Sample ranges [start, end), in order, each within both bounds (a
    sample bigger than ``max_bytes`` gets a shard of its own)."""
    ranges, start, held = [], 0, 0  # held: the shard's members so far, as tar bytes
    for i, sample in enumerate(sizes):
        adding = tar_bytes(sample)
        full = max_samples is not None and i - start >= max_samples
        if i > start and (full or (max_bytes is not None and _on_disk(held + adding) > max_bytes)):
            ranges.append((start, i))
            start, held = i, 0
        held += adding
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


def _on_disk(member_bytes: int) -> int:
    """A shard's size on disk from its members' tar bytes: the end-of-archive blocks, the padding to a record."""
    return -(-(member_bytes + 2 * BLOCK) // _RECORD) * _RECORD


# ------------------------------------------------------------------ writing
_source: Any = None  # (the source: inherited by forked writing processes, opened anew by spawned ones)


def _adopt(src: str) -> None:
    global _source
    if _source is None:
        _source = open_source(src)


def _sizes_of(i: int) -> list[int]:
    return _source.sizes(i)


def shard_name(k: int) -> str:
    return f"shard-{k:06d}.tar"


def write_shard(job: tuple[str, int, int, int]) -> tuple[int, dict]:
    """Write shard ``k`` (samples ``start`` to ``end``) into ``out``; (k, its record)."""
    out, k, start, end = job
    path = os.path.join(out, shard_name(k))
    samples = []
    with open_shard_writer(path + ".tmp") as tar:
        for i in range(start, end):
            samples.append((f"{i:09d}", write_sample(tar, f"{i:09d}", _source.members(i))))
    digest, size = file_sha256(path + ".tmp"), os.path.getsize(path + ".tmp")
    ShardIndex.build(samples, size, digest).save(path + ".idx.tmp")  # (tied to its tar: size and hash)
    os.replace(path + ".tmp", path)
    os.replace(path + ".idx.tmp", path + ".idx")
    record = {"name": shard_name(k), "first": start, "samples": end - start, "bytes": size, "sha256": digest}
    _write_json(path + ".json", record)  # (last: a shard with a record is done)
    return k, record


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


def _read_json(path: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def pack(
    src: str, out: str, max_samples: Optional[int], max_bytes: Optional[int], workers: int, start_method: Optional[str] = None
) -> dict:
    """Pack ``src`` into ``out``; the manifest. The writing processes start
    with ``start_method`` (default: fork where there is one, else spawn)."""
    global _source
    _source = open_source(src)
    os.makedirs(out, exist_ok=True)
    if start_method is None:
        start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(start_method)
    settings = {"source": _source.description, "samples": len(_source), "max_samples": max_samples, "max_bytes": max_bytes}
    planned = _read_json(os.path.join(out, _PLAN))
    if planned is not None and planned.get("settings") != settings:
        raise PackError(
            f"{out} holds shards packed with other settings ({planned.get('settings')}); pack into an empty folder"
        )
    if planned is None:
        if max_bytes is None:
            sizes = [[0]] * len(_source)
        else:
            with context.Pool(workers, _adopt, (src,)) as pool:
                sizes = pool.map(_sizes_of, range(len(_source)), chunksize=64)
        planned = {"settings": settings, "shards": plan_shards(sizes, max_samples, max_bytes)}
        _write_json(os.path.join(out, _PLAN), planned)
    records = {}
    todo = []
    for k, (start, end) in enumerate(planned["shards"]):
        record = _read_json(os.path.join(out, shard_name(k) + ".json"))
        if record is not None and os.path.exists(os.path.join(out, shard_name(k))):
            records[k] = record
        else:
            todo.append((out, k, start, end))
    if todo:
        with context.Pool(min(workers, len(todo)), _adopt, (src,)) as pool:
            for k, record in pool.imap_unordered(write_shard, todo):
                records[k] = record
    manifest = {
        "format": "webdataset tar, conveyor index",
        "source": _source.description,
        "samples": len(_source),
        "classes": _source.classes,
        "shards": [records[k] for k in range(len(planned["shards"]))],
    }
    _write_json(os.path.join(out, MANIFEST), manifest)
    return manifest


# --------------------------------------------------------------- command
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="a folder root/<class>/<file>, or MODULE:FACTORY (a map-style dataset)")
    parser.add_argument("out", metavar="OUT", nargs="?", help="the folder to write the shards into")
    parser.add_argument("--max-samples", type=int, default=None, help="at most this many samples per shard")
    parser.add_argument("--max-bytes", type=_bytes, default=None, help="at most this size per shard (e.g. 1G, 256M)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing shards")
    parser.add_argument("--verify", action="store_true", help="check the shards in SRC against their manifest")


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower().rstrip("b")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with K, M, G, T)") from None


def run(args: argparse.Namespace) -> int:
    if args.verify:
        problems = verify(args.src)
        for line in problems:
            print(f"FAIL {line}")
        if not problems:
            print(f"OK   {args.src}: every shard and index matches its manifest and its tar")
        return 1 if problems else 0
    try:
        if args.out is None:
            raise PackError("give OUT, the folder to write the shards into (or --verify to check SRC)")
        if args.max_samples is None and args.max_bytes is None:
            raise PackError("give --max-samples and/or --max-bytes, the bound of each shard")
        if (args.max_samples is not None and args.max_samples < 1) or (args.max_bytes is not None and args.max_bytes < 1) or args.workers < 1:
            raise PackError("--max-samples, --max-bytes and --workers must be at least 1")
        started = time.perf_counter()
        manifest = pack(args.src, args.out, args.max_samples, args.max_bytes, args.workers)
    except (PackError, FactoryError) as exc:
        print(f"conveyor pack: error: {exc}", file=sys.stderr)
        return 2
    size = sum(shard["bytes"] for shard in manifest["shards"])
    print(
        f"packed {manifest['samples']} samples into {len(manifest['shards'])} shards "
        f"({size / 1e6:.1f} MB) in {time.perf_counter() - started:.1f} s: {args.out}"
    )
    return 0
