"""Whether a packed folder still holds its source: what identifies each
sample is recorded with its shard, and compared with the source before a
pack keeps the shard.

    writing   sample i ──identity (a file: path in SRC, class, size, mtime_ns; a dataset: none)──┐
                       ──its members as stored ──SHA-256─────────────────────────────────────────┴─▶ the
                         shard's record (shard-k.tar.json), "source"[i - first]
    re-pack   the source's fingerprints now: the identity (``--check stat``, the default), and the
              SHA-256 with ``--check full`` (always for a dataset: nothing else tells its samples)
              ──▶ a shard is kept when its range is the same and every sample matches its record
              ──▶ "source changed: 1 file edited, 1 added, 0 removed; re-packing 3 of 5 shards"

The identity is read before the sample's bytes: a file changed while it is
packed looks changed to the next check, never the other way round.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Optional

#: --check: "stat" compares what a stat says of each file; "full" also the SHA-256 of each sample's bytes.
CHECKS = ("stat", "full")


def members_sha256(members: list[tuple[str, bytes]]) -> str:
    """The SHA-256 of a sample's members as stored (each one's extension and size, then its bytes), in hex."""
    digest = hashlib.sha256()
    for ext, data in members:
        digest.update(f"{ext}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def written_print(members: list[tuple[str, bytes]], identity: dict) -> dict:
    """What a shard's record keeps of sample ``i``: its ``identity`` (read
    before its bytes) and the digest of ``members``."""
    return {**identity, "sha256": members_sha256(members)}


def survey_sample(source: Any, i: int, sizes: bool, prints: bool, full: bool) -> tuple[Optional[list], Optional[dict]]:
    """Sample ``i``'s member sizes (when ``sizes``: for --max-bytes) and its
    fingerprint now (when ``prints``): its identity, and the digest of its
    members with ``full`` or when it has no identity (a dataset's sample)."""
    identity = source.identity(i) if prints else None
    members = None
    if identity is not None and (full or not identity):
        members = source.members(i)
        identity = {**identity, "sha256": members_sha256(members)}
    if not sizes:
        return None, identity
    return ([len(data) for _, data in members] if members is not None else source.sizes(i)), identity


def matches(recorded: Any, now: dict) -> bool:
    """Whether a recorded fingerprint agrees with ``now`` on everything ``now`` holds."""
    return isinstance(recorded, dict) and all(recorded.get(key, _ABSENT) == value for key, value in now.items())


_ABSENT = object()


def recorded_prints(record: Any, samples: int) -> Optional[list]:
    """The fingerprints a shard's record keeps of its ``samples`` samples;
    None when it keeps none (an earlier conveyor's)."""
    prints = record.get("source") if isinstance(record, dict) else None
    return prints if isinstance(prints, list) and len(prints) == samples else None


def shard_is_current(record: dict, prints: list[dict], start: int, end: int) -> bool:
    """Whether a finished shard of samples [start, end) holds those samples as the source has them now."""
    recorded = recorded_prints(record, end - start)
    return recorded is not None and all(matches(old, new) for old, new in zip(recorded, prints[start:end]))


@dataclass(frozen=True)
class Changes:
    """How the source differs from what a folder records: samples (files, for a folder) edited, added, removed."""

    edited: int
    added: int
    removed: int
    unit: str

    def __bool__(self) -> bool:
        return bool(self.edited or self.added or self.removed)

    def __str__(self) -> str:
        noun = self.unit if self.edited == 1 else f"{self.unit}s"
        verb = "edited" if self.unit == "file" else "changed"
        return f"{self.edited} {noun} {verb}, {self.added} added, {self.removed} removed"


def compare(old: list, new: list[dict]) -> Changes:
    """``old`` (the records') against ``new`` (the source's now): files
    matched by path in SRC, a dataset's samples by position."""
    if new and "file" in new[0]:
        before, after = defaultdict(list), defaultdict(list)
        for fingerprint in old:
            before[fingerprint.get("file") if isinstance(fingerprint, dict) else None].append(fingerprint)
        for fingerprint in new:
            after[fingerprint["file"]].append(fingerprint)
        edited = added = removed = 0
        for name in set(before) | set(after):
            was, now = before.get(name, []), after.get(name, [])
            edited += sum(not matches(a, b) for a, b in zip(was, now))
            added, removed = added + max(0, len(now) - len(was)), removed + max(0, len(was) - len(now))
        return Changes(edited, added, removed, "file")
    edited = sum(not matches(a, b) for a, b in zip(old, new))
    return Changes(edited, max(0, len(new) - len(old)), max(0, len(old) - len(new)), "sample")


def news(
    out: str, old: Optional[list], new: Optional[list], writing: int, shards: int, finished: bool
) -> Optional[str]:
    """The line a pack over an earlier one prints before it writes, or None
    (nothing to say). ``old``: the records' fingerprints (None: not all
    known); ``finished``: the folder had a manifest."""
    if old is not None and new is not None:
        changes = compare(old, new)
        if changes:
            return f"source changed since {out} was packed: {changes}; re-packing {writing} of {shards} shards"
    if not writing:
        return None
    if finished:
        return f"{out}: re-packing {writing} of {shards} shards (missing, damaged, or packed by an earlier conveyor)"
    if writing < shards:
        return f"resuming {out}: {shards - writing} of {shards} shards are written and current; writing the rest"
    return None


__all__ = [
    "CHECKS",
    "Changes",
    "compare",
    "matches",
    "members_sha256",
    "news",
    "recorded_prints",
    "shard_is_current",
    "survey_sample",
    "written_print",
]
