"""What a packed folder holds, as ``conveyor pack`` reads and writes it:
the plan, each shard's record, which shards are finished, and what runs
that are gone left behind; and I/O errors as one PackFailed.

    OUT/plan.json            the settings (source, bounds) and the shards' sample ranges
    OUT/shard-k.tar[.idx]    a shard and its index, renamed into place when whole
    OUT/shard-k.tar.json     its record (name, first, samples, bytes, sha256, and its
                             samples' fingerprints: pack_fresh.py); written last: the shard is done
    OUT/manifest.json        every shard's record; written last of all
    OUT/*.<run>.tmp          a run's files before they are renamed (a gone run's are removed)

JSON is written to a file of the writing run's own and renamed over its
name, so a reader sees the old file or the new one, never a part.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ..shards.errors import ShardError
from ..shards.index import ShardIndex
from ..shards.manifest import shard_record
from .pack_fresh import recorded_prints
from .pack_lock import STALE_S
from .pack_sources import PackError, PackFailed

PLAN = "plan.json"


# ----------------------------------------------------------------- errors
def cause(exc: OSError) -> str:
    """An OSError's cause in words, and what to do about it."""
    text = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{text} (free some space, then run the same command again: it keeps the shards already written)"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{text} (choose a folder you may write to, or change its permissions)"
    return f"{text} (run the same command again once it is mended: it keeps the shards already written)"


@contextmanager
def io_step(doing: str, path: str) -> Iterator[None]:
    """Turn an OSError into one PackFailed naming the file (the error's own, else ``path``) and the cause."""
    try:
        yield
    except OSError as exc:
        raise PackFailed(f"cannot {doing} {exc.filename or path}: {cause(exc)}") from None


def shard_name(k: int) -> str:
    return f"shard-{k:06d}.tar"


def write_json(path: str, value: Any, run: str) -> None:
    """Write ``value`` to ``path`` by a file of ``run``'s own renamed over it."""
    with open(f"{path}.{run}.tmp", "w") as f:
        json.dump(value, f, indent=1)
    os.replace(f"{path}.{run}.tmp", path)


#: What read_json gives for a file that is there but cannot be read as JSON.
_UNREADABLE = object()


def read_json(path: str) -> Any:
    """The JSON in ``path``; None when there is no such file; _UNREADABLE when it cannot be read."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return _UNREADABLE


def remove(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass


def finished(out: str, k: int, start: int, end: int) -> Optional[dict]:
    """Shard ``k``'s record when the shard was finished (its record, tar and
    index there and agreeing on size, hash and samples); None: write it again."""
    path = os.path.join(out, shard_name(k))
    raw = read_json(path + ".json")
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


def earlier_plan(out: str, settings: dict) -> Optional[dict]:
    """The plan of an earlier run in ``out`` (None: none); refused when it was made with other settings."""
    path = os.path.join(out, PLAN)
    planned = read_json(path)
    if planned is not None and not (isinstance(planned, dict) and isinstance(planned.get("shards"), list)):
        raise PackError(f"{path} is not a plan conveyor pack wrote; pack into an empty folder")
    if planned is not None:
        earlier = planned.get("settings")
        earlier = {key: earlier.get(key) for key in settings} if isinstance(earlier, dict) else earlier
        if earlier != settings:  # (an earlier conveyor also kept the count of samples: not a setting)
            raise PackError(
                f"{out} holds shards packed with other settings ({planned.get('settings')}); pack into an empty folder"
            )
    return planned


def recorded(out: str, planned: Optional[dict]) -> Optional[list]:
    """The fingerprints the records of an earlier pack keep, in sample order; None unless every shard keeps its own."""
    if planned is None:
        return None
    prints: list = []
    for k, shard in enumerate(planned["shards"]):
        kept = recorded_prints(read_json(os.path.join(out, shard_name(k) + ".json")), shard[1] - shard[0])
        if kept is None:
            return None
        prints += kept
    return prints


_SHARD_FILE = re.compile(r"shard-(\d{6})\.tar(\.idx|\.json)?")
#: Files a run writes before renaming them; any in the folder when a run takes the lock are a gone run's.
_RUN_FILE = re.compile(r"(shard-\d{6}\.tar(\.idx|\.json)?|plan\.json|manifest\.json)(\.[0-9a-f]{16})?\.tmp")
#: What a run of the lock leaves for moments (pack_lock.py): removed once older than STALE_S.
_LOCK_FILE = re.compile(r"pack\.lock\.[0-9a-f]{16}\.(tmp|stale|done|clock)")


def extra_shards(out: str, shards: int) -> list[str]:
    """The files of shards past the last one planned (the source shrank)."""
    with io_step("list", out):
        return sorted(name for name in os.listdir(out) if (m := _SHARD_FILE.fullmatch(name)) and int(m[1]) >= shards)


def tidy(out: str) -> None:
    """Remove what runs that are gone left half-written."""
    with io_step("list", out):
        names = os.listdir(out)
    for name in names:
        path = os.path.join(out, name)
        if _RUN_FILE.fullmatch(name):
            remove(path)
        elif _LOCK_FILE.fullmatch(name):
            try:
                if time.time() - os.stat(path).st_mtime > STALE_S:
                    remove(path)
            except OSError:
                pass
