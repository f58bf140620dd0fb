"""Which worker this process is: ``get_worker_info()``.

A module of its own, importing nothing of conveyor's, so that datasets can
ask from anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class WorkerInfo:
    """What :func:`get_worker_info` returns inside a worker (the fields of
    torch's ``WorkerInfo``; read-only, as torch's).

    Attributes:
        id: this worker's id, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: the seed this worker's generators got at start
            (``base_seed + id``, as in torch).
        dataset: this process's copy of the dataset.
        rng: None (torch keeps a random-state container here for thread
            workers; conveyor seeds each batch instead, see docs/differences.md).
        worker_method: how workers run: ``"multiprocessing"``.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: Any = None
    worker_method: Optional[str] = "multiprocessing"


#: Set once in each worker process; None in the main process.
current: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[WorkerInfo]:
    """Information about the current worker, or ``None`` in the main process.

    Use it in an ``IterableDataset.__iter__`` or a ``worker_init_fn`` to give
    each worker its own share of the data::

        info = get_worker_info()
        if info is None:          # loading in the main process
            start, step = 0, 1
        else:
            start, step = info.id, info.num_workers
    """
    return current
