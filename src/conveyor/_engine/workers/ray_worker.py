"""The worker on a Ray cluster (``worker_method="ray"``; its main-process side
is ray_actors.py): one actor per worker, which sets up as a worker process
does and loads each task with ``Serving.load`` at its place, ``places.InProcess``.

    main ──set_up(worker id, sys.path, cloudpickled config)──▶ LoadingActor ──▶ Ready | Fatal, (pid, node)
    main ──load(task)──▶ LoadingActor ──▶ Batch (arrays of its own) | TaskFailed | Exhausted | Fatal

Its answers are returned through Ray's object store; one that does not
pickle fails its batch (TaskFailed), as in a worker process.
"""

from __future__ import annotations

import os
import pickle
import sys
from typing import Any, Optional

from ..loading.ending import Ending, fatal_message
from ..loading.places import PROCESS
from ..loading.serving import Serving, WorkerConfig
from ..transport.messages import Ready, Task
from ..transport.pickling import dumps, find_unpicklable


class LoadingActor:
    """One worker on the cluster (made a Ray actor class in ``start``)."""

    def __init__(self) -> None:
        self._serving: Optional[Serving] = None

    def set_up(self, worker_id: int, sys_path: list, payload: bytes) -> tuple:
        """Unpickle the config and set up as a worker process does; (Ready
        or Fatal, (pid, node id, node address))."""
        import ray

        for entry in sys_path:
            if entry not in sys.path:
                sys.path.append(entry)
        context = ray.get_runtime_context()
        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # (Ray's, unannotated)
        where = (os.getpid(), context.get_node_id(), address)
        try:
            config: WorkerConfig = pickle.loads(payload)
            fetcher = config.place.set_up(config)
        except BaseException:
            return fatal_message(worker_id, PROCESS.where(worker_id), "start"), where
        self._serving = Serving(config, fetcher)
        return Ready(worker_id), where

    def load(self, task: Task) -> Any:
        """The task's answer (Batch, TaskFailed, Exhausted), or the Fatal of
        user code that ended the worker (which then loads nothing more)."""
        serving = self._serving
        if serving is None:
            raise RuntimeError("this conveyor worker has ended")
        try:
            message = serving.load(task)
        except Ending as ending:
            self._serving = None
            return ending.fatal
        try:  # (as a worker process: an answer that does not pickle fails its batch, and the pass goes on)
            _check_pickles(message)
        except Exception:
            return serving.failed(task, "while sending its result to the main process")
        return message


def _check_pickles(message: Any) -> None:
    """Raise what Ray's pickling of ``message`` would raise after the call
    returned. The arrays are left out of band, not copied: it costs a walk
    of the batch's structure, not of its bytes."""
    from ray import cloudpickle

    cloudpickle.dumps(message, protocol=5, buffer_callback=_out_of_band)  # type: ignore[no-untyped-call]  # (Ray's, unannotated)


def _out_of_band(buffer: Any) -> bool:
    return False


def pickle_config(config: WorkerConfig) -> bytes:
    """The config cloudpickled (what ``__main__`` defines travels by value),
    or a TypeError naming what does not pickle."""
    try:
        return dumps(config)
    except Exception as exc:
        fields = {
            "dataset": config.fetch.dataset,
            "collate_fn": config.fetch.collate_fn,
            "worker_init_fn": config.worker_init_fn,
        }
        path, culprit = next(
            (found for name, obj in fields.items() if (found := find_unpicklable(obj, name)) is not None),
            ("the worker's config", config),
        )
        raise TypeError(
            f"conveyor: cannot send {path} to Ray workers: it is a {type(culprit).__module__}."
            f"{type(culprit).__qualname__}, which cannot be pickled ({exc}). Open such resources lazily inside "
            f"the worker (in __getitem__/__iter__ or worker_init_fn), or leave them out of the pickled state "
            f"with __getstate__/__setstate__."
        ) from exc
