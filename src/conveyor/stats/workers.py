"""Per-worker and per-node figures: which worker loaded how many batches,
how long it was busy, and on which node.

    StatsRecorder._add_pending ──worker ids, pids, samples, busy seconds (numpy columns)──▶ WorkerTotals.add
    StatsRecorder._mark_locked ──WorkerTotals.mark()──▶ PerWorker (raw totals, in the Mark)
    LoaderStats.from_mark ──per_worker(PerWorker, wall_s)──▶ (WorkerStats, ...), (NodeStats, ...)

A batch's record names who loaded it by the timing ids its worker had when
the batch arrived (``WorkerView.timing_ids``: worker id and pid), so a
batch counts under the node it was loaded on even if its worker later
moves. The pid says the node: a worker process, a worker thread (the main
process's pid), the main process itself (``num_workers=0``: worker id -1,
pid 0 in the record) and a Ray actor on the training process's node are
all on this machine, the node ``LOCAL``; a Ray actor on another node has
a negative pid of its own per node, by which ``_engine/workers/nodes.py``
names that node "address (node 1a2b3c4d)" (the first 8 hex digits of Ray's node id).

A worker is counted per (worker id, node): one started again on the same
node (each pass's workers, a worker restarted) keeps its record, with its
latest pid; one started again on another node (``RayWorkers(restart_lost=)``)
has a record on each node, each with the batches loaded there. A worker
appears once it has delivered a batch; a batch that raised has no record
(``errors``), so the workers' batches add up to ``batches - errors``.

Busy seconds are the batches' loading spans (fetch + collate + encode),
cut as ``workers_busy_fraction``'s are (loading.py). A worker on another
node is timed by that node's clock; its spans are placed on this machine's
clock as if each batch ended as it arrived (ray_actors._on_this_clock), so
its seconds are measured there but where they fall in time is placed.
"""

from __future__ import annotations

import dataclasses
import os
from array import array
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from .._engine.workers.nodes import LOCAL as LOCAL  # (the stats' and the trace's words for nodes)
from .._engine.workers.nodes import node_of as node_of


def _share(part: float, whole: float) -> float:
    """``part / whole`` within [0, 1] (as figures.share_of; 0 for an empty whole)."""
    return min(1.0, max(0.0, part / whole)) if whole > 0 else 0.0


@dataclass(frozen=True)
class WorkerStats:
    """One worker's batches and busy time on one node; durations in seconds."""

    #: The worker's id (``get_worker_info().id``); -1: the main process (``num_workers=0``).
    worker_id: int
    #: Its process's pid (the latest, if it was started again; a thread's is the main
    #: process's); None: on another node, where a pid means nothing here.
    pid: Optional[int]
    #: Where it ran: ``LOCAL`` (this machine) or "address (node 1a2b3c4d)" (another Ray node).
    node: str
    batches: int
    samples: int
    #: Seconds it spent loading (fetch, collate, encode) inside passes.
    busy_s: float
    #: ``busy_s`` / ``wall_s``: the share of the passes' wall time it was loading, in [0, 1].
    busy_fraction: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class NodeStats:
    """The workers of one node together; durations in seconds."""

    #: ``LOCAL`` (this machine) or "address (node 1a2b3c4d)" (another Ray node).
    node: str
    #: Its workers' ids, ascending.
    worker_ids: tuple[int, ...]
    batches: int
    samples: int
    #: Its workers' loading seconds, summed.
    busy_s: float
    #: The mean of its workers' ``busy_fraction``, in [0, 1].
    busy_fraction: float

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "worker_ids": list(self.worker_ids)}


class PerWorker(NamedTuple):
    """Running totals per (worker id, node) at one moment, in the order first
    seen; a part of the recorder's ``Mark``. Workers are only ever added, so an
    earlier mark's workers are the first ones of a later mark's."""

    keys: tuple[tuple[int, str], ...] = ()
    #: The latest timing pid of each (0: the main process).
    pids: tuple[int, ...] = ()
    batches: tuple[int, ...] = ()
    samples: tuple[int, ...] = ()
    busy_s: tuple[float, ...] = ()

    def minus(self, earlier: "PerWorker") -> "PerWorker":
        """The totals since ``earlier`` (a mark of the same recorder, taken first)."""
        n = len(self.keys)

        def less(now: tuple, then: tuple) -> tuple:
            return tuple(a - b for a, b in zip(now, then + (0,) * (n - len(then))))

        return self._replace(
            batches=less(self.batches, earlier.batches),
            samples=less(self.samples, earlier.samples),
            busy_s=less(self.busy_s, earlier.busy_s),
        )

    def less_busy(self, before: np.ndarray) -> "PerWorker":
        """``busy_s`` less ``before`` (seconds per worker by index; workers added
        since this mark have none of this mark's batches), kept at 0 or more."""
        cut = np.zeros(len(self.keys))
        shared = min(cut.size, before.size)
        cut[:shared] = before[:shared]
        return self._replace(busy_s=tuple(max(0.0, b - float(c)) for b, c in zip(self.busy_s, cut)))


class WorkerTotals:
    """Per-worker totals over every batch so far, and which worker loaded each
    of the latest batches (kept and dropped with the recorder's columns)."""

    def __init__(self) -> None:
        #: (worker id, timing pid) -> the worker's index, and (worker id, node) -> the same.
        self._by_ids: dict[tuple[int, int], int] = {}
        self._by_node: dict[tuple[int, str], int] = {}
        self._keys: list[tuple[int, str]] = []
        self._pids: list[int] = []
        self._batches = np.zeros(0, dtype=np.int64)
        self._samples = np.zeros(0, dtype=np.int64)
        self._busy = np.zeros(0, dtype=np.float64)
        #: The worker index of each kept batch, in delivery order.
        self._rows = array("q")

    def add(self, worker_ids: np.ndarray, pids: np.ndarray, samples: np.ndarray, busy_s: np.ndarray) -> None:
        """Add delivered batches: who loaded each (its timing ids), its samples and busy seconds."""
        if not worker_ids.size:
            return
        pairs = (worker_ids.astype(np.int64) << 32) | (pids.astype(np.int64) & 0xFFFFFFFF)
        # Read backwards, each pair's index is that of its latest batch.
        unique, latest, inverse = np.unique(pairs[::-1], return_index=True, return_inverse=True)
        lookup = np.empty(unique.size, dtype=np.int64)
        for u in np.argsort(-latest):  # (the latest last, so each worker keeps its latest pid)
            at = pairs.size - 1 - int(latest[u])
            ids = (int(worker_ids[at]), int(pids[at]))
            lookup[u] = index = self._index(ids)
            self._pids[index] = ids[1]
        rows = lookup[inverse.reshape(-1)[::-1]]
        count = len(self._keys)
        self._batches += np.bincount(rows, minlength=count)
        self._samples += np.bincount(rows, weights=samples, minlength=count).astype(np.int64)
        self._busy += np.bincount(rows, weights=busy_s, minlength=count)
        self._rows.frombytes(rows.tobytes())

    def _index(self, ids: tuple[int, int]) -> int:
        """The index of the worker with these timing ids, added if new."""
        index = self._by_ids.get(ids)
        if index is None:
            key = (ids[0], node_of(ids[1]))
            index = self._by_node.get(key)
            if index is None:
                index = self._by_node[key] = len(self._keys)
                self._keys.append(key)
                self._pids.append(ids[1])
                self._batches = np.append(self._batches, 0)
                self._samples = np.append(self._samples, 0)
                self._busy = np.append(self._busy, 0.0)
            self._by_ids[ids] = index
        return index

    def busy_each(self, first: int, last: int, seconds: np.ndarray) -> np.ndarray:
        """``seconds`` of the kept batches ``first:last`` (one per batch), summed per worker."""
        rows = np.frombuffer(self._rows[first:last], dtype=np.int64)
        return np.bincount(rows, weights=seconds, minlength=len(self._keys))

    def drop_oldest(self, count: int) -> None:
        """Forget which worker loaded the oldest ``count`` batches (the recorder folded their rows)."""
        del self._rows[:count]

    def mark(self) -> PerWorker:
        return PerWorker(
            keys=tuple(self._keys),
            pids=tuple(self._pids),
            batches=tuple(int(b) for b in self._batches),
            samples=tuple(int(s) for s in self._samples),
            busy_s=tuple(float(b) for b in self._busy),
        )


def per_worker(totals: PerWorker, wall_s: float) -> tuple[tuple[WorkerStats, ...], tuple[NodeStats, ...]]:
    """The figures of each worker (by node, then worker id; this machine
    first) and of each node, their shares over ``wall_s``."""
    main_pid = os.getpid()
    workers = sorted(
        (
            WorkerStats(
                worker_id=worker_id,
                pid=None if pid < 0 else (pid or main_pid),
                node=node,
                batches=batches,
                samples=samples,
                busy_s=busy,
                busy_fraction=_share(busy, wall_s),
            )
            for (worker_id, node), pid, batches, samples, busy in zip(*totals)
        ),
        key=lambda w: (w.node != LOCAL, w.node, w.worker_id),
    )
    nodes = []
    for node in dict.fromkeys(w.node for w in workers):
        own = [w for w in workers if w.node == node]
        nodes.append(
            NodeStats(
                node=node,
                worker_ids=tuple(w.worker_id for w in own),
                batches=sum(w.batches for w in own),
                samples=sum(w.samples for w in own),
                busy_s=sum(w.busy_s for w in own),
                busy_fraction=min(1.0, sum(w.busy_fraction for w in own) / len(own)),
            )
        )
    return tuple(workers), tuple(nodes)
