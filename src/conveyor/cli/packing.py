"""Packing: a source into bounded tar shards, in parallel, resumable, one
run at a time per folder, and never leaving a shard that looks finished
but is not, or one that no longer holds its source.

    OUT/pack.lock (pack_lock.py: waits for, or refuses, another run; takes over a dead one's)
    SRC ──survey (sizes for --max-bytes; over an earlier pack, each sample's fingerprint: pack_fresh.py)
        ──▶ shards as sample ranges (plan.json) ──▶ keep each shard finished and current, write the rest:
        ──W processes──▶ shard k: .tar.<run>.tmp ──▶ SHA-256 ──▶ .idx.<run>.tmp (tied to the tar: size, hash)
                         ──▶ rename both ──▶ .json (its record, with its samples' fingerprints: done)
        ──▶ manifest.json (removed first when any shard is to be written; written by the lock's holder, last)

The same SRC and bounds give the same bytes, whatever W, and a re-pack
after the source changed gives the bytes a first pack of it would. A run
that stops (interrupted, a full disk, a refused permission, killed) leaves
no record for a shard it did not finish, and no manifest, so ``--verify``
refuses the folder; the same command again keeps each shard whose record,
tar and index agree and whose samples match the source, and writes the
rest. Files are written under names of their run's own (``<run>``, its
lock's token) and renamed into place, so no two runs ever write one file.
An I/O error becomes one PackFailed that names the file and the cause; the
writing processes stop taking shards.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .._engine.workers.process import die_with
from ..shards.index import ShardIndex, file_sha256
from ..shards.manifest import MANIFEST
from ..shards.records import BLOCK, open_shard_writer, tar_bytes, write_sample
from .pack_folder import (
    PLAN,
    earlier_plan,
    extra_shards,
    finished,
    io_step,
    read_json,
    recorded,
    remove,
    shard_name,
    tidy,
    write_json,
)
from .pack_fresh import news, shard_is_current, survey_sample, written_print
from .pack_lock import PackLock
from .pack_sources import PackError, PackFailed, open_source

#: tarfile pads an archive to a multiple of this (20 blocks) when it closes.
_RECORD = 20 * BLOCK
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


def _members_of(i: int) -> tuple[list[tuple[str, bytes]], dict]:
    """Sample ``i``'s members, and the fingerprint its shard's record keeps (its identity read first)."""
    with io_step("read", f"sample {i} of the source"):
        identity = _source.identity(i)
        members = _source.members(i)
    return members, written_print(members, identity)


def _survey_of(i: int, sizes: bool, prints: bool, full: bool) -> tuple[Optional[list], Optional[dict]]:
    with io_step("read", f"sample {i} of the source"):
        return survey_sample(_source, i, sizes, prints, full)


@dataclass(frozen=True)
class ShardJob:
    """Write shard ``k`` (samples ``start`` to ``end``) into ``out``, its files first under names of ``run``'s."""

    out: str
    k: int
    start: int
    end: int
    run: str


def write_shard(job: ShardJob) -> tuple[int, dict]:
    """Write the shard of ``job``; (k, its record). On any error its unfinished files are removed."""
    path = os.path.join(job.out, shard_name(job.k))
    tar_tmp, idx_tmp = f"{path}.{job.run}.tmp", f"{path}.idx.{job.run}.tmp"
    try:
        with io_step("write", path):
            remove(path + ".json")  # (a record from before no longer vouches for this shard)
            samples, prints = [], []
            with open_shard_writer(tar_tmp) as tar:
                for i in range(job.start, job.end):
                    members, fingerprint = _members_of(i)
                    samples.append((f"{i:09d}", write_sample(tar, f"{i:09d}", members)))
                    prints.append(fingerprint)
            digest, size = file_sha256(tar_tmp), os.path.getsize(tar_tmp)
            ShardIndex.build(samples, size, digest).save(idx_tmp)
            os.replace(tar_tmp, path)
            os.replace(idx_tmp, path + ".idx")
            record = {
                "name": shard_name(job.k),
                "first": job.start,
                "samples": job.end - job.start,
                "bytes": size,
                "sha256": digest,
            }
            write_json(path + ".json", {**record, "source": prints}, job.run)  # (last: a shard with a record is done)
    except BaseException:
        remove(tar_tmp, idx_tmp, f"{path}.json.{job.run}.tmp")
        raise
    return job.k, record


# ------------------------------------------------------------------- pack
@dataclass(frozen=True)
class Packed:
    """What a pack did: the folder's manifest, the shards it wrote, and
    whether the folder already held this source (nothing written)."""

    manifest: dict
    written: int
    up_to_date: bool


def pack(
    src: str,
    out: str,
    max_samples: Optional[int],
    max_bytes: Optional[int],
    workers: int,
    start_method: Optional[str] = None,
    follow_links: bool = False,
    reencode: Any = None,
    check: str = "stat",
    wait: bool = True,
) -> Packed:
    """Pack ``src`` into ``out``. The writing processes start with
    ``start_method`` (default: fork where there is one, else spawn). Links
    out of a folder ``src`` are skipped (listed on stderr) unless
    ``follow_links``; images are stored as ``reencode`` says when given
    (``--max-side``). Over an earlier pack, the source is compared with
    what the folder records (``check``: "stat" or "full", pack_fresh.py).
    Another run at work on ``out`` is waited for, or with ``wait=False``
    refused (PackBusy). Raises PackError (bad input) or PackFailed (I/O)."""
    global _source
    with io_step("read", src):
        _source = open_source(src, follow_links, reencode)
    _tell_skipped(_source.skipped)
    with io_step("create the folder", out):
        os.makedirs(out, exist_ok=True)
    if start_method is None:
        start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    processes = _Processes(multiprocessing.get_context(start_method), src, follow_links, reencode)
    lock = PackLock(out, wait)
    with io_step("take the lock", lock.path):
        lock.acquire()
    try:
        return _pack_holding(lock, (max_samples, max_bytes), workers, processes, check == "full")
    finally:
        with io_step("remove the lock", lock.path):
            lock.release()


def _pack_holding(lock: PackLock, bounds: tuple, workers: int, processes: "_Processes", full: bool) -> Packed:
    """The pack into ``lock.out``, by the lock's holder."""
    out, run = lock.out, lock.run
    tidy(out)
    settings = {"source": _source.description, "max_samples": bounds[0], "max_bytes": bounds[1]}
    earlier = earlier_plan(out, settings)
    comparing = earlier is not None or os.path.exists(os.path.join(out, shard_name(0) + ".json"))
    sizes, prints = _survey(processes, workers, bounds[1] is not None, comparing, full)
    ranges = plan_shards(sizes, *bounds)
    planned = {"settings": settings, "shards": [list(shard) for shard in ranges]}
    records: dict[int, dict] = {}
    todo = []
    for k, (start, end) in enumerate(ranges):
        record = finished(out, k, start, end)
        if record is not None and (prints is None or shard_is_current(record, prints, start, end)):
            records[k] = record
        else:
            todo.append(ShardJob(out, k, start, end, run))
    manifest_path = os.path.join(out, MANIFEST)
    had_manifest = os.path.exists(manifest_path)
    said = news(out, recorded(out, earlier), prints, len(todo), len(ranges), had_manifest)
    if said is not None:
        print(f"conveyor pack: {said}", flush=True)
    extras = extra_shards(out, len(ranges))
    if not todo and not extras and read_json(os.path.join(out, PLAN)) == planned:
        manifest = _manifest(planned, records)
        if read_json(manifest_path) == manifest:
            return Packed(manifest, 0, True)
    with io_step("remove the old manifest", manifest_path):
        if had_manifest:  # (it would vouch for a folder being rewritten)
            lock.confirm("remove the manifest")
            remove(manifest_path)
        if read_json(os.path.join(out, PLAN)) != planned:
            write_json(os.path.join(out, PLAN), planned, run)
    if todo:
        for k, record in processes.run(write_shard, todo, min(workers, len(todo))):
            records[k] = record
    with io_step("remove", out):
        remove(*(os.path.join(out, name) for name in extras))
    manifest = _manifest(planned, records)
    lock.confirm("write the manifest")
    with io_step("write", manifest_path):
        write_json(manifest_path, manifest, run)
    return Packed(manifest, len(todo), False)


def _manifest(planned: dict, records: dict[int, dict]) -> dict:
    """The manifest: the source, and each shard's record (without its samples' fingerprints, kept in its record)."""
    return {
        "format": "webdataset tar, conveyor index",
        "source": _source.description,
        "samples": len(_source),
        "classes": _source.classes,
        "shards": [
            {key: value for key, value in records[k].items() if key != "source"} for k in range(len(planned["shards"]))
        ],
    }


def _survey(
    processes: "_Processes", workers: int, sizes: bool, prints: bool, full: bool
) -> tuple[list, Optional[list]]:
    """Each sample's member sizes (for --max-bytes) and, when ``prints``, its fingerprint now."""
    if not (sizes or prints):
        return [[0]] * len(_source), None
    work = functools.partial(_survey_of, sizes=sizes, prints=prints, full=full)
    found = processes.map(work, range(len(_source)), workers)
    return ([s for s, _ in found] if sizes else [[0]] * len(found)), ([p for _, p in found] if prints else None)


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
            initargs=(
                None if self.context.get_start_method() == "forkserver" else os.getpid(),
                self.src,
                self.follow_links,
                self.reencode,
            ),
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


__all__ = ["pack", "Packed", "plan_shards", "write_shard", "ShardJob", "shard_name", "PackError", "PackFailed"]
