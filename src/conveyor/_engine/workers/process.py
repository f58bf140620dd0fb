"""The worker process: set up once, then load batches until told to stop.

    main ──Tasks──▶ [task pipe] ──▶ worker loop ──▶ fetch + collate into slot k ──▶ [result pipe] ──Batch headers─▶ main
                                      │
                                      ├─ stop flag (shared byte): checked before each task
                                      ├─ stack file: faulthandler writes the stack there on a crash or on request
                                      └─ the parent's end: the kernel kills the worker (Linux's
                                         PR_SET_PDEATHSIG), and a watch thread exits it (everywhere)

Actors:
  * ``run_worker``: sets up as its place says (``places.InProcess``: seeds,
    sets torch to one thread, calls ``worker_init_fn``), says Ready, then
    serves tasks in order, each under its batch's seed; arrays go straight
    into the task's shared-memory slot (``loading/rows.py``,
    ``transport/slots.py``); each result is sent the moment it is ready. An
    exception in user code becomes a ``TaskFailed`` and the loop goes on; ``SystemExit``
    or ``KeyboardInterrupt`` in user code, or a failure during set-up,
    becomes a ``Fatal`` and the worker exits (with the SystemExit's code).
  * ``_start_parent_watch``: where Linux has it, the kernel SIGKILLs the
    worker when its parent ends (``portable.die_with_parent``), whatever the
    worker is doing (a C call holding the GIL, stopped by SIGSTOP); and a
    daemon thread checks the parent every 0.1 s and exits the worker (the
    portable way, and the only one where the kernel's is not armed). Armed
    first in each entry, before any user code: spawn and forkserver
    workers arm the kernel's before their config (and the user's modules
    in it) loads, and give up at once if the parent has already ended.
  * ``worker_signals.reset``: the main process's signal handlers are not
    the worker's (what a worker does on each signal: worker_signals.py).

Entry points, one per start method: ``fork_entry`` (the config object is
inherited), ``pickled_entry`` (forkserver: the config arrives cloudpickled) and
``spawn_main`` (a fresh interpreter started by ``launch.py``; it does not
re-import the user's ``__main__``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pickle
import sys
import threading
import time
from typing import Any, Optional

from .. import portable
from ..loading.ending import INTERRUPTED_EXIT_CODE, Ending, fatal_message
from ..loading.places import PROCESS
from ..loading.serving import Serving, WorkerConfig, WorkerFds
from ..transport.messages import Fatal, Ready, Stop
from ..transport.slots import SlotWriters, StopFlag
from ..transport.wire import pack, read_frame, unpack, write_frame
from . import stacks, worker_signals

#: glibc returns freed memory above this much to the kernel; every sample a
#: dataset makes then lands on fresh pages, which cost ~10x more to write
#: than reused ones. Workers keep up to this much freed memory for reuse.
_MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
#: Allocations below this come from the reusable heap, not a fresh mmap.
_MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20

#: The longest a worker holds its first batch of an epoch while another
#: fills the epoch's first batch with every core (StopFlag.wait_while_filling):
#: that takes tens of milliseconds; the bound only keeps a slow one from
#: holding the others for long.
FIRST_BATCH_HOLD_S = 1.0
#: How often a worker checks that its parent is alive. Short enough that
#: workers of a killed main process are gone well within a second.
_PARENT_POLL_S = 0.1


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(0)


def _die_with(parent_pid: int, by_kernel: bool) -> None:
    """Ask the kernel to kill this process when its parent ends (where it
    can: ``by_kernel``), then exit now if the parent has ended already
    (this process is then some other's child: the kernel will not tell)."""
    if by_kernel:
        portable.die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(0)


def _start_parent_watch(parent_pid: Optional[int], die_with_parent: bool) -> None:
    expected = os.getppid() if parent_pid is None else parent_pid
    _die_with(expected, die_with_parent)
    threading.Thread(target=_watch_parent, args=(expected,), name="conveyor-parent-watch", daemon=True).start()


def die_with(parent_pid: Optional[int]) -> None:
    """In a process of conveyor's that is no loader worker (``conveyor
    pack``'s writers), started by a thread that lives as long as it:
    end with ``parent_pid`` (None: the parent it has now) as a worker
    does, by the kernel where it can, else by the watch thread; at once
    if that process has ended already."""
    _start_parent_watch(parent_pid, True)


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


def run_worker(config: WorkerConfig, task_fd: int, result_fd: int) -> int:
    """Serve tasks until ``Stop``, the end of the task pipe, or the parent's
    death; the exit code."""
    wid = config.worker_id
    stacks.install(config.fds.stack)
    try:
        fetcher = config.place.set_up(config)
    except BaseException:
        return _send_fatal(result_fd, fatal_message(wid, config.where, "start"))
    if not _send(result_fd, pack(Ready(wid))):
        return 0
    writers = SlotWriters(config.fds.slots)
    stop = StopFlag(config.fds.stop) if config.fds.stop is not None else None
    serving = Serving(config, fetcher, stop)
    while True:
        try:
            payload = read_frame(task_fd)
        except (EOFError, OSError):
            return 0
        try:
            tasks = unpack(payload)
        except BaseException:
            return _send_fatal(result_fd, fatal_message(wid, config.where, "read"))
        for task in tasks:
            if isinstance(task, Stop) or (stop is not None and stop.is_set()):
                return 0
            writer = writers.for_task(task.slot, task.slot_file)
            if task.fill_threads == 0 and stop is not None:
                if stop.wait_while_filling(FIRST_BATCH_HOLD_S):
                    # (the first batch is done: no need to stay out of its way; the task itself is not changed)
                    task = dataclasses.replace(task, fill_threads=1)
                elif stop.is_set():
                    return 0  # (stopped while it held)
            try:
                result = serving.serve(task, writer)
            except Ending as ending:
                return _send_fatal(result_fd, ending.fatal)
            finally:
                if task.fill_threads > 1 and stop is not None:
                    stop.filling(False)
            if not _send(result_fd, result):
                return 0


def _send(fd: int, payload: bytes) -> bool:
    """Send one frame; False once the main process is gone."""
    try:
        write_frame(fd, payload)
    except OSError:
        return False
    return True


def _send_fatal(fd: int, fatal: Fatal) -> int:
    _send(fd, pack(fatal))
    return fatal.exit_code


def _worker_main(config: WorkerConfig, task_fd: int, result_fd: int) -> None:
    code = 0
    try:
        worker_signals.reset()
        _start_parent_watch(config.parent_pid, config.die_with_parent)
        _keep_freed_memory()
        code = run_worker(config, task_fd, result_fd)
    except KeyboardInterrupt:
        # (a Ctrl-C that came before worker_signals.reset made the worker
        # ignore SIGINT: the main process raises KeyboardInterrupt and
        # stops the workers, so a worker leaves quietly)
        code = INTERRUPTED_EXIT_CODE
    finally:
        # Skip interpreter teardown: nothing of the worker's needs it, and
        # it can hang on threads or buffers left by user code.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def fork_entry(config: WorkerConfig, task_fd: int, result_fd: int) -> None:
    """Entry under ``fork``: close the main process's ends of every pipe
    this child inherited, so that end-of-file means what it says."""
    for fd in config.close_fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _worker_main(config, task_fd, result_fd)


def _config_failed(worker_id: int, result_fd: int) -> None:
    """The config did not unpickle here: say so, then exit."""
    code = _send_fatal(result_fd, fatal_message(worker_id, PROCESS.where(worker_id), "start"))
    os._exit(code)


def _release_forkserver_alive_fd() -> None:
    """The forkserver hands each child the main process's end of the pipe by
    which it learns that the main process died; while a worker holds it, the
    forkserver outlives a killed main process, and so do its workers (each
    waiting for the other). Close it: the worker starts no processes itself."""
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # (multiprocessing's own, private: the one place that fd is)
        fd = server._forkserver_alive_fd
        if fd is not None:
            os.close(fd)
            server._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass


def pickled_entry(worker_id: int, payload: bytes, task_fd: int, result_fd: int, shared_fds: tuple = ()) -> None:
    """Entry under ``forkserver``: the config arrives cloudpickled; the shared
    descriptors (:class:`WorkerFds`) arrive beside it, passed by the
    forkserver and renumbered. The kernel is asked to kill it with the
    forkserver (which ends with the main process) before the config, and
    the user's code in it, loads."""
    _release_forkserver_alive_fd()
    worker_signals.reset()
    _die_with(os.getppid(), True)
    try:
        config = pickle.loads(payload)
        config = dataclasses.replace(config, fds=WorkerFds.from_tuple(shared_fds))
    except BaseException:
        _config_failed(worker_id, result_fd)
    _worker_main(config, task_fd, result_fd)


def spawn_main() -> None:
    """Entry of a worker in a fresh interpreter (``python -c``): file
    descriptors come in argv, then a header and the cloudpickled config
    arrive on the task pipe. Until the config has loaded, stderr is the
    worker's stack file (what a failing start prints reaches the main
    process's error); then it is the main process's stderr again. The
    kernel is asked to kill it with its main process (argv says which pid,
    and whether the thread that started it lives as long) before the
    config, and the user's code in it, loads."""
    task_fd, result_fd, worker_id, stderr_fd, parent_pid, by_kernel = (int(a) for a in sys.argv[1:7])
    worker_signals.reset()
    _die_with(parent_pid, bool(by_kernel))
    try:
        (header,) = unpack(read_frame(task_fd))
        sys.path[:] = header["sys_path"]
        config = pickle.loads(read_frame(task_fd))
    except BaseException:
        _config_failed(worker_id, result_fd)
    if stderr_fd >= 0:
        _stderr_back(stderr_fd)
    _worker_main(config, task_fd, result_fd)


def _stderr_back(stderr_fd: int) -> None:
    """Hand on what the start printed (warnings, say) to the main process's
    stderr, make that stderr again, and empty the stack file for a crash."""
    sys.stderr.flush()
    captured = os.pread(2, 1 << 20, 0)
    os.ftruncate(2, 0)
    os.lseek(2, 0, os.SEEK_SET)
    os.dup2(stderr_fd, 2)
    os.close(stderr_fd)
    if captured:
        os.write(2, captured)
