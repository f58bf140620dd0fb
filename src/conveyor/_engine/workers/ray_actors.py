"""Ray actor workers (``worker_method="ray"`` or ``conveyor.RayWorkers(...)``):
the worker loop in one Ray actor per worker, anywhere on the cluster.

    executor ──send: Task──▶ actor.load.remote(task) ──▶ Serving.load ──▶ Batch (arrays of its own)
             ◀──wait: ray.wait over the refs in hand, each worker's answers in order──
             ──decode: the batch's arrays from Ray's object store (copied where read-only)

Each actor (ray_worker.py) sets up as a worker process does (its place,
``places.InProcess``: seeded, ``get_worker_info()``, ``worker_init_fn``, its
fetcher), then loads each task with the same ``Serving.load`` as a worker
process (the global generators seeded per batch), so a batch is the one a local worker process makes for
the same task. What differs:

* no shared-memory slots (they cannot cross machines): a batch is collated
  into arrays of its own and returned through Ray's object store;
* the config travels cloudpickled with the main process's ``sys.path``
  (as to a spawned worker), so the user's own modules import on this node;
* a lost actor (killed, its node gone) resolves its refs with Ray's error:
  the worker is EXITED and ``exit_error`` names its node and the batch in
  hand; with ``RayWorkers(restart_lost=n)`` a new actor takes its place and
  its batches in hand are loaded again (map-style datasets);
* an actor Ray cannot place within ``start_timeout`` ends as a worker that
  died while starting, naming what it asked for;
* there is no stack to ask a remote actor for (``stack_text`` is "").

``import ray`` happens only in :meth:`RayActorWorkers.start` and in the
actors: the core never needs Ray.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
import time
from typing import Any, Callable, Optional

import numpy as np

from ...ray_options import RayWorkers
from ..errors import WorkerDiedError
from ..loading.serving import WorkerConfig, WorkerFds
from ..transport.messages import Batch, Fatal, Ready, Task
from ..transport.tree import map_leaves
from .nodes import remote_timing_pid
from .protocol import EXITED, AllAtOnce, Broken, NoSlots
from .ray_handle import RayHandle
from .ray_worker import LoadingActor, pickle_config

#: The longest one wait on Ray blocks before the executor looks again (its
#: deadline, the stall watchdog, a start that takes too long).
_WAIT_SLICE_S = 1.0
#: How long reading a result that Ray says is ready may take (a transfer from another node).
_GET_TIMEOUT_S = 120.0
#: After a stop, how long to wait for this node's actor processes to end.
_STOP_WAIT_S = 5.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"worker_method='ray' needs Ray: pip install 'conveyor[ray]' ({exc})") from exc
    return ray


def _lost_errors(ray: Any) -> tuple:
    """Ray's errors for an actor, its process or its node gone."""
    found = ray.exceptions
    return (found.RayActorError, found.ObjectLostError, found.WorkerCrashedError, found.NodeDiedError)


class RayActorWorkers(NoSlots, AllAtOnce):
    """The Ray actors of one executor (a workers.Workers)."""

    #: A forked child of the user's process is no Ray driver of these actors.
    process_bound = True
    transports = True

    def __init__(self, options: Optional[RayWorkers] = None) -> None:
        self.options = options if options is not None else RayWorkers()
        self.workers: list[RayHandle] = []
        self._ray: Any = None
        self._actor_class: Any = None
        self._payloads: dict[int, bytes] = {}
        self._restarts_left = self.options.restart_lost
        self._restartable = False
        self._here = ""

    # --------------------------------------------------------------- start
    def start(
        self, make_config: Callable[[int, WorkerFds, tuple], WorkerConfig], num_workers: int, num_slots: int
    ) -> None:
        """Connect to Ray (``ray.init()`` when the user has not), pickle
        each worker's config and start its actor; no slots."""
        ray = self._ray = _import_ray()
        configs = [make_config(wid, WorkerFds(), ()) for wid in range(num_workers)]
        self._restartable = bool(configs) and configs[0].fetch.kind.reloads_lost
        self._payloads = {config.worker_id: pickle_config(config) for config in configs}
        _connect(ray)
        self._actor_class = ray.remote(LoadingActor)
        self._here = ray.get_runtime_context().get_node_id()
        try:
            for wid in range(num_workers):
                handle = RayHandle(wid)
                self.workers.append(handle)
                self._start_actor(handle)
        except BaseException:
            self.stop()
            raise

    def _start_actor(self, handle: RayHandle) -> None:
        options = self.options.actor_options()
        handle.actor = self._actor_class.options(**options).remote()
        handle.setting_up = handle.actor.set_up.remote(handle.id, list(sys.path), self._payloads[handle.id])
        handle.start_by = time.monotonic() + self.options.start_timeout
        handle.ready = False

    @property
    def watched(self) -> bool:
        return any(not worker.exited for worker in self.workers)

    @property
    def small_batches(self) -> bool:
        """Never judged small: the window stays ``prefetch_factor × num_workers``."""
        return False

    def begin_epoch(self, epoch_id: int, restore: dict) -> Optional[dict]:
        """Actors start each epoch at its first task (``Task.restore``): nothing to do now."""
        return None

    # ------------------------------------------------------------ messages
    def send(self, worker: RayHandle, tasks: list[Task]) -> None:
        if worker.exited:
            return
        for task in tasks:
            try:
                ref = worker.actor.load.remote(task)
            except Exception as exc:
                raise Broken(worker, task.batch_index, "could not send the task of", exc) from None
            worker.calls.append((task, ref))

    def wait(self, timeout_s: Optional[float]) -> list[tuple[RayHandle, Any]]:
        """(worker, message) for each answer that arrived, each worker's in
        the order sent, and (worker, EXITED) for a worker lost or ended; []
        at the timeout (at most ``_WAIT_SLICE_S`` a call)."""
        ray = self._ray
        arrived: list[tuple[RayHandle, Any]] = []
        now = time.monotonic()
        for worker in self.workers:
            if worker.setting_up is not None and now >= worker.start_by:
                self._start_timed_out(worker, arrived)
        refs = [ref for worker in self.workers if not worker.exited for ref in _refs_in_hand(worker)]
        if arrived:
            timeout_s = 0.0
        slice_s = _WAIT_SLICE_S if timeout_s is None else min(timeout_s, _WAIT_SLICE_S)
        starts = [worker.start_by - now for worker in self.workers if worker.setting_up is not None]
        slice_s = max(0.0, min([slice_s, *starts]))
        if not refs:
            if slice_s > 0:
                time.sleep(min(slice_s, 0.05))
            return arrived
        try:
            ready, _ = ray.wait(refs, num_returns=1, timeout=slice_s)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        except Exception as exc:  # (Ray itself gone, say: the one failure path, naming a worker)
            raise Broken(self.workers[0], None, "could not wait for the result of", exc) from None
        done = set(ready)
        for worker in list(self.workers):
            if not worker.exited:
                self._take(worker, done, arrived)
        return arrived

    def _take(self, worker: RayHandle, done: set, arrived: list) -> None:
        """Read the worker's answers that are ready, in the order sent."""
        ray, lost = self._ray, _lost_errors(self._ray)
        if worker.setting_up is not None:
            if worker.setting_up not in done:
                return
            ref, worker.setting_up = worker.setting_up, None
            try:
                message, (pid, node_id, address) = ray.get(ref, timeout=_GET_TIMEOUT_S)
            except lost as exc:
                self._on_lost(worker, exc, arrived)
                return
            except Exception as exc:
                raise Broken(worker, None, "could not read the start of", exc) from None
            worker.process_id, worker.node_id, worker.node_address = pid, node_id, address
            worker.on_this_node = node_id == self._here
            if not worker.on_this_node:
                worker.remote_pid = remote_timing_pid(node_id, address, worker.id)
            worker.ready = isinstance(message, Ready)
            if not (worker.ready and worker.restarted):  # (a restart's Ready would count as a new start-up)
                arrived.append((worker, message))
            if isinstance(message, Fatal):
                self._end(worker, arrived)
                return
        while worker.calls and worker.calls[0][1] in done:
            task, ref = worker.calls[0]
            try:
                message = ray.get(ref, timeout=_GET_TIMEOUT_S)
            except lost as exc:
                self._on_lost(worker, exc, arrived)
                return
            except Exception as exc:
                raise Broken(worker, task.batch_index, "could not read the result of", exc) from None
            worker.calls.popleft()
            if not worker.on_this_node and isinstance(message, Batch) and message.times is not None:
                message = _on_this_clock(message)
            arrived.append((worker, message))
            if isinstance(message, Fatal):
                self._end(worker, arrived)
                return

    # ------------------------------------------------------------ failures
    def _on_lost(self, worker: RayHandle, exc: BaseException, arrived: list) -> None:
        """Its actor, process or node is gone: start another in its place
        and send it the tasks in hand again (``restart_lost``), or end it."""
        worker.lost = _first_lines(str(exc))
        if self._restartable and self._restarts_left > 0:
            self._restarts_left -= 1
            tasks = [task for task, _ in worker.calls]
            worker.calls.clear()
            _kill(self._ray, worker.actor)
            worker.process_id, worker.node_id, worker.node_address = 0, "", ""
            worker.restarted = True
            self._start_actor(worker)
            self.send(worker, tasks)
            return
        self._end(worker, arrived)

    def _start_timed_out(self, worker: RayHandle, arrived: list) -> None:
        try:
            available = self._ray.available_resources()
        except Exception:
            available = "unknown"
        worker.lost = (
            f"Ray did not start its actor within start_timeout={self.options.start_timeout} s. It asks for "
            f"{self.options.describe()}; the cluster has available now: {available}. Start nodes with those "
            f"resources, ask for fewer (RayWorkers(num_cpus=...)), or raise RayWorkers(start_timeout=...)."
        )
        worker.setting_up = None
        self._end(worker, arrived)

    def _end(self, worker: RayHandle, arrived: list) -> None:
        worker.exited = True
        worker.calls.clear()
        worker.setting_up = None
        _kill(self._ray, worker.actor)
        arrived.append((worker, EXITED))

    def decode(self, worker: RayHandle, task: Task, message: Batch) -> Any:
        """The batch's arrays: what Ray's object store hands out read-only
        is copied, so the user may write them as a local worker's, unless
        ``RayWorkers(writable=False)`` asks for the store's own (no copy)."""
        if not self.options.writable:
            return message.data
        return map_leaves(message.data, _writable)

    def exit_error(self, worker: RayHandle, what: Optional[str], starting: bool = False) -> BaseException:
        """Which worker, on which node, doing what, and what Ray said."""
        if starting:
            text = (
                f"DataLoader worker {worker.id} ({worker.where()}) ended while starting, before it was ready "
                f"(conveyor: worker_method='ray', each actor asking for {self.options.describe()})."
            )
        else:
            doing = f"It was loading {what}." if what is not None else "It had no batch in hand."
            text = f"DataLoader worker {worker.id} ({worker.where()}) was lost (conveyor: {doing})"
            if self.options.restart_lost:
                text += f" The {self.options.restart_lost} restart(s) RayWorkers(restart_lost=) allows are used up."
        if worker.lost:
            text += f"\nRay: {worker.lost}"
        return WorkerDiedError(text)

    # ---------------------------------------------------------------- stop
    def stop(self) -> None:
        """Kill every actor and wait (bounded) for this node's actor
        processes to end; safe to call twice. Ray itself is the user's
        (or conveyor's until this process ends: _connect) and is left
        running. Once Ray is shut down (by the user, or at the exit of
        this process, before a loader left alive is collected) its actors
        have ended with it, and no call is made: each of Ray's calls would
        start a new Ray instance of its own (``ray.init``), which nothing
        would ever stop."""
        workers, self.workers = self.workers, []
        if not workers or self._ray is None:
            return
        if not self._ray.is_initialized():
            for worker in workers:
                worker.exited = True
                worker.calls.clear()
            return
        for worker in workers:
            _kill(self._ray, worker.actor)
            worker.exited = True
            worker.calls.clear()
        try:
            here = self._ray.get_runtime_context().get_node_id()
        except Exception:
            return
        local = [w.process_id for w in workers if w.process_id and w.node_id == here]
        deadline = time.monotonic() + _STOP_WAIT_S
        while local and time.monotonic() < deadline:
            local = [pid for pid in local if os.path.exists(f"/proc/{pid}")]  # (until reaped, not only dead)
            if local:
                time.sleep(0.02)

    def let_go(self) -> None:
        """In a forked child: the actors are the parent's; forget them."""
        self.workers = []


def _refs_in_hand(worker: RayHandle) -> list:
    refs = [ref for _, ref in worker.calls]
    if worker.setting_up is not None:
        refs.append(worker.setting_up)
    return refs


def _on_this_clock(message: Batch) -> Batch:
    """A batch from another node, its start on this machine's clock (another
    machine's perf_counter means nothing here): as if it ended as it arrived."""
    times = message.times
    assert times is not None
    started_at = time.perf_counter() - (times.fetch_s + times.collate_s + times.encode_s)
    return dataclasses.replace(message, times=times._replace(started_at=started_at))


def _writable(leaf: Any) -> Any:
    if isinstance(leaf, np.ndarray) and not leaf.flags.writeable:
        return np.array(leaf)
    return leaf


_started_ray = False


def _connect(ray: Any) -> None:
    """Connect to the user's Ray, or start one (``ray.init()``) when the
    user has not; a Ray that conveyor started is shut down when this
    process exits, before the finalizers of loaders left alive run, so that
    nothing of it is left running whether the script calls
    ``ray.shutdown()`` or not."""
    global _started_ray
    if ray.is_initialized():
        return
    ray.init()
    if not _started_ray:
        _started_ray = True
        atexit.register(_stop_started_ray, ray, os.getpid())


def _stop_started_ray(ray: Any, pid: int) -> None:
    """At exit: shut down the Ray that conveyor started, if it still runs
    (in the process that started it: not in a child forked from it)."""
    if os.getpid() == pid and ray.is_initialized():
        ray.shutdown()


def _kill(ray: Any, actor: Any) -> None:
    if actor is None:
        return
    try:
        ray.kill(actor, no_restart=True)
    except Exception:
        pass  # (gone already, or Ray is shut down: nothing left to end)


def _first_lines(text: str, count: int = 12) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:count] + (["…"] if len(lines) > count else []))
