"""A shard's index: where each sample's members lie in its tar, and which
tar it was made for.

    tar ──scan (its headers)──▶ ShardIndex ──save──▶ shard.tar.idx (an .npz: arrays, no pickles)
    shard.tar.idx ──load──▶ checked: keys, dtypes, shapes, starts in order,
                            members in tar order and inside the tar
                   ──tie──▶ made for this tar: its size (and SHA-256, beside the manifest's)

An index is tied to its tar by the tar's size and SHA-256, recorded when
``conveyor pack`` writes both. Opening compares the size with the file's
(a stat) and the hash with the manifest's record (no read of the tar);
``conveyor pack --verify`` hashes the tar and compares the whole index with
one made anew from the tar's headers. What no record can tie (an index
edited with its record kept) is caught at read time by each member's tar
header (headers.py).
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import zipfile
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from .errors import VERIFY_HINT, ShardError
from .records import BLOCK

#: Written into each index; an index without it (or with another) was made by an earlier conveyor.
INDEX_VERSION = 2
_ARRAYS = ("keys", "starts", "offsets", "sizes", "ext_ids", "exts")
_RECORD = ("version", "tar_bytes", "tar_sha256")


def _padded(sizes: np.ndarray) -> np.ndarray:
    return -(-sizes // BLOCK) * BLOCK


@dataclass
class ShardIndex:
    """Where each sample of one shard lies: sample ``s`` has members
    ``starts[s]`` to ``starts[s + 1]``; member ``m`` is ``sizes[m]`` bytes at
    ``offsets[m]`` with extension ``exts[ext_ids[m]]``. ``tar_bytes`` and
    ``tar_sha256`` say which tar it was made for (the hash is empty for an
    index read from the tar's headers)."""

    keys: np.ndarray
    starts: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    ext_ids: np.ndarray
    exts: list
    tar_bytes: int = 0
    tar_sha256: str = ""

    def __len__(self) -> int:
        return len(self.keys)

    def member_name(self, m: int, s: int) -> str:
        """Member ``m``'s name in the tar (``key.ext``); ``s`` is its sample."""
        return f"{self.keys[s]}.{self.exts[self.ext_ids[m]]}"

    @classmethod
    def build(
        cls, samples: list[tuple[str, list[tuple[str, int, int]]]], tar_bytes: int, tar_sha256: str = ""
    ) -> "ShardIndex":
        """From (key, [(extension, offset, size), ...]) per sample, for a tar of ``tar_bytes`` bytes."""
        exts: dict[str, int] = {}
        starts, offsets, sizes, ext_ids = [0], [], [], []
        for _, members in samples:
            for ext, offset, size in members:
                ext_ids.append(exts.setdefault(ext, len(exts)))
                offsets.append(offset)
                sizes.append(size)
            starts.append(len(offsets))
        return cls(
            keys=np.array([key for key, _ in samples], dtype=str),
            starts=np.array(starts, dtype=np.int64),
            offsets=np.array(offsets, dtype=np.int64),
            sizes=np.array(sizes, dtype=np.int64),
            ext_ids=np.array(ext_ids, dtype=np.int32),
            exts=list(exts),
            tar_bytes=int(tar_bytes),
            tar_sha256=tar_sha256,
        )

    @classmethod
    def scan(cls, path: str, name: Optional[str] = None) -> "ShardIndex":
        """Read a tar's headers (any tar in the WebDataset layout, e.g. one the
        webdataset package wrote): its samples are runs of members sharing a
        key. A tar cut short (a member's data past its end) is a ShardError."""
        where = name or path
        samples: list[tuple[str, list]] = []
        tar_bytes = os.path.getsize(path)
        try:
            with tarfile.open(path, "r:") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    if member.offset_data + member.size > tar_bytes:
                        raise ShardError(
                            f"{where}: member {member.name!r} ends at byte {member.offset_data + member.size}, past "
                            f"the end of the tar ({tar_bytes} bytes): the tar is cut short (an interrupted copy?); "
                            f"copy or pack it again"
                        )
                    directory, _, base = member.name.rpartition("/")
                    stem, dot, ext = base.partition(".")
                    if not dot or stem.startswith("_"):  # (no extension, or metadata such as __index__)
                        continue
                    key = f"{directory}/{stem}" if directory else stem
                    if not samples or samples[-1][0] != key:
                        samples.append((key, []))
                    samples[-1][1].append((ext, member.offset_data, member.size))
        except (tarfile.TarError, EOFError, UnicodeError) as exc:
            raise ShardError(f"{where}: not a readable tar ({exc}); copy or pack it again") from exc
        return cls.build(samples, tar_bytes)

    def save(self, path: str) -> None:
        """Write the index as an .npz file (plain arrays: it loads without pickle)."""
        with open(path, "wb") as f:
            np.savez(
                f,
                keys=self.keys,
                starts=self.starts,
                offsets=self.offsets,
                sizes=self.sizes,
                ext_ids=self.ext_ids,
                exts=np.array(self.exts, dtype=str),
                version=np.int64(INDEX_VERSION),
                tar_bytes=np.int64(self.tar_bytes),
                tar_sha256=np.str_(self.tar_sha256),
            )

    @classmethod
    def load(cls, source: Any, name: Optional[str] = None) -> "ShardIndex":
        """From a file :meth:`save` wrote (a path or a file object; ``name``
        names it in errors), checked as :meth:`check` says."""
        where = name or str(source)
        try:
            if not _is_zip(source):  # (np.load would take any other file for a pickle, and say so)
                raise ShardError(f"{where}: not a shard index (an .npz file); delete it or pack again")
            with np.load(source, allow_pickle=False) as saved:
                missing = [key for key in _ARRAYS + _RECORD if key not in saved.files]
                if "version" in missing or _scalar(saved["version"], "i") != INDEX_VERSION:
                    raise ShardError(
                        f"{where}: an index in another format (made by another version of conveyor, or not by "
                        f"conveyor); delete it (its tar's headers are read instead) or pack again"
                    )
                if missing:
                    raise ShardError(f"{where}: not a shard index (no {', '.join(missing)}); delete it or pack again")
                arrays = {key: saved[key] for key in _ARRAYS + _RECORD}
        except ShardError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, AttributeError) as exc:
            raise ShardError(f"{where}: not a readable shard index ({exc}); delete it or pack again") from exc
        index = cls._from_arrays(arrays, where)
        index.check(where)
        return index

    @classmethod
    def _from_arrays(cls, arrays: dict, where: str) -> "ShardIndex":
        kinds = {"keys": "U", "starts": "iu", "offsets": "iu", "sizes": "iu", "ext_ids": "iu", "exts": "U"}
        for key, kind in kinds.items():
            array = arrays[key]
            if array.ndim != 1 or array.dtype.kind not in kind:
                raise ShardError(
                    f"{where}: {key} is a {array.ndim}-dimensional array of {array.dtype}, not a list of "
                    f"{'text' if kind == 'U' else 'integers'}; delete the index or pack again"
                )
        tar_bytes, tar_sha256 = _scalar(arrays["tar_bytes"], "iu"), _scalar(arrays["tar_sha256"], "U")
        if tar_bytes is None or tar_sha256 is None:
            raise ShardError(f"{where}: its record of the tar (tar_bytes, tar_sha256) is malformed; pack again")
        return cls(
            keys=arrays["keys"],
            starts=arrays["starts"].astype(np.int64),
            offsets=arrays["offsets"].astype(np.int64),
            sizes=arrays["sizes"].astype(np.int64),
            ext_ids=arrays["ext_ids"].astype(np.int64),
            exts=[str(e) for e in arrays["exts"]],
            tar_bytes=int(tar_bytes),
            tar_sha256=str(tar_sha256),
        )

    def check(self, where: str) -> None:
        """Raise ShardError unless the arrays agree with one another and with
        the tar's size: starts from 0 up to the member count, in order; every
        extension id names an extension; every member inside the tar, after
        its header, in tar order, apart from the one before."""
        n = len(self.offsets)
        problem = None
        if len(self.starts) != len(self.keys) + 1:
            problem = f"{len(self.starts)} starts for {len(self.keys)} samples (there must be one more)"
        elif len(self.sizes) != n or len(self.ext_ids) != n:
            problem = f"{n} offsets, {len(self.sizes)} sizes and {len(self.ext_ids)} extension ids (all one per member)"
        elif self.starts[0] != 0 or self.starts[-1] != n:
            problem = f"starts run from {self.starts[0]} to {self.starts[-1]}, not from 0 to the {n} members"
        elif len(self.starts) > 1 and np.any(np.diff(self.starts) < 0):
            problem = f"the starts go back at sample {int(np.argmax(np.diff(self.starts) < 0))}"
        elif n and (self.ext_ids.min() < 0 or self.ext_ids.max() >= len(self.exts)):
            problem = f"an extension id is outside the {len(self.exts)} extensions"
        elif not 0 <= self.tar_bytes < 2**62:
            problem = f"it records a tar of {self.tar_bytes} bytes"
        if problem is None and n:
            problem = self._placement_problem()
        if problem is not None:
            raise ShardError(f"{where}: {problem}; the index is damaged: delete it or pack again ({VERIFY_HINT})")

    def _placement_problem(self) -> Optional[str]:
        """Members inside the tar, each after a header, in tar order without overlap."""
        offsets, sizes = self.offsets, self.sizes
        inside = (offsets >= BLOCK) & (sizes >= 0) & (offsets <= self.tar_bytes) & (sizes <= self.tar_bytes - offsets)
        if not inside.all():
            m = int(np.argmin(inside))
            return (
                f"{self._member(m)} is {sizes[m]} bytes at offset {offsets[m]}, outside the tar's "
                f"{self.tar_bytes} bytes"
            )
        after = offsets[1:] >= offsets[:-1] + _padded(sizes[:-1]) + BLOCK
        if not after.all():
            m = int(np.argmin(after)) + 1
            return (
                f"{self._member(m)} at offset {offsets[m]} does not follow {self._member(m - 1)} (which ends at "
                f"{offsets[m - 1] + sizes[m - 1]}) in the tar"
            )
        return None

    def _member(self, m: int) -> str:
        s = int(np.searchsorted(self.starts, m, side="right")) - 1
        return f"member {m} (sample {s}, {self.member_name(m, s)!r})"

    def differences(self, other: "ShardIndex") -> list[str]:
        """How ``other`` (e.g. made anew from the tar) differs from this index: samples, keys, places."""
        if len(self) != len(other):
            return [f"{len(self)} samples, the tar has {len(other)}"]
        found = []
        unequal = np.flatnonzero(self.keys != other.keys)
        if len(unequal):
            s = int(unequal[0])
            found.append(
                f"{len(unequal)} keys differ from the tar's (first: sample {s}, {str(self.keys[s])!r} in the index, "
                f"{str(other.keys[s])!r} in the tar)"
            )
        if not np.array_equal(self.starts, other.starts):
            s = int(np.argmax(self.starts != other.starts)) - 1
            found.append(f"the members of sample {s} differ from the tar's")
        elif len(self.offsets):
            mine = np.array(self.exts, dtype=object)[self.ext_ids] if self.exts else np.array([], dtype=object)
            theirs = np.array(other.exts, dtype=object)[other.ext_ids] if other.exts else np.array([], dtype=object)
            wrong = (self.offsets != other.offsets) | (self.sizes != other.sizes) | (mine != theirs)
            if wrong.any():
                m = int(np.argmax(wrong))
                found.append(
                    f"{int(wrong.sum())} members lie elsewhere in the tar (first: {self._member(m)}: "
                    f"{self.sizes[m]} bytes at {self.offsets[m]} in the index, {other.sizes[m]} at {other.offsets[m]} "
                    f"in the tar)"
                )
        return found


def file_sha256(path: str) -> str:
    """The SHA-256 of a file's bytes, in hex (read in 1 MB blocks)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_zip(source: Any) -> bool:
    """Whether a path or a seekable file object begins as a zip file (an .npz) does."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    start = source.tell()
    magic = source.read(4)
    source.seek(start)
    return magic == b"PK\x03\x04"


def _scalar(array: np.ndarray, kinds: str) -> Any:
    """A 0-dimensional saved value of one of these dtype kinds, else None."""
    if array.ndim != 0 or array.dtype.kind not in kinds:
        return None
    return array.item()


__all__ = ["ShardIndex", "INDEX_VERSION", "file_sha256"]
