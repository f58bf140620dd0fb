"""Reading shards: a map-style dataset with random access, each read
checked against the tar and the index.

    ShardDataset(path)  ──▶ the shards (a folder with manifest.json, a list, a glob)  (manifest.py)
                        ──▶ each shard's index (its .idx file, or its headers read once)  (index.py)
                            tied to its tar: the tar's size = the index's record = the manifest's
    dataset[i]          ──▶ shard, sample ──▶ each member's tar header checked (headers.py),
                            its bytes from the memory-mapped tar
                        ──▶ {"__key__": key, "jpg": b"...", "cls": 3} (decoded by extension)
    dataset.stream(...) ──▶ an IterableDataset: whole shards in turn, shuffled by shard  (stream.py)
    store=Store(...)    ──▶ shards in an object store: a sample by one ranged read (its first
                            header to its last byte, checked the same way); a stream by whole
                            shards in the local cache, the next ones prefetched

Random access costs no ``open`` per sample: each process maps each shard
once, on first use (a map inherited through fork is dropped and made anew,
and a pickled dataset travels without its maps). So shuffling, exact resume
and identical batches for any number of workers hold as for any map-style
dataset.
"""

from __future__ import annotations

import io
import mmap
import os
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from .errors import VERIFY_HINT, ShardError
from .headers import header_problem
from .index import ShardIndex
from .manifest import MANIFEST, Manifest, ShardRecord, find_shards, shard_paths
from .records import BLOCK, decode_member
from .stream import ShardReader, ShardStream

if TYPE_CHECKING:
    from ..store import Store


def index_for(path: str, record: Optional[ShardRecord] = None, store: Optional[Store] = None) -> ShardIndex:
    """A shard's index, checked against its tar and its manifest record:
    its ``.idx`` file when there is one (``conveyor pack`` writes it), else
    read from the tar's headers (for a shard in a store, from its local
    copy). An index that was not made for this tar is a ShardError."""
    if store is not None:
        name = getattr(store, "url", str)(path + ".idx")
        try:
            index = ShardIndex.load(io.BytesIO(store.read(path + ".idx")), name)
        except FileNotFoundError:
            index = ShardIndex.scan(store.fetch(path), getattr(store, "url", str)(path))
        # (the object's own size is not asked for: each ranged read is checked for short bytes instead)
    else:
        size = os.path.getsize(path)
        if record is not None and size != record.bytes:
            raise ShardError(
                f"{path}: {size} bytes, its manifest records {record.bytes}: the shard changed or was cut short "
                f"since it was packed; restore it or pack again ({VERIFY_HINT})"
            )
        saved = path + ".idx"
        index = ShardIndex.load(saved) if os.path.exists(saved) else ShardIndex.scan(path)
        if index.tar_bytes != size:
            raise ShardError(
                f"{saved}: made for a tar of {index.tar_bytes} bytes, but {path} has {size} (a stale index, or a "
                f"changed tar); delete the index (the tar's headers are read instead) or pack again ({VERIFY_HINT})"
            )
    if record is not None:
        problem = _record_problem(index, record)
        if problem is not None:
            raise ShardError(f"{path}: {problem}; restore the files or pack again ({VERIFY_HINT})")
    return index


def _record_problem(index: ShardIndex, record: ShardRecord) -> Optional[str]:
    if index.tar_bytes != record.bytes:
        return f"its index was made for a tar of {index.tar_bytes} bytes, the manifest records {record.bytes}"
    if index.tar_sha256 and index.tar_sha256 != record.sha256:
        return "its index was made for a tar with another SHA-256 than the manifest records"
    if len(index) != record.samples:
        return f"its index has {len(index)} samples, the manifest records {record.samples}"
    return None


def _check_counts(manifest: Manifest, indexes: list[ShardIndex]) -> None:
    """The manifest's running sample numbers and total agree with its shards' indexes."""
    total = 0
    for n, (record, index) in enumerate(zip(manifest.shards, indexes)):
        if record.first is not None and record.first != total:
            raise ShardError(
                f"{manifest.where}: shards[{n}].first is {record.first}, the shards before it hold {total} "
                f"({VERIFY_HINT})"
            )
        total += len(index)
    if total != manifest.samples:
        raise ShardError(f"{manifest.where}: samples is {manifest.samples}, its shards hold {total} ({VERIFY_HINT})")


class ShardDataset:
    """A map-style dataset over tar shards in the WebDataset layout (written
    by ``conveyor pack`` or by the ``webdataset`` package).

    Sample ``i`` is a dict: ``"__key__"`` and one entry per member, decoded
    by its extension (``cls`` an int, ``txt`` text, ``json``, ``npy`` an
    array; ``jpg`` and the like stay bytes). ``decode=False`` keeps every
    member as bytes; ``transform`` is applied to the dict (decode an image
    there). Example::

        ds = ShardDataset("shards/", transform=lambda s: (to_tensor(s["jpg"]), s["cls"]))
        loader = DataLoader(ds, batch_size=64, shuffle=True, num_workers=8)

    Every shard's size is checked against its index and manifest at
    construction, and every member's tar header at each read: a shard,
    index or manifest that disagrees raises :class:`ShardError` naming the
    file, the sample and what disagrees, never wrong or short bytes.
    """

    def __init__(
        self,
        source: Union[str, os.PathLike, Sequence[str]],
        transform: Optional[Callable[[dict], Any]] = None,
        decode: bool = True,
        store: Optional[Store] = None,
    ):
        self.store = store
        self.paths, manifest = find_shards(source, store)
        if not self.paths:
            raise ValueError(f"no shards found at {source!r} (a folder of .tar files, a glob, or a list of paths)")
        missing = [p for p in self.paths if store is None and not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"shards not found: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        records = manifest.shards if manifest is not None else [None] * len(self.paths)
        self.indexes = [index_for(path, record, store) for path, record in zip(self.paths, records)]
        if manifest is not None:
            _check_counts(manifest, self.indexes)
        #: Sample number where each shard begins (and the total at the end).
        self.firsts = np.cumsum([0] + [len(index) for index in self.indexes]).tolist()
        self.transform = transform
        self.decode = decode
        self._maps: dict[int, mmap.mmap] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.firsts[-1]

    def locate(self, i: int) -> tuple[int, int]:
        """(shard number, sample number within it) of sample ``i``."""
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} is out of range for {len(self)} samples")
        shard = bisect_right(self.firsts, i) - 1
        return shard, i - self.firsts[shard]

    def open_shard(self, shard: int) -> mmap.mmap:
        """Map shard ``shard`` (from a store: its local copy, fetched into the
        cache first); its samples are then read from the map."""
        if self._pid != os.getpid():  # (forked: this process maps its own)
            self._maps, self._pid = {}, os.getpid()
        mapped = self._maps.get(shard)
        if mapped is None:
            mapped = self._maps[shard] = self._mapped(shard)
        return mapped

    def _mapped(self, shard: int) -> mmap.mmap:
        expected = self.indexes[shard].tar_bytes
        if self.store is None:
            return _map_file(self.paths[shard], expected)
        try:
            return _map_file(self.store.fetch(self.paths[shard]), expected, self.paths[shard])
        except FileNotFoundError:
            # Another worker's fetch may evict the cached copy between our fetch and open: fetch it again.
            return _map_file(self.store.fetch(self.paths[shard]), expected, self.paths[shard])

    def close_shard(self, shard: int) -> None:
        """Let go of a shard's map (a stream is done with it)."""
        mapped = self._maps.pop(shard, None) if self._pid == os.getpid() else None
        if mapped is not None:
            mapped.close()

    def raw(self, i: int) -> dict:
        """Sample ``i``'s members as bytes, by extension, with its ``__key__``:
        from the shard's map, or (a shard in a store not fetched whole) by
        one ranged read from its first member's header to its last byte.
        Each member's tar header is checked first (its name, size and
        checksum); a disagreement is a ShardError."""
        shard, s = self.locate(i)
        index = self.indexes[shard]
        first, stop = index.starts.item(s), index.starts.item(s + 1)
        data: bytes | mmap.mmap
        if self.store is not None and (self._pid != os.getpid() or shard not in self._maps):
            base, data = self._read_range(self.store, shard, s, first, stop)
        else:
            base, data = 0, self.open_shard(shard)
        key = index.keys.item(s)
        sample = {"__key__": key}
        exts, ext_ids, offsets, sizes = index.exts, index.ext_ids, index.offsets, index.sizes
        for m in range(first, stop):
            ext = exts[ext_ids.item(m)]
            at, size = offsets.item(m) - base, sizes.item(m)
            problem = header_problem(data, at, f"{key}.{ext}", size)
            if problem is not None:
                raise ShardError(
                    f"{self.paths[shard]}: sample {s} of the shard (sample {i} of the dataset, key {key!r}), member "
                    f"{ext!r}: {problem}. The index does not match the tar (a stale or edited index, or a changed "
                    f"tar); {VERIFY_HINT}, then pack again or restore the files"
                )
            sample[ext] = data[at : at + size]
        return sample

    def _read_range(self, store: Store, shard: int, s: int, first: int, stop: int) -> tuple[int, bytes]:
        """(where it begins in the tar, the bytes): sample ``s``'s first header to its last byte, by one ranged read."""
        if first == stop:
            return 0, b""
        index = self.indexes[shard]
        base = index.offsets.item(first) - BLOCK
        end = index.offsets.item(stop - 1) + index.sizes.item(stop - 1)
        data = store.read(self.paths[shard], base, end)
        if len(data) != end - base:
            raise ShardError(
                f"{self.paths[shard]}: sample {s} of the shard: the store returned {len(data)} of its {end - base} "
                f"bytes ({base} to {end}); the object is shorter than its index says (changed or cut short). "
                f"Restore it or pack and upload again ({VERIFY_HINT})"
            )
        return base, data

    def __getitem__(self, i: int) -> Any:
        sample = self.raw(i)
        if self.decode:
            sample = {ext: value if ext == "__key__" else decode_member(ext, value) for ext, value in sample.items()}
        return self.transform(sample) if self.transform is not None else sample

    def stream(self, shuffle_shards: bool = False, seed: int = 0, prefetch: int = 2) -> ShardStream:
        """The same samples as an IterableDataset that reads whole shards in
        turn (sequential reads), shuffled by shard when asked; from a store,
        each worker fetches its next ``prefetch`` shards while it reads one."""
        return ShardStream(self, shuffle_shards, seed, prefetch)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_maps"] = {}  # (maps do not travel; each process makes its own)
        return state

    def __repr__(self) -> str:
        return f"ShardDataset({len(self.paths)} shards, {len(self)} samples)"


def _map_file(path: str, expected: int, name: Optional[str] = None) -> mmap.mmap:
    """``path`` mapped read-only, once its size is the ``expected`` one (its index's record)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected:
            raise ShardError(
                f"{name or path}: {size} bytes now, its index was made for {expected}: the shard changed since it "
                f"was opened (or its local copy is not the object); open the dataset again ({VERIFY_HINT})"
            )
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


__all__ = ["ShardDataset", "ShardStream", "ShardReader", "ShardError", "shard_paths", "index_for", "MANIFEST"]
