"""Reading shards: a map-style dataset with random access, and a stream.

    ShardDataset(path)  ──▶ the shards (a folder with manifest.json, a list, a glob)
                        ──▶ each shard's index (its .idx file, or its headers read once)
    dataset[i]          ──▶ shard, sample ──▶ its members' bytes from the memory-mapped tar
                        ──▶ {"__key__": key, "jpg": b"...", "cls": 3} (decoded by extension)
    dataset.stream(...) ──▶ an IterableDataset: whole shards in turn, shuffled by shard
    store=Store(...)    ──▶ shards in an object store: a sample by one ranged read;
                            a stream by whole shards in the local cache, the next ones prefetched

Random access costs no ``open`` per sample: each process maps each shard
once, on first use (a map inherited through fork is dropped and made anew,
and a pickled dataset travels without its maps). So shuffling, exact resume
and identical batches for any number of workers hold as for any map-style
dataset.
"""

from __future__ import annotations

import glob
import io
import json
import mmap
import os
import random
from bisect import bisect_right
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from .._engine.info import get_worker_info
from ..dataset import IterableDataset
from ..sharding import distributed_world, torch_worker_info
from .records import ShardIndex, decode_member

MANIFEST = "manifest.json"


def shard_paths(source: Union[str, os.PathLike, Sequence], store: Any = None) -> list[str]:
    """The shards ``source`` names: a folder (its manifest's shards, else its
    ``*.tar`` files, sorted), a glob pattern, one tar, or a list of tars; in
    ``store`` (a conveyor.Store) when given, a folder of it."""
    if isinstance(source, (list, tuple)):
        return [str(p) for p in source]
    if store is not None:
        folder = str(source).strip("/")
        found = store.list(folder)
        manifest = f"{folder}/{MANIFEST}" if folder else MANIFEST
        if manifest in found:
            names = [shard["name"] for shard in json.loads(store.read(manifest))["shards"]]
            return [f"{folder}/{name}" if folder else name for name in names]
        return [p for p in found if p.endswith(".tar")]
    source = str(source)
    if os.path.isdir(source):
        manifest = os.path.join(source, MANIFEST)
        if os.path.exists(manifest):
            with open(manifest) as f:
                return [os.path.join(source, shard["name"]) for shard in json.load(f)["shards"]]
        return sorted(glob.glob(os.path.join(source, "*.tar")))
    if any(c in source for c in "*?["):
        return sorted(glob.glob(source))
    return [source]


def index_for(path: str, store: Any = None) -> ShardIndex:
    """A shard's index: its ``.idx`` file when there is one (conveyor pack
    writes it), else read from the tar's headers (for a shard in a store,
    from its local copy)."""
    if store is not None:
        try:
            return ShardIndex.load(io.BytesIO(store.read(path + ".idx")))
        except FileNotFoundError:
            return ShardIndex.scan(store.fetch(path))
    saved = path + ".idx"
    if os.path.exists(saved) and os.path.getmtime(saved) >= os.path.getmtime(path):
        return ShardIndex.load(saved)
    return ShardIndex.scan(path)


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
    """

    def __init__(
        self, source: Any, transform: Optional[Callable[[dict], Any]] = None, decode: bool = True, store: Any = None
    ):
        self.store = store
        self.paths = shard_paths(source, store)
        if not self.paths:
            raise ValueError(f"no shards found at {source!r} (a folder of .tar files, a glob, or a list of paths)")
        missing = [p for p in self.paths if store is None and not os.path.exists(p)]
        if missing:
            raise FileNotFoundError(f"shards not found: {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        self.indexes = [index_for(path, store) for path in self.paths]
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
        if self.store is None:
            return _map_file(self.paths[shard])
        try:
            return _map_file(self.store.fetch(self.paths[shard]))
        except FileNotFoundError:
            # Another worker's fetch may evict the cached copy between our fetch and open: fetch it again.
            return _map_file(self.store.fetch(self.paths[shard]))

    def close_shard(self, shard: int) -> None:
        """Let go of a shard's map (a stream is done with it)."""
        mapped = self._maps.pop(shard, None) if self._pid == os.getpid() else None
        if mapped is not None:
            mapped.close()

    def raw(self, i: int) -> dict:
        """Sample ``i``'s members as bytes, by extension, with its ``__key__``:
        from the shard's map, or (a shard in a store not fetched whole) by
        one ranged read of the sample's bytes."""
        shard, s = self.locate(i)
        index = self.indexes[shard]
        members = range(index.starts[s], index.starts[s + 1])
        if self.store is not None and (self._pid != os.getpid() or shard not in self._maps):
            base = int(index.offsets[members.start]) if len(members) else 0
            last = members.stop - 1
            data = self.store.read(self.paths[shard], base, int(index.offsets[last] + index.sizes[last])) if len(members) else b""
        else:
            base, data = 0, self.open_shard(shard)
        sample = {"__key__": str(index.keys[s])}
        for m in members:
            offset = int(index.offsets[m]) - base
            sample[index.exts[index.ext_ids[m]]] = data[offset : offset + int(index.sizes[m])]
        return sample

    def __getitem__(self, i: int) -> Any:
        sample = self.raw(i)
        if self.decode:
            sample = {ext: value if ext == "__key__" else decode_member(ext, value) for ext, value in sample.items()}
        return self.transform(sample) if self.transform is not None else sample

    def stream(self, shuffle_shards: bool = False, seed: int = 0, prefetch: int = 2) -> "ShardStream":
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


def _map_file(path: str) -> mmap.mmap:
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


class ShardStream(IterableDataset):
    """Whole shards in turn, each read front to back; the shards are shared
    out among workers (and ranks, as ``ShardedIterable`` does) by number, and
    shuffled per epoch with ``shuffle_shards`` (``set_epoch`` moves it on).
    Samples within a shard keep their order."""

    def __init__(self, dataset: ShardDataset, shuffle_shards: bool = False, seed: int = 0, prefetch: int = 2):
        self.dataset, self.shuffle_shards, self.seed, self.prefetch = dataset, shuffle_shards, seed, prefetch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shards(self) -> list[int]:
        """This worker's shards this epoch, in order."""
        order = list(range(len(self.dataset.paths)))
        if self.shuffle_shards:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        world, rank = distributed_world()
        info = get_worker_info() or torch_worker_info()  # (conveyor's loader, or torch's)
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return order[rank * workers + worker :: world * workers]

    def __iter__(self) -> "ShardReader":
        return ShardReader(self)

    def __len__(self) -> int:
        return len(self.dataset)


class ShardReader:
    """One pass of a ShardStream in one worker: its shards in order, each
    mapped while it is read (from a store: the next ones prefetched). Saves
    and loads where it stands (``state_dict``), so a resumed stream goes on
    from the sample after the last one delivered without reading again."""

    def __init__(self, stream: ShardStream):
        self._stream = stream
        self._shards = stream.shards()
        self._position = 0  # in self._shards
        self._sample = 0  # in that shard
        self._open: Optional[int] = None

    def __iter__(self) -> "ShardReader":
        return self

    def __next__(self) -> Any:
        ds = self._stream.dataset
        while self._position < len(self._shards):
            shard = self._shards[self._position]
            if self._sample < len(ds.indexes[shard]):
                if self._open != shard:
                    self._enter(shard)
                self._sample += 1
                return ds[ds.firsts[shard] + self._sample - 1]
            ds.close_shard(shard)
            self._open = None
            self._position, self._sample = self._position + 1, 0
        raise StopIteration

    def _enter(self, shard: int) -> None:
        ds, ahead = self._stream.dataset, self._stream.prefetch
        if ds.store is not None:  # (the next shards download while this one is read)
            ds.store.prefetch([ds.paths[k] for k in self._shards[self._position + 1 : self._position + 1 + ahead]])
        ds.open_shard(shard)
        self._open = shard

    def state_dict(self) -> dict:
        return {"shards": list(self._shards), "position": self._position, "sample": self._sample}

    def load_state_dict(self, state: dict) -> None:
        if list(state["shards"]) != self._shards:
            raise ValueError(
                f"ShardStream.load_state_dict: the state's shards {state['shards'][:8]} are not this worker's "
                f"{self._shards[:8]} (another shuffle seed, epoch, number of workers or ranks); resume with the "
                f"settings that saved it"
            )
        self._position, self._sample = int(state["position"]), int(state["sample"])


__all__ = ["ShardDataset", "ShardStream", "ShardReader", "shard_paths"]
