"""Pack a dataset into tar shards (WebDataset layout) with an index for random access; --verify checks them.

The command: its help, its arguments, and one line on stderr for any error
(``conveyor pack: error: ...``: exit 2 for bad input, 1 for a failure on
the way such as a full disk). Packing itself is in packing.py, the sources
in pack_sources.py, ``--verify`` in pack_verify.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from .factory import FactoryError
from .pack_fresh import CHECKS
from .pack_sources import PackError, PackFailed
from .pack_verify import verify
from .packing import pack

DESCRIPTION = """\
Pack a dataset into tar shards in the WebDataset layout, with an index for
random access, or check shards packed before (--verify).

SRC is a folder in the root/<class>/<file> layout (each file is a sample:
its bytes under its extension, its class number as "cls"), or
MODULE:FACTORY, a function that returns a map-style dataset (a dict
sample's keys become the extensions). OUT receives shard-000000.tar, ...,
each with its index (.idx) and record (.json), and manifest.json, which
lists every shard with its samples, size and SHA-256.

Each shard holds at most --max-samples samples and/or --max-bytes bytes.
The same SRC and bounds give the same bytes, whatever --workers. A run that
stops part way (interrupted, a full disk, killed) leaves no manifest; the
same command again keeps the shards already written and writes the rest.

Again over a packed folder, the same command compares SRC with what the
folder records of each sample (a file's path, size and modification time;
with --check full also the SHA-256 of its bytes, which finds an edit that
kept both; a MODULE:FACTORY sample's SHA-256, always) and re-packs only
the shards whose samples changed, saying what changed; if nothing did, it
says "already packed ... up to date" and writes nothing.

Several runs at once (ranks of one job, jobs on several machines sharing
the folder) take turns through OUT/pack.lock: one packs, the others say on
one line that they wait, then find the folder up to date. --no-wait
refuses at once instead (exit 1). A lock left by a killed run is taken
over: on its machine once its process has ended, from another machine once
its heartbeat (the lock's mtime, touched every 2 s) is 30 s old.

Links: a file or class folder of SRC that is a symbolic link leading out of
SRC is skipped, and listed, unless --follow-links is given. A link that
stays inside SRC is packed as the file it leads to.

Names: a file's extension (lowercased; "bin" without one) is its field
and its sample's number its key, so no other part of its name reaches a
tar. What cannot be stored exactly is refused, before any shard is
written, with one line naming it: an extension "cls", beginning with "__",
over 60 bytes or not UTF-8; a file directly in SRC; a folder inside a class
folder; a link to nothing or a loop of links; a FIFO, socket or device.

Images: --max-side N stores each image larger than N pixels on its longer
side as a JPEG at most N on a side (quality --quality, default 90), under
"jpg"; smaller ones and other members are kept as they are; --keep-original
also stores each re-encoded file as it was, under "orig.<ext>". Decoding
cost grows with the pixels stored, so large photos read far faster
(docs/images.md); ShardDataset and conveyor.images read them as any JPEG.

--verify FOLDER checks the manifest, each shard's size and SHA-256, and
each index against a fresh scan of its tar; it prints one FAIL line per
problem and exits 1 if there is any.

examples:
  conveyor pack data/train shards/train --max-bytes 1G
  conveyor pack mypkg.data:make_dataset shards/train --max-samples 10000 --workers 8
  conveyor pack photos/ shards/photos --max-bytes 1G --max-side 512
  conveyor pack --verify shards/train
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "src", metavar="SRC", help="a folder root/<class>/<file>, or MODULE:FACTORY; with --verify, the packed folder"
    )
    parser.add_argument("out", metavar="OUT", nargs="?", help="the folder to write the shards into")
    parser.add_argument("--max-samples", metavar="N", type=int, default=None, help="at most N samples per shard")
    parser.add_argument(
        "--max-bytes", metavar="SIZE", type=_bytes, default=None, help="at most SIZE bytes per shard (e.g. 256M, 1G)"
    )
    parser.add_argument(
        "--workers",
        metavar="W",
        type=int,
        default=os.cpu_count() or 1,
        help="processes writing shards at once (default: one per CPU)",
    )
    parser.add_argument(
        "--follow-links", action="store_true", help="also pack files and folders that link to places outside SRC"
    )
    parser.add_argument(
        "--max-side",
        metavar="N",
        type=int,
        default=None,
        help="store images larger than N pixels on a side as JPEGs at most N on a side",
    )
    parser.add_argument(
        "--quality", metavar="Q", type=int, default=90, help="JPEG quality of re-encoded images (default 90)"
    )
    parser.add_argument("--keep-original", action="store_true", help="with --max-side, also store each original file")
    parser.add_argument(
        "--check",
        choices=CHECKS,
        default="stat",
        help="over a packed folder, what tells a changed file: stat (path, size, mtime; default) or full (also its "
        "bytes)",
    )
    parser.add_argument("--no-wait", action="store_true", help="refuse at once when another pack is at work on OUT")
    parser.add_argument("--verify", action="store_true", help="check the packed folder SRC instead of packing")


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    text = text.strip().lower().rstrip("b")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (bytes, or with K, M, G, T)") from None


def _reencode(args: argparse.Namespace) -> Any:
    """--max-side and its companions as a conveyor.images Reencode; None without --max-side."""
    if args.max_side is None:
        if args.keep_original:
            raise PackError("--keep-original goes with --max-side N (the originals of the images re-encoded)")
        return None
    from ..images.reencode import Reencode

    try:
        return Reencode(args.max_side, args.quality, args.keep_original)
    except ValueError as exc:
        raise PackError(f"--max-side/--quality: {exc}") from None


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
        if any(value is not None and value < 1 for value in (args.max_samples, args.max_bytes, args.workers)):
            raise PackError("--max-samples, --max-bytes and --workers must be at least 1")
        started = time.perf_counter()
        bounds = (args.max_samples, args.max_bytes)
        reencode = _reencode(args)
        packed = pack(
            args.src,
            args.out,
            *bounds,
            args.workers,
            follow_links=args.follow_links,
            reencode=reencode,
            check=args.check,
            wait=not args.no_wait,
        )
    except (PackError, FactoryError) as exc:
        print(f"conveyor pack: error: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, PackFailed) else 2
    manifest, took_s = packed.manifest, time.perf_counter() - started
    shards, size = len(manifest["shards"]), sum(shard["bytes"] for shard in manifest["shards"]) / 1e6
    if packed.up_to_date:
        print(
            f"already packed: {manifest['samples']} samples in {shards} shards ({size:.1f} MB), up to date with "
            f"{args.src} (--check {args.check}, {took_s:.1f} s): {args.out}"
        )
    else:
        print(
            f"packed {manifest['samples']} samples into {shards} shards ({size:.1f} MB; {packed.written} written) "
            f"in {took_s:.1f} s: {args.out}"
        )
    return 0


__all__ = ["add_arguments", "run", "pack", "verify", "PackError", "PackFailed"]
