"""Which worker this is: ``get_worker_info()``.

A worker process sets ``current`` once; a worker thread (and each thread
reading samples for a worker, ``reads_in_flight``) has its own, which comes
first. A module of its own, importing nothing of conveyor's, so that
datasets can ask from anywhere.
"""

from __future__ import annotations

import dataclasses
import threading
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
        rng: the generators of the sample being loaded in this thread
            (``conveyor.sample_rng()``; the same draws for a sample whatever
            loads it).
        worker_method: how workers run: ``"multiprocessing"`` or ``"thread"``.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: Any = None
    worker_method: Optional[str] = "multiprocessing"


#: Set once in each worker process; None in the main process.
current: Optional[WorkerInfo] = None

_here = threading.local()


def thread_info() -> Optional[WorkerInfo]:
    """This thread's own WorkerInfo (a worker thread, a reading thread), or None."""
    return getattr(_here, "info", None)


def set_thread_info(info: Optional[WorkerInfo]) -> None:
    _here.info = info


def lend(info: Optional[WorkerInfo], rng: Any) -> None:
    """Make this reading thread answer as the worker that handed it a read
    (``info``), with its own sample generators ``rng``."""
    if info is None:
        return
    mine = getattr(_here, "info", None)
    if mine is None or getattr(_here, "lent_from", None) is not info:
        _here.info = dataclasses.replace(info, rng=rng)
        _here.lent_from = info


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
    info = getattr(_here, "info", None)
    return current if info is None else info
