"""The worker process: set up once, then load batches until told to stop.

    main ──Tasks──▶ [task pipe] ──▶ worker loop ──▶ fetch + collate into slot k ──▶ [result pipe] ──Batch headers──▶ main
                                      │
                                      ├─ stop flag (shared byte): checked before each task
                                      └─ parent watch thread: exits when the main process is gone

Actors:
  * ``run_worker``: seeds, calls ``worker_init_fn``, says Ready, then serves
    tasks in order, each under its batch's seed; arrays go straight into the
    task's shared-memory slot (``rows.py``, ``shm.py``); an exception in user
    code becomes a ``TaskFailed`` and the loop goes on. Results of quick
    tasks travel together while more tasks wait.
  * ``_watch_parent``: a daemon thread; when the parent dies the worker exits
    at once, even in the middle of a long ``__getitem__``.

Entry points, one per start method: ``fork_entry`` (the config object is
inherited), ``pickled_entry`` (forkserver: the config arrives cloudpickled) and
``spawn_main`` (a fresh interpreter started by ``launch.py``; it does not
re-import the user's ``__main__``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import os
import pickle
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .. import rng
from .errors import capture_failure
from . import info as _info
from .fetch import EndOfData, FetchSpec, fetch_seeded, make_fetcher
from .info import WorkerInfo, get_worker_info  # noqa: F401  (re-exported)
from .messages import Batch, Exhausted, InitFailed, Ready, Stop, Task, TaskFailed
from .rows import RowPlacer
from .shm import SlotWriter, StopFlag, encode
from .torch_hook import when_torch_loads

#: glibc returns freed memory above this much to the kernel; every sample a
#: dataset makes then lands on fresh pages, which cost ~10x more to write
#: than reused ones. Workers keep up to this much freed memory for reuse.
_MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
#: Allocations below this come from the reusable heap, not a fresh mmap.
_MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20

#: Results of tasks quicker than this are held back while more tasks wait
#: in the pipe, and sent together; slower ones go at once (no added latency).
_BATCHING_MAX_TASK_S = 0.001
#: At most this many results travel in one write.
_MAX_RESULTS_PER_MESSAGE = 8

#: How often a worker checks that its parent is alive. Short enough that
#: workers of a killed main process are gone well within a second.
_PARENT_POLL_S = 0.1


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, in one object."""

    worker_id: int
    num_workers: int
    seed: int
    fetch: FetchSpec
    worker_init_fn: Optional[Callable[[int], None]]
    parent_pid: Optional[int]
    close_fds: tuple = ()
    #: This worker's shared-memory slots (memfd descriptors), by slot number.
    slot_fds: tuple = ()
    #: The shared stop flag's descriptor (None: shared memory is off).
    stop_fd: Optional[int] = None


def _set_worker_info(config: WorkerConfig) -> None:
    info = WorkerInfo(config.worker_id, config.num_workers, config.seed, config.fetch.dataset)
    object.__setattr__(info, "_frozen", True)
    _info.current = info

    def tell_torch(torch: Any) -> None:
        # Datasets written for torch ask torch.utils.data.get_worker_info()
        # to shard themselves; answer them too. Torch loaded late (inside
        # __getitem__) also gets the seed of the batch in hand.
        try:
            from torch.utils.data._utils import worker as torch_worker

            torch_worker._worker_info = torch_worker.WorkerInfo(
                id=config.worker_id, num_workers=config.num_workers, seed=config.seed, dataset=config.fetch.dataset
            )
        except Exception:  # an unusual torch build: conveyor's own answer still works
            pass
        if rng.current_seed is not None:
            torch.default_generator.manual_seed(rng.current_seed)

    when_torch_loads(tell_torch)


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(0)


def _start_parent_watch(parent_pid: Optional[int]) -> None:
    expected = os.getppid() if parent_pid is None else parent_pid
    if os.getppid() != expected:
        os._exit(0)
    threading.Thread(target=_watch_parent, args=(expected,), name="conveyor-parent-watch", daemon=True).start()


def _keep_freed_memory() -> None:
    """Let malloc reuse freed memory instead of giving it back and faulting
    in fresh pages for the next sample (glibc only; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    mallopt(m_trim_threshold, _MALLOC_TRIM_THRESHOLD_BYTES)
    mallopt(m_mmap_threshold, _MALLOC_MMAP_THRESHOLD_BYTES)


def _send(conn, *messages: Any) -> None:
    """Send one or more messages in one write (pickles back to back)."""
    conn.send_bytes(b"".join(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in messages))


def _result_bytes(message: Any, task: Task) -> bytes:
    """A result pickled; a batch that cannot be pickled becomes its TaskFailed."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        failure = capture_failure(message.worker_id, f"in DataLoader worker process {message.worker_id}")
        return pickle.dumps(
            TaskFailed(task.epoch_id, task.batch_index, message.worker_id, task.indices, failure),
            protocol=pickle.HIGHEST_PROTOCOL,
        )


def receive_all(conn) -> list:
    """Every message of one write made by :func:`_send` or a worker's flush."""
    data = conn.recv_bytes()
    stream = io.BytesIO(data)
    messages = []
    while stream.tell() < len(data):
        messages.append(pickle.load(stream))
    return messages


def receive(conn) -> Any:
    """Read one message sent by :func:`_send` (either direction)."""
    return pickle.loads(conn.recv_bytes())


def run_worker(config: WorkerConfig, task_conn, result_conn) -> None:
    """Serve tasks until ``Stop``, end of the task pipe, or the parent's death."""
    wid = config.worker_id
    where = f"in DataLoader worker process {wid}"
    try:
        rng.seed_global_generators(config.seed)
        _set_worker_info(config)
        if config.worker_init_fn is not None:
            config.worker_init_fn(wid)
        fetcher = make_fetcher(config.fetch, config.worker_id)
    except Exception:
        _send(result_conn, InitFailed(wid, capture_failure(wid, where)))
        return
    _send(result_conn, Ready(wid))
    writers = [SlotWriter(fd) for fd in config.slot_fds]
    stop = StopFlag(config.stop_fd) if config.stop_fd is not None else None
    noted = False
    epoch_id = None
    pending: deque = deque()
    outbox: list[bytes] = []
    while True:
        if not pending:
            if outbox and not _flush(result_conn, outbox):
                return
            try:
                pending.extend(receive_all(task_conn))
            except (EOFError, OSError):
                return
        task = pending.popleft()
        if isinstance(task, Stop) or (stop is not None and stop.is_set()):
            return
        if task.epoch_id != epoch_id:
            epoch_id = task.epoch_id
            if config.fetch.iterable:
                fetcher.restart(task.restore)
        started = time.perf_counter()
        writer = writers[task.slot] if task.slot is not None else None
        message = _load(config, fetcher, task, writer, where)
        if config.fetch.iterable and isinstance(message, (Batch, Exhausted)) and fetcher.stateful():
            message = dataclasses.replace(message, worker_state=fetcher.state())
        if writer is not None and writer.full and not noted and isinstance(message, Batch):
            noted = True
            message = dataclasses.replace(message, note=writer.full)
        outbox.append(_result_bytes(message, task))
        message = None  # let the batch go before the next task
        if writer is not None:
            writer.end()
        # Quick batches with more tasks already queued travel together: one
        # write and one wake-up of the main process for several.
        quick = time.perf_counter() - started < _BATCHING_MAX_TASK_S
        more = bool(pending) or task_conn.poll(0)
        if not (quick and more and len(outbox) < _MAX_RESULTS_PER_MESSAGE):
            if not _flush(result_conn, outbox):
                return


def _flush(conn, outbox: list) -> bool:
    """Send the results gathered so far; False once the main process is gone."""
    try:
        conn.send_bytes(b"".join(outbox))
    except (BrokenPipeError, OSError):
        return False
    outbox.clear()
    return True


def _load(config: WorkerConfig, fetcher: Any, task: Task, writer: Optional[SlotWriter], where: str) -> Any:
    """Load one task into a result message: a Batch (arrays in the slot when
    there is one), Exhausted, or TaskFailed."""
    wid = config.worker_id
    spec = config.fetch
    allocate = None
    if spec.collate_into is not None:
        # conveyor's own collate: numpy leaves, straight into the slot if any;
        # the main process converts to torch if the user asked for tensors.
        allocate = writer.allocate if writer is not None else np.empty
        if writer is not None and spec.auto_collation and not spec.iterable:
            allocate = RowPlacer(writer, len(task.indices))
    try:
        if writer is not None:
            writer.begin()
        data = fetch_seeded(fetcher, task.indices, task.seed, allocate)
        if writer is None:
            return Batch(task.epoch_id, task.batch_index, wid, data)
        encoded, used = encode(data, writer)
        return Batch(task.epoch_id, task.batch_index, wid, encoded, used, writer.size)
    except EndOfData:
        return Exhausted(task.epoch_id, task.batch_index, wid)
    except Exception:
        return TaskFailed(task.epoch_id, task.batch_index, wid, task.indices, capture_failure(wid, where))


def _worker_main(config: WorkerConfig, task_conn, result_conn) -> None:
    # Ctrl-C reaches the whole process group; the main process raises
    # KeyboardInterrupt and stops the workers, so a worker leaves quietly.
    try:
        _start_parent_watch(config.parent_pid)
        _keep_freed_memory()
        run_worker(config, task_conn, result_conn)
    except KeyboardInterrupt:
        pass
    finally:
        # Skip interpreter teardown: nothing of the worker's needs it, and
        # it can hang on threads or buffers left by user code.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def fork_entry(config: WorkerConfig, task_conn, result_conn) -> None:
    """Entry under ``fork``: close the main process's ends of every pipe
    this child inherited, so that end-of-file means what it says."""
    for fd in config.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _worker_main(config, task_conn, result_conn)


def _config_failed(worker_id: int, result_conn) -> None:
    _send(result_conn, InitFailed(worker_id, capture_failure(worker_id, f"in DataLoader worker process {worker_id}")))
    sys.stderr.flush()
    os._exit(0)


def _release_forkserver_alive_fd() -> None:
    """The forkserver hands each child the main process's end of the pipe by
    which it learns that the main process died; while a worker holds it, the
    forkserver outlives a killed main process, and so do its workers (each
    waiting for the other). Close it: the worker starts no processes itself."""
    try:
        from multiprocessing import forkserver

        fd = forkserver._forkserver._forkserver_alive_fd
        if fd is not None:
            os.close(fd)
            forkserver._forkserver._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass


def pickled_entry(worker_id: int, payload: bytes, task_conn, result_conn, shared_fds: tuple = ()) -> None:
    """Entry under ``forkserver``: the config arrives cloudpickled; the shared
    memory descriptors (stop flag, then slots) arrive beside it, passed by
    the forkserver and renumbered."""
    _release_forkserver_alive_fd()
    try:
        config = pickle.loads(payload)
        if shared_fds:
            stop_fd, *slot_fds = (int(fd) for fd in shared_fds)
            config = dataclasses.replace(config, stop_fd=stop_fd, slot_fds=tuple(slot_fds))
    except Exception:
        _config_failed(worker_id, result_conn)
    _worker_main(config, task_conn, result_conn)


def spawn_main() -> None:
    """Entry of a worker in a fresh interpreter (``python -c``): file
    descriptors come in argv, then a header and the cloudpickled config
    arrive on the task pipe."""
    from multiprocessing.connection import Connection

    task_fd, result_fd, worker_id = (int(a) for a in sys.argv[1:4])
    task_conn = Connection(task_fd, writable=False)
    result_conn = Connection(result_fd, readable=False)
    try:
        header = receive(task_conn)
        sys.path[:] = header["sys_path"]
        config = pickle.loads(task_conn.recv_bytes())
    except Exception:
        _config_failed(worker_id, result_conn)
    _worker_main(config, task_conn, result_conn)
