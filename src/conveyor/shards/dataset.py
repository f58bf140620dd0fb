"""Reading shards: a map-style dataset with random access, each read
checked against the tar and the index.

    ShardDataset(path)  ──▶ the shards (a folder with manifest.json, a list, a glob)  (manifest.py)
                        ──▶ each shard's index (its .idx file, or its headers read once)  (index.py)
                            tied to its tar: the tar's size = the index's record = the manifest's;
                            the tar's identity recorded (identity.py: device, inode, size, mtime)
    dataset[i]          ──▶ shard, sample ──▶ each member's tar header checked (headers.py),
                            its bytes by one pread of the tar, checked to be the file opened,
                            and at open the file recorded or one renamed over it (files.py: a
                            few open files per process, a file changed in place an error)
                        ──▶ {"__key__": key, "jpg": b"...", "cls": 3} (decoded by extension)
    dataset.stream(...) ──▶ an IterableDataset: whole shards in turn, shuffled by shard  (stream.py)
    store=Store(...)    ──▶ shards in an object store: a sample by one ranged read (its first
                            header to its last byte, checked the same way); a stream by whole
                            shards in the local cache, the next ones prefetched; with
                            whole_shards=True, dataset[i] too (for a block order: ShardBlockSampler)

Random access costs no ``open`` per sample: each process holds its most
recently read shards open (at most ``open_files``; files.py says why reads,
not maps), so any number of shards can be read; a table inherited through
fork is dropped and made anew, and a pickled dataset travels without it.
So shuffling, exact resume and identical batches for any number of workers
hold as for any map-style dataset. A folder a pack left unfinished is
refused (manifest.py's ``unfinished_problem``, the verdict ``conveyor pack
--verify`` gives too).
"""

from __future__ import annotations

import io
import os
from bisect import bisect_right
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from .errors import VERIFY_HINT, ShardError
from .files import OPEN_FILES, ShardFiles
from .headers import header_problem
from .identity import FileIdentities
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
    return _indexed(path, record, store)[0]


def _indexed(
    path: str, record: Optional[ShardRecord], store: Optional[Store]
) -> tuple[ShardIndex, Optional[os.stat_result]]:
    """``index_for``'s index, and the stat of the tar (not of a store's object) it was checked against,
    taken before the index is read: the file the dataset is made for."""
    st = None
    if store is not None:
        name = getattr(store, "url", str)(path + ".idx")
        try:
            index = ShardIndex.load(io.BytesIO(store.read(path + ".idx")), name)
        except FileNotFoundError:
            index = ShardIndex.scan(store.fetch(path), getattr(store, "url", str)(path))
        # (the object's own size is not asked for: each ranged read is checked for short bytes instead)
    else:
        st = os.stat(path)
        size = st.st_size
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
    return index, st


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

    From a ``store``, each sample is read by one ranged read; with
    ``whole_shards=True`` a shard is fetched whole into the store's cache
    at its first read and its samples read from the local copy (one
    download per shard while it stays cached: what
    :class:`~conveyor.ShardBlockSampler`'s order wants, which reads a shard
    in one span of the epoch; in a random order it would download a shard
    per sample once the cache is full). Without a store it changes nothing.

    Every shard's size is checked against its index and manifest at
    construction (and its identity recorded: a shard rewritten in place
    since is refused, in any process, at any read), and every member's
    tar header at each read: a shard,
    index or manifest that disagrees raises :class:`ShardError` naming the
    file, the sample and what disagrees, never wrong or short bytes.
    """

    def __init__(
        self,
        source: Union[str, os.PathLike, Sequence[str]],
        transform: Optional[Callable[[dict], Any]] = None,
        decode: bool = True,
        store: Optional[Store] = None,
        open_files: int = OPEN_FILES,
        whole_shards: bool = False,
    ):
        if not isinstance(whole_shards, bool):
            raise TypeError(f"ShardDataset: whole_shards must be True or False, got {whole_shards!r}")
        self.store = store
        self.whole_shards = whole_shards
        self.paths, manifest = find_shards(source, store)
        if not self.paths:
            raise ValueError(f"no shards found at {source!r} (a folder of .tar files, a glob, or a list of paths)")
        missing = [p for p in self.paths if store is None and not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"shards not found: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        records = manifest.shards if manifest is not None else [None] * len(self.paths)
        indexed = [_indexed(path, record, store) for path, record in zip(self.paths, records)]
        self.indexes = [index for index, _ in indexed]
        #: Each tar's identity when the dataset was made (None from a store: its cache replaces copies by rename).
        self._made_for = FileIdentities([st for _, st in indexed if st is not None]) if store is None else None
        if manifest is not None:
            _check_counts(manifest, self.indexes)
        #: Sample number where each shard begins (and the total at the end).
        self.firsts = np.cumsum([0] + [len(index) for index in self.indexes]).tolist()
        self.transform = transform
        self.decode = decode
        self._files = ShardFiles(open_files)
        self._local: dict[int, str] = {}  # (a store's shards this process reads from local copies)
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

    def open_shard(self, shard: int) -> str:
        """The file shard ``shard``'s samples are read from (from a store: its
        local copy, fetched into the cache first, read from then on)."""
        if self.store is None:
            return self.paths[shard]
        if self._pid != os.getpid():  # (forked: this process fetches its own)
            self._local, self._pid = {}, os.getpid()
        local = self._local.get(shard)
        if local is None:
            local = self._local[shard] = self.store.fetch(self.paths[shard])
        return local

    def close_shard(self, shard: int) -> None:
        """Let go of a shard (a stream is done with it): its open file, its
        local copy (from a store: released, the first to make room in the cache)."""
        local = self._local.pop(shard, None) if self._pid == os.getpid() else None
        self._files.forget(local if local is not None else self.paths[shard])
        if local is not None and self.store is not None:
            self.store.release(self.paths[shard])

    def raw(self, i: int) -> dict:
        """Sample ``i``'s members as bytes, by extension, with its ``__key__``:
        by one read from its first member's header to its last byte (of the
        tar, its local copy, or a ranged read of a store's object).
        Each member's tar header is checked first (its name, size and
        checksum); a disagreement is a ShardError."""
        shard, s = self.locate(i)
        return self.raws(shard, s, s + 1)[0]

    def raws(self, shard: int, start: int, stop: int) -> list[dict]:
        """Samples ``start`` to ``stop`` of shard ``shard`` (numbers within
        it) as ``raw`` gives each, by one read of all their bytes, checked
        as ``raw`` checks them."""
        index = self.indexes[shard]
        exts, ext_ids, offsets, sizes, starts = index.exts, index.ext_ids, index.offsets, index.sizes, index.starts
        first, last = starts.item(start), starts.item(stop)
        if first == last:  # (no members: nothing to read)
            base, data = 0, b""
        else:  # (from the first member's header to the last member's last byte)
            base, end = offsets.item(first) - BLOCK, offsets.item(last - 1) + sizes.item(last - 1)
            if self.store is not None and self.whole_shards:
                self.open_shard(shard)  # (fetched whole at its first read; read from the local copy)
            if self.store is not None and (self._pid != os.getpid() or shard not in self._local):
                data = self._read_range(self.store, shard, start, base, end)
            else:
                data = self._read_file(shard, base, end)
        samples = []
        for s in range(start, stop):
            key = index.keys.item(s)
            sample = {"__key__": key}
            for m in range(starts.item(s), starts.item(s + 1)):
                ext = exts[ext_ids.item(m)]
                at, size = offsets.item(m) - base, sizes.item(m)
                problem = header_problem(data, at, f"{key}.{ext}", size)
                if problem is not None:
                    raise ShardError(
                        f"{self.paths[shard]}: sample {s} of the shard (sample {self.firsts[shard] + s} of the "
                        f"dataset, key {key!r}), member {ext!r}: {problem}. The index does not match the tar (a "
                        f"stale or edited index, or a changed tar); {VERIFY_HINT}, then pack again or restore the "
                        f"files"
                    )
                sample[ext] = data[at : at + size]
            samples.append(sample)
        return samples

    def run_end(self, shard: int, start: int, max_bytes: int) -> int:
        """Where a read of shard ``shard``'s samples from ``start`` ends: the
        samples whose bytes lie within ``max_bytes`` of its first (at least one)."""
        index = self.indexes[shard]
        first_byte = index.offsets.item(index.starts.item(start))
        members = int(np.searchsorted(index.offsets, first_byte + max_bytes, side="left"))
        stop = int(np.searchsorted(index.starts, members, side="right")) - 1
        return min(max(stop, start + 1), len(index))

    def prepare(self, sample: dict) -> Any:
        """A raw sample as the dataset hands it out: decoded by extension (unless
        ``decode=False``), then ``transform``-ed."""
        if self.decode:
            sample = {ext: value if ext == "__key__" else decode_member(ext, value) for ext, value in sample.items()}
        return self.transform(sample) if self.transform is not None else sample

    def _read_file(self, shard: int, base: int, end: int) -> bytes:
        """Bytes ``base`` to ``end`` of shard ``shard`` by one pread of its file (or its local copy)."""
        index = self.indexes[shard]
        if self._made_for is not None:  # (no store: the tar itself, checked to be the file the dataset was made for)
            return self._files.read(self.paths[shard], base, end, index.tar_bytes, made_for=(self._made_for, shard))
        name = getattr(self.store, "url", str)(self.paths[shard])
        try:
            return self._files.read(self.open_shard(shard), base, end, index.tar_bytes, name)
        except FileNotFoundError:
            # Another worker's fetch may evict the cached copy between our fetch and open: fetch it again.
            self._local.pop(shard, None)
            return self._files.read(self.open_shard(shard), base, end, index.tar_bytes, name)

    def _read_range(self, store: Store, shard: int, s: int, base: int, end: int) -> bytes:
        """Bytes ``base`` to ``end`` of shard ``shard`` (sample ``s``'s first header on), by one ranged read."""
        data = store.read(self.paths[shard], base, end)
        if len(data) != end - base:
            raise ShardError(
                f"{self.paths[shard]}: sample {s} of the shard: the store returned {len(data)} of its {end - base} "
                f"bytes ({base} to {end}); the object is shorter than its index says (changed or cut short). "
                f"Restore it or pack and upload again ({VERIFY_HINT})"
            )
        return data

    def __getitem__(self, i: int) -> Any:
        return self.prepare(self.raw(i))

    def stream(
        self, shuffle_shards: bool = False, seed: int = 0, prefetch: int = 2, shards_per_window: Optional[int] = None
    ) -> ShardStream:
        """The same samples as an IterableDataset that reads whole shards in
        turn (sequential reads), shuffled by shard when asked; from a store,
        each worker fetches its next ``prefetch`` shards while it reads one.
        With ``shards_per_window=K``, the block order of
        :class:`~conveyor.ShardBlockSampler`: windows of K shards, each
        read by one worker, its samples shuffled among themselves (see
        :class:`ShardStream`)."""
        return ShardStream(self, shuffle_shards, seed, prefetch, shards_per_window=shards_per_window)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_local"] = {}  # (each process fetches and opens its own; ShardFiles travels empty)
        return state

    def __repr__(self) -> str:
        return f"ShardDataset({len(self.paths)} shards, {len(self)} samples)"


__all__ = ["ShardDataset", "ShardStream", "ShardReader", "ShardError", "shard_paths", "index_for", "MANIFEST"]
