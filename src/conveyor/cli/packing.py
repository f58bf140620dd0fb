"""Packing: a source into bounded tar shards, in parallel, resumable, and
never leaving a shard that looks finished but is not.

    SRC ──plan (sizes: a file's from stat, a sample's by encoding it)──▶ shards as sample ranges (plan.json)
        ──W processes──▶ shard k: .tar.tmp ──▶ SHA-256 ──▶ .idx.tmp (tied to the tar: size, hash)
                         ──▶ rename both ──▶ .json (its record: done)
        ──▶ manifest.json (removed first when any shard is to be written)

The same SRC and bounds give the same bytes, whatever W. A run that stops
(interrupted, a full disk, a refused permission) leaves no record for a
shard it did not finish, and no manifest, so ``--verify`` refuses the
folder; the same command again keeps each shard whose record, tar and
index agree and writes the rest. An I/O error becomes one PackFailed that
names the file and the cause; the writing processes stop taking shards.
"""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from .._engine.workers.process import die_with
from ..shards.errors import ShardError
from ..shards.index import ShardIndex, file_sha256
from ..shards.manifest import MANIFEST, shard_record
from ..shards.records import BLOCK, open_shard_writer, tar_bytes, write_sample
from .pack_sources import PackError, PackFailed, open_source

#: tarfile pads an archive to a multiple of this (20 blocks) when it closes.
_RECORD = 20 * BLOCK
_PLAN = "plan.json"
#: Links listed one by one when some were skipped; the rest are counted.
_SKIPS_LISTED = 10


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


# ----------------------------------------------------------------- errors
def _cause(exc: OSError) -> str:
    """An OSError's cause in words, and what to do about it."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{text} (free some space, then run the same command again: it keeps the shards already written)"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{text} (choose a folder you may write to, or change its permissions)"
    return f"{text} (run the same command again once it is mended: it keeps the shards already written)"


@contextmanager
def _io(doing: str, path: str) -> Iterator[None]:
    """Turn an OSError into one PackFailed naming the file (the error's own, else ``path``) and the cause."""
    try:
        yield
    except OSError as exc:
        raise PackFailed(f"cannot {doing} {exc.filename or path}: {_cause(exc)}") from None


# ---------------------------------------------------------------- writing
_source: Any = None  # (the source: inherited by forked writing processes, opened anew by spawned ones)


def _adopt(src: str, follow_links: bool, reencode: Any = None) -> None:
    global _source
    if _source is None:
        _source = open_source(src, follow_links, reencode)


def _writer_starts(parent_pid: Optional[int], src: str, follow_links: bool, reencode: Any = None) -> None:
    """Each writing process, first: it ends with ``conveyor pack`` however
    that is killed (the kernel kills it on Linux, a watch thread elsewhere;
    its pool's pipes alone never tell it, since every sibling holds them
    open), then it opens the source. ``parent_pid``: ``conveyor pack``'s
    (None under forkserver, whose server is the parent and ends with it)."""
    die_with(parent_pid)
    _adopt(src, follow_links, reencode)


def _sizes_of(i: int) -> list[int]:
    with _io("read", f"sample {i} of the source"):
        return _source.sizes(i)


def _members_of(i: int) -> list[tuple[str, bytes]]:
    with _io("read", f"sample {i} of the source"):
        return _source.members(i)


def shard_name(k: int) -> str:
    return f"shard-{k:06d}.tar"


def write_shard(job: tuple[str, int, int, int]) -> tuple[int, dict]:
    """Write shard ``k`` (samples ``start`` to ``end``) into ``out``; (k,
    its record). On any error its unfinished files are removed."""
    out, k, start, end = job
    path = os.path.join(out, shard_name(k))
    try:
        with _io("write", path):
            _remove(path + ".json")  # (a record from before no longer vouches for this shard)
            samples = []
            with open_shard_writer(path + ".tmp") as tar:
                for i in range(start, end):
                    samples.append((f"{i:09d}", write_sample(tar, f"{i:09d}", _members_of(i))))
            digest, size = file_sha256(path + ".tmp"), os.path.getsize(path + ".tmp")
            ShardIndex.build(samples, size, digest).save(path + ".idx.tmp")
            os.replace(path + ".tmp", path)
            os.replace(path + ".idx.tmp", path + ".idx")
            record = {"name": shard_name(k), "first": start, "samples": end - start, "bytes": size, "sha256": digest}
            _write_json(path + ".json", record)  # (last: a shard with a record is done)
    except BaseException:
        _remove(path + ".tmp", path + ".idx.tmp", path + ".json.tmp")
        raise
    return k, record


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(path + ".tmp", path)


#: What _read_json gives for a file that is there but cannot be read as JSON.
_UNREADABLE = object()


def _read_json(path: str) -> Any:
    """The JSON in ``path``; None when there is no such file; _UNREADABLE when it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return _UNREADABLE


def _remove(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def _finished(out: str, k: int, start: int, end: int) -> Optional[dict]:
    """Shard ``k``'s record when the shard was finished (its record, tar and
    index there and agreeing on size, hash and samples); None: write it again."""
    path = os.path.join(out, shard_name(k))
    raw = _read_json(path + ".json")
    if not isinstance(raw, dict):
        return None
    try:
        record = shard_record(raw, path + ".json", "record")
    except ShardError:
        return None
    agrees = record.name == shard_name(k) and record.first == start and record.samples == end - start
    if not agrees or not os.path.isfile(path) or os.path.getsize(path) != record.bytes:
        return None
    try:
        index = ShardIndex.load(path + ".idx")
    except (ShardError, OSError):
        return None
    tied = index.tar_bytes == record.bytes and index.tar_sha256 == record.sha256 and len(index) == record.samples
    return raw if tied else None


# ------------------------------------------------------------------- pack
def pack(
    src: str,
    out: str,
    max_samples: Optional[int],
    max_bytes: Optional[int],
    workers: int,
    start_method: Optional[str] = None,
    follow_links: bool = False,
    reencode: Any = None,
) -> dict:
    """Pack ``src`` into ``out``; the manifest. The writing processes start
    with ``start_method`` (default: fork where there is one, else spawn).
    Links out of a folder ``src`` are skipped (listed on stderr) unless
    ``follow_links``; images are stored as ``reencode`` says when given
    (``--max-side``). Raises PackError (bad input) or PackFailed (I/O)."""
    global _source
    with _io("read", src):
        _source = open_source(src, follow_links, reencode)
    _tell_skipped(_source.skipped)
    with _io("create the folder", out):
        os.makedirs(out, exist_ok=True)
    if start_method is None:
        start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(start_method)
    processes = _Processes(context, src, follow_links, reencode)
    planned = _plan(out, max_samples, max_bytes, workers, processes)
    records: dict[int, dict] = {}
    todo = []
    for k, (start, end) in enumerate(planned["shards"]):
        record = _finished(out, k, start, end)
        if record is not None:
            records[k] = record
        else:
            todo.append((out, k, start, end))
    if todo:
        with _io("remove the old manifest", os.path.join(out, MANIFEST)):
            if os.path.exists(os.path.join(out, MANIFEST)):  # (it would vouch for a folder being rewritten)
                os.unlink(os.path.join(out, MANIFEST))
        for k, record in processes.run(write_shard, todo, min(workers, len(todo))):
            records[k] = record
    manifest = {
        "format": "webdataset tar, conveyor index",
        "source": _source.description,
        "samples": len(_source),
        "classes": _source.classes,
        "shards": [records[k] for k in range(len(planned["shards"]))],
    }
    with _io("write", os.path.join(out, MANIFEST)):
        _write_json(os.path.join(out, MANIFEST), manifest)
    return manifest


def _plan(
    out: str, max_samples: Optional[int], max_bytes: Optional[int], workers: int, processes: "_Processes"
) -> dict:
    """The plan in ``out`` (a resumed run's), or a new one, written there."""
    settings = {"source": _source.description, "samples": len(_source), "max_samples": max_samples,
                "max_bytes": max_bytes}  # fmt: skip
    path = os.path.join(out, _PLAN)
    planned = _read_json(path)
    if planned is not None and not (isinstance(planned, dict) and isinstance(planned.get("shards"), list)):
        raise PackError(f"{path} is not a plan conveyor pack wrote; pack into an empty folder")
    if planned is not None and planned.get("settings") != settings:
        raise PackError(
            f"{out} holds shards packed with other settings ({planned.get('settings')}); pack into an empty folder"
        )
    if planned is None:
        if max_bytes is None:
            sizes = [[0]] * len(_source)
        else:
            sizes = list(processes.map(_sizes_of, range(len(_source)), workers))
        planned = {"settings": settings, "shards": plan_shards(sizes, max_samples, max_bytes)}
        with _io("write", path):
            _write_json(path, planned)
    return planned


class _Processes:
    """Processes that open the source themselves (or inherit it, forked) and
    run one function over many items; a failure in one stops the others
    taking more, and a process that dies is a PackFailed, not a hang."""

    def __init__(self, context: Any, src: str, follow_links: bool, reencode: Any = None):
        self.context, self.src, self.follow_links, self.reencode = context, src, follow_links, reencode

    def _pool(self, workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            workers,
            mp_context=self.context,
            initializer=_writer_starts,
            initargs=(None if self.context.get_start_method() == "forkserver" else os.getpid(), self.src, self.follow_links, self.reencode),
        )

    def map(self, function: Any, items: range, workers: int) -> list:
        pool = self._pool(workers)
        try:
            return list(pool.map(function, items, chunksize=64))
        except BrokenProcessPool:
            raise PackFailed("a process measuring samples died (killed, or out of memory?); run it again") from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def run(self, function: Any, jobs: list, workers: int) -> Iterator[Any]:
        pool = self._pool(workers)
        try:
            for done in as_completed([pool.submit(function, job) for job in jobs]):
                yield done.result()
        except BrokenProcessPool:
            raise PackFailed(
                "a process writing shards died (killed, or out of memory?); run the same command again: it keeps "
                "the shards already written"
            ) from None
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _tell_skipped(skipped: list[str]) -> None:
    if not skipped:
        return
    heading = f"conveyor pack: skipped {len(skipped)} link(s) leading out of SRC (--follow-links packs them):"
    print(heading, file=sys.stderr)
    for line in skipped[:_SKIPS_LISTED]:
        print(f"  {line}", file=sys.stderr)
    if len(skipped) > _SKIPS_LISTED:
        print(f"  ... and {len(skipped) - _SKIPS_LISTED} more", file=sys.stderr)


__all__ = ["pack", "plan_shards", "write_shard", "shard_name", "PackError", "PackFailed"]
