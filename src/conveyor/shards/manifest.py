"""A packed folder's ``manifest.json``, read as untrusted input, and the
shards a source names.

    manifest.json ──parse──▶ Manifest: samples, and per shard a ShardRecord
                             (name inside the folder, samples, bytes, sha256)
                  ──▶ a ShardError naming the file and the key at the first thing wrong
    no manifest.json, but a pack's files (plan.json, .tar.json records, .tmp files)
                  ──▶ unfinished_problem: an unfinished pack, never a data set (the reader's
                      ShardError and ``conveyor pack --verify`` say the same)

A shard's name is a relative path that stays in the manifest's folder: no
absolute path, no ``..``, no empty or ``.`` part, no backslash or NUL. (A
shard that is a symbolic link in the folder is followed: the folder's owner
put it there; its size and index are checked like any shard's.)
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from .errors import VERIFY_HINT, ShardError

if TYPE_CHECKING:
    from ..store import Store

MANIFEST = "manifest.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ShardRecord:
    """What the manifest says of one shard: its name (relative to the
    folder), first sample number, samples, size in bytes and SHA-256."""

    name: str
    first: Optional[int]
    samples: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: the total of samples and each shard's record."""

    where: str
    samples: int
    shards: tuple


def parse_manifest(text: Union[str, bytes], where: str) -> Manifest:
    """The manifest in ``text`` (``where`` names its file in errors), checked
    key by key: a ShardError names the first key that is missing, of the
    wrong type or out of range."""
    try:
        raw = json.loads(text)
    except (ValueError, UnicodeError) as exc:
        raise ShardError(f"{where}: not JSON ({exc}); pack again, or restore the file") from exc
    if not isinstance(raw, dict):
        raise _malformed(where, "manifest.json", _found(raw, "an object of keys"))
    samples = _integer(raw, "samples", where, "samples")
    shards = raw.get("shards")
    if not isinstance(shards, list):
        raise _malformed(where, "shards", _found(shards, "a list"))
    return Manifest(where, samples, tuple(shard_record(entry, where, f"shards[{n}]") for n, entry in enumerate(shards)))


def shard_record(entry: Any, where: str, key: str) -> ShardRecord:
    """One shard's record (a manifest entry, or a ``.tar.json`` record file), checked."""
    if not isinstance(entry, dict):
        raise _malformed(where, key, _found(entry, "an object of keys"))
    name = entry.get("name")
    if not isinstance(name, str):
        raise _malformed(where, f"{key}.name", _found(name, "text"))
    problem = name_problem(name)
    if problem is not None:
        raise ShardError(
            f"{where}: {key}.name is {name!r}, which {problem}; a manifest names shards inside its own folder "
            f"(repair or replace the manifest)"
        )
    sha256 = entry.get("sha256")
    if not (isinstance(sha256, str) and _SHA256.fullmatch(sha256)):
        raise _malformed(where, f"{key}.sha256", _found(sha256, "a SHA-256 in hex", show=True))
    first = _integer(entry, "first", where, f"{key}.first") if "first" in entry else None
    samples, size = _integer(entry, "samples", where, f"{key}.samples"), _integer(entry, "bytes", where, f"{key}.bytes")
    return ShardRecord(name, first, samples, size, sha256)


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` could lead out of the folder it is relative to (None: it stays inside)."""
    if not name or "\\" in name or "\0" in name:
        return "is empty or holds a backslash or NUL"
    if name.startswith("/") or os.path.isabs(name):
        return "is an absolute path"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' part (it could lead out of the folder)"
    return None


def _integer(raw: dict, name: str, where: str, key: str) -> int:
    value = raw.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _malformed(where, key, _found(value, "a count (an integer >= 0)", show=True))
    return value


def _found(value: Any, wanted: str, show: bool = False) -> str:
    """What was found instead of ``wanted``, in words: missing, its type, or (``show``) its value."""
    if value is None:
        return "is missing"
    return f"is {value!r}, not {wanted}" if show else f"is a {type(value).__name__}, not {wanted}"


def _malformed(where: str, key: str, problem: str) -> ShardError:
    return ShardError(
        f"{where}: {key} {problem}; this is not a manifest conveyor pack wrote (pack again, or "
        f"restore the file; {VERIFY_HINT})"
    )


def read_manifest(folder: str) -> Optional[Manifest]:
    """The checked manifest of a local folder; None when it has none."""
    path = os.path.join(folder, MANIFEST)
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    return parse_manifest(text, path)


#: Files ``conveyor pack`` leaves in a folder before its manifest is written.
PLAN = "plan.json"
_PACK_SUFFIXES = (".tar.json", ".tmp")


def unfinished_problem(folder: str, names: Sequence[str]) -> Optional[str]:
    """Why ``folder`` (which holds ``names`` and no manifest) is not a data
    set: it holds files of a ``conveyor pack`` that did not finish. None
    when it holds none (a folder of tars another tool wrote)."""
    names = [os.path.basename(n) for n in names]
    signs = [n for n in names if n == PLAN or n.endswith(_PACK_SUFFIXES)]
    if not signs:
        return None
    finished = sum(n.endswith(".tar") for n in names)
    shown = ", ".join(sorted(signs)[:3]) + (" ..." if len(signs) > 3 else "")
    return (
        f"{folder}: an unfinished conveyor pack, not a data set: no {MANIFEST} (written last, when every shard "
        f"is done), but the pack's own files ({shown}) and {finished} finished shards; run the same "
        f"`conveyor pack` command again to finish it"
    )


# --------------------------------------------------------------- listing
def find_shards(
    source: Union[str, os.PathLike, Sequence[str]], store: Optional[Store] = None
) -> tuple[list[str], Optional[Manifest]]:
    """The shards ``source`` names, and the manifest that lists them (None
    when they were not found through one); see :func:`shard_paths`."""
    if isinstance(source, (list, tuple)):
        return [str(p) for p in source], None
    if store is not None:
        folder = str(source).strip("/")
        found = store.list(folder)
        name = f"{folder}/{MANIFEST}" if folder else MANIFEST
        if name in found:
            manifest = parse_manifest(store.read(name), getattr(store, "url", str)(name))
            return [f"{folder}/{shard.name}" if folder else shard.name for shard in manifest.shards], manifest
        problem = unfinished_problem(getattr(store, "url", str)(folder), found)
        if problem is not None:
            raise ShardError(problem)
        return [p for p in found if p.endswith(".tar")], None
    source = str(source)
    if os.path.isdir(source):
        local = read_manifest(source)
        if local is not None:
            return [os.path.join(source, shard.name) for shard in local.shards], local
        problem = unfinished_problem(source, os.listdir(source))
        if problem is not None:
            raise ShardError(problem)
        return sorted(glob.glob(os.path.join(source, "*.tar"))), None
    if any(c in source for c in "*?["):
        return sorted(glob.glob(source)), None
    return [source], None


def shard_paths(source: Union[str, os.PathLike, Sequence[str]], store: Optional[Store] = None) -> list[str]:
    """The shards ``source`` names: a folder (its manifest's shards, else its
    ``*.tar`` files, sorted), a glob pattern, one tar, or a list of tars; in
    ``store`` (a conveyor.Store) when given, a folder of it. A manifest is
    checked first (a ShardError when it is malformed or names a path
    outside its folder), and a folder a pack left unfinished is refused."""
    return find_shards(source, store)[0]
