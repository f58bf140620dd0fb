"""``conveyor pack --verify FOLDER``: every check a packed folder can be
given, every problem named (not only the first).

    manifest.json ──missing: an unfinished pack (manifest.unfinished_problem, as the reader says) or none
                  ──checked (keys, types, every shard name inside FOLDER)
    per shard     ──size and SHA-256 against the manifest
                  ──its tar's headers scanned (a tar cut short is named)
                  ──its .idx loaded (checked) and compared with the scan, member by member,
                    and its record of the tar (size, SHA-256) with the manifest's
    in all        ──samples per shard and in total, first sample numbers
"""

from __future__ import annotations

import os

from ..shards.errors import VERIFY_HINT, ShardError
from ..shards.index import ShardIndex, file_sha256
from ..shards.manifest import MANIFEST, ShardRecord, read_manifest, unfinished_problem


def verify(out: str) -> list[str]:
    """What is wrong with the packed folder ``out``, one line per problem (empty: nothing)."""
    try:
        manifest = read_manifest(out)
    except ShardError as exc:
        return [_plain(exc)]
    except OSError as exc:
        return [f"{os.path.join(out, MANIFEST)}: cannot be read ({exc.strerror or exc})"]
    if manifest is None:
        unfinished = unfinished_problem(out, os.listdir(out)) if os.path.isdir(out) else None
        if unfinished is not None:  # (the verdict ShardDataset gives)
            return [unfinished]
        return [f"{out}: no {MANIFEST} (not packed, or the packing did not finish: run it again)"]
    problems, total = [], 0
    for n, record in enumerate(manifest.shards):
        if record.first is not None and record.first != total:
            problems.append(f"{MANIFEST}: shards[{n}].first is {record.first}, the shards before it hold {total}")
        problems += shard_problems(out, record)
        total += record.samples
    if total != manifest.samples:
        problems.append(f"{MANIFEST}: samples is {manifest.samples}, its shards' records add up to {total}")
    return problems


def shard_problems(out: str, record: ShardRecord) -> list[str]:
    """What is wrong with one shard of ``out`` and its index, against its manifest record."""
    name, path = record.name, os.path.join(out, record.name)
    if not os.path.isfile(path):
        return [f"{name}: missing"]
    found = []
    size = os.path.getsize(path)
    if size != record.bytes:
        found.append(f"{name}: {size} bytes, the manifest says {record.bytes} (changed or cut short)")
    elif file_sha256(path) != record.sha256:
        found.append(f"{name}: its SHA-256 differs from the manifest's (changed or damaged)")
    try:
        scanned = ShardIndex.scan(path, name)
    except ShardError as exc:
        return found + [_plain(exc)]
    if len(scanned) != record.samples:
        found.append(f"{name}: {len(scanned)} samples, the manifest says {record.samples}")
    return found + index_problems(path + ".idx", name + ".idx", scanned, record)


def index_problems(path: str, name: str, scanned: ShardIndex, record: ShardRecord) -> list[str]:
    """What is wrong with a shard's index: unreadable or malformed, made for
    another tar than the manifest's, or different from its tar's headers."""
    if not os.path.isfile(path):
        return [f"{name}: missing (ShardDataset reads the tar's headers instead; pack again to write it)"]
    try:
        saved = ShardIndex.load(path, name)
    except ShardError as exc:
        return [_plain(exc)]
    found = []
    if saved.tar_bytes != record.bytes:
        found.append(f"{name}: made for a tar of {saved.tar_bytes} bytes, the manifest says {record.bytes}")
    elif saved.tar_sha256 != record.sha256:
        found.append(f"{name}: made for a tar with another SHA-256 than the manifest's")
    found += [f"{name}: {difference}" for difference in saved.differences(scanned)]
    return found


def _plain(exc: ShardError) -> str:
    """A ShardError's message without its pointer to --verify (this is --verify)."""
    return str(exc).replace(f" ({VERIFY_HINT})", "").replace(f"; {VERIFY_HINT}", "")
