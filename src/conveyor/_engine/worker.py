"""The worker process: set up once, then load batches until told to stop.

    main ──Tasks──▶ [task pipe] ──▶ worker loop ──▶ fetch + collate into slot k ──▶ [result pipe] ──Batch headers──▶ main
                                      │
                                      ├─ stop flag (shared byte): checked before each task
                                      ├─ stack file: faulthandler writes the stack there on a crash or on request
                                      └─ the parent's end: the kernel kills the worker (Linux's
                                         PR_SET_PDEATHSIG), and a watch thread exits it (everywhere)

Actors:
  * ``run_worker``: seeds, sets torch to one thread, calls ``worker_init_fn``,
    says Ready, then serves tasks in order, each under its batch's seed;
    arrays go straight into the task's shared-memory slot (``rows.py``,
    ``shm.py``); each result is sent the moment it is ready. An exception in
    user code becomes a ``TaskFailed`` and the loop goes on; ``SystemExit``
    or ``KeyboardInterrupt`` in user code, or a failure during set-up,
    becomes a ``Fatal`` and the worker exits (with the SystemExit's code).
  * ``_start_parent_watch``: where Linux has it, the kernel SIGKILLs the
    worker when its parent ends (``portable.die_with_parent``), whatever the
    worker is doing (a C call holding the GIL, stopped by SIGSTOP); and a
    daemon thread checks the parent every 0.1 s and exits the worker (the
    portable way, and the only one where the kernel's is not armed).

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
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable, Optional


from .. import rng
from . import info as _info
from . import portable
from . import stacks
from .errors import capture_failure
from .cpu import ThreadClock
from .fetch import EmptyBatch, EndOfData, FetchSpec, StageClock, fetch_seeded, make_fetcher
from .info import WorkerInfo
from .messages import Batch, Exhausted, Fatal, Ready, Stop, Task, TaskFailed, pack_load_times
from ..collate import allocate_batch
from .rows import RowPlacer, SlotAllocator
from .shm import SlotWriter, StopFlag, encode
from .torch_hook import when_torch_loads
from .wire import pack, read_frame, unpack, write_frame

#: glibc returns freed memory above this much to the kernel; every sample a
#: dataset makes then lands on fresh pages, which cost ~10x more to write
#: than reused ones. Workers keep up to this much freed memory for reuse.
_MALLOC_TRIM_THRESHOLD_BYTES = 256 << 20
#: Allocations below this come from the reusable heap, not a fresh mmap.
_MALLOC_MMAP_THRESHOLD_BYTES = 32 << 20

#: How often a worker checks that its parent is alive. Short enough that
#: workers of a killed main process are gone well within a second.
_PARENT_POLL_S = 0.1
#: The exit code of a worker interrupted by KeyboardInterrupt (as a shell reports SIGINT).
_INTERRUPTED_EXIT_CODE = 128 + 2


@dataclass(frozen=True)
class WorkerFds:
    """The shared descriptors a worker inherits (None or empty: that feature is off)."""

    #: The shared stop flag.
    stop: Optional[int] = None
    #: Where faulthandler writes this worker's stack (stacks.StackFile).
    stack: Optional[int] = None
    #: The pool's shared-memory slots, by slot number.
    slots: tuple = ()

    def as_tuple(self) -> tuple:
        """Every descriptor, in a fixed order (see :meth:`from_tuple`)."""
        return (-1 if self.stop is None else self.stop, -1 if self.stack is None else self.stack, *self.slots)

    @classmethod
    def from_tuple(cls, fds: tuple) -> "WorkerFds":
        stop, stack, *slots = (int(fd) for fd in fds)
        return cls(None if stop < 0 else stop, None if stack < 0 else stack, tuple(slots))


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs, in one object."""

    worker_id: int
    num_workers: int
    seed: int
    fetch: FetchSpec
    worker_init_fn: Optional[Callable[[int], None]]
    parent_pid: Optional[int]
    #: Descriptors of the main process a forked worker closes (its pipe ends).
    close_fds: tuple = ()
    fds: WorkerFds = WorkerFds()
    #: Time each batch's stages (for the loader's stats).
    timed: bool = True
    #: A thread of the main process (threads.py), not a process: the global
    #: generators belong to the main process and are left alone.
    in_thread: bool = False
    #: Ask the kernel to kill the worker when its parent ends. Linux sends
    #: that signal when the *thread* that started the worker ends, so the
    #: pool asks only when that thread lives as long as the process (the
    #: main thread, or the forkserver's one thread).
    die_with_parent: bool = False

    @property
    def where(self) -> str:
        """Where user code runs, in torch's words: "in DataLoader worker process 0"."""
        return f"in DataLoader worker {'thread' if self.in_thread else 'process'} {self.worker_id}"


def _set_worker_info(config: WorkerConfig) -> None:
    _info.current = WorkerInfo(
        config.worker_id, config.num_workers, config.seed, config.fetch.dataset, rng.thread_sample_random()
    )

    def tell_torch(torch: Any) -> None:
        # One intra-op thread per worker, as torch's workers: N workers each
        # running every core's worth of threads only fight, and a thread pool
        # inherited through fork hangs on its first use (PyTorch issue 53565).
        # worker_init_fn runs after this and may choose otherwise.
        torch.set_num_threads(1)
        # Datasets written for torch ask torch.utils.data.get_worker_info()
        # to shard themselves; answer them too. Torch loaded late (inside
        # __getitem__) also gets the seed of the batch in hand.
        try:
            from torch.utils.data._utils import worker as torch_worker

            fields = dict(id=config.worker_id, num_workers=config.num_workers, seed=config.seed, dataset=config.fetch.dataset)
            try:
                torch_worker._worker_info = torch_worker.WorkerInfo(**fields, rng=_info.current.rng)
            except TypeError:  # (a torch whose WorkerInfo has no rng field)
                torch_worker._worker_info = torch_worker.WorkerInfo(**fields)
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


def _start_parent_watch(parent_pid: Optional[int], die_with_parent: bool) -> None:
    expected = os.getppid() if parent_pid is None else parent_pid
    if die_with_parent:
        portable.die_with_parent()
    if os.getppid() != expected:  # (gone already, before the kernel was asked to tell)
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


def _exit_code(exc: BaseException) -> int:
    """The code a process ends with when ``exc`` goes uncaught, as Python's."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        return code if isinstance(code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return _INTERRUPTED_EXIT_CODE
    return 1


def fatal_message(wid: int, where: str, stage: str, task: Optional[Task] = None) -> Fatal:
    """The exception being handled, as the Fatal message the worker sends before it ends."""
    exc = sys.exc_info()[1]
    return Fatal(
        worker_id=wid,
        failure=capture_failure(wid, where),
        exit_code=_exit_code(exc),
        stage=stage,
        epoch_id=task.epoch_id if task is not None else None,
        batch_index=task.batch_index if task is not None else None,
        indices=task.indices if task is not None else None,
    )


class Ending(Exception):
    """User code asked the worker to end (SystemExit, KeyboardInterrupt); carries the Fatal to send."""

    def __init__(self, fatal: Fatal):
        super().__init__(fatal.failure.exc_type_name)
        self.fatal = fatal


def _set_up(config: WorkerConfig) -> Any:
    """Seed, answer get_worker_info, run worker_init_fn; the fetcher."""
    rng.seed_global_generators(config.seed)
    _set_worker_info(config)
    if config.worker_init_fn is not None:
        config.worker_init_fn(config.worker_id)
    return make_fetcher(config.fetch, config.worker_id)


def run_worker(config: WorkerConfig, task_fd: int, result_fd: int) -> int:
    """Serve tasks until ``Stop``, the end of the task pipe, or the parent's
    death; the exit code."""
    wid = config.worker_id
    stacks.install(config.fds.stack)
    try:
        fetcher = _set_up(config)
    except BaseException:
        return _send_fatal(result_fd, fatal_message(wid, config.where, "start"))
    if not _send(result_fd, pack(Ready(wid))):
        return 0
    writers = [SlotWriter(fd) for fd in config.fds.slots]
    stop = StopFlag(config.fds.stop) if config.fds.stop is not None else None
    serving = Serving(config, fetcher)
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
            writer = writers[task.slot] if task.slot is not None else None
            try:
                result = serving.serve(task, writer)
            except Ending as ending:
                return _send_fatal(result_fd, ending.fatal)
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


class Serving:
    """Loads one task at a time into a result message (pickled, for a process)."""

    def __init__(self, config: WorkerConfig, fetcher: Any):
        self.config = config
        self.fetcher = fetcher
        self._epoch_id: Optional[int] = None
        self._noted = False
        self._cpu = ThreadClock()

    def serve(self, task: Task, writer: Optional[SlotWriter]) -> bytes:
        """The task's result, pickled: a Batch (arrays in the slot when there
        is one), Exhausted, or TaskFailed. Raises Ending for SystemExit and
        KeyboardInterrupt in user code."""
        try:
            message = self.load(task, writer)
            if writer is not None and writer.full and not self._noted and isinstance(message, Batch):
                self._noted = True
                message = dataclasses.replace(message, note=writer.full)
            try:
                return pack(message)
            except Exception:  # e.g. a collate_fn's output that does not pickle
                return pack(self._failed(task, "while sending its result to the main process"))
        finally:
            if writer is not None:
                writer.end()

    def close(self) -> None:
        """Let go of the CPU clock (a thread worker ends; a process just exits)."""
        self._cpu.close()

    def _times(self, clock: StageClock) -> bytes:
        """The batch's LoadTimes, packed; its stages ended when ``clock`` says,
        and encoding now (the CPU figures are read first, inside the span)."""
        cpu_s, cpu_wait_s = self._cpu.end()
        now = perf_counter()
        started_at, fetched_at, collated_at = clock.started_at, clock.fetched_at, clock.collated_at
        return pack_load_times(
            clock.samples, started_at, fetched_at - started_at, collated_at - fetched_at, now - collated_at, cpu_s, cpu_wait_s
        )

    def _failed(self, task: Task, doing: str = "") -> TaskFailed:
        wid = self.config.worker_id
        where = f"{self.config.where} {doing}" if doing else self.config.where
        return TaskFailed(task.epoch_id, task.batch_index, wid, task.indices, capture_failure(wid, where))

    def load(self, task: Task, writer: Optional[SlotWriter] = None) -> Any:
        """The task's result message: Batch (its arrays in ``writer``'s slot
        when given, else numpy arrays of their own), Exhausted or TaskFailed.
        Raises Ending for SystemExit and KeyboardInterrupt in user code."""
        config, fetcher, wid = self.config, self.fetcher, self.config.worker_id
        iterable = config.fetch.iterable
        try:
            if task.epoch_id != self._epoch_id:
                self._epoch_id = task.epoch_id
                if iterable:
                    fetcher.restart(task.restore)  # calls the dataset's __iter__, load_state_dict
            if writer is not None:
                writer.begin()
            clock = StageClock() if config.timed else None
            if clock is not None:
                self._cpu.begin(clock.started_at)
            allocate = _allocator(config.fetch, task, writer)
            data = fetch_seeded(fetcher, task.indices, task.seed, allocate, clock, not config.in_thread)
            used = size = 0
            if writer is not None:
                data, used = encode(data, writer)
                size = writer.size
            times = None
            if clock is not None:
                times = self._times(clock)
            message = Batch(task.epoch_id, task.batch_index, wid, data, used, size, times=times)
            if fetcher.skipped:
                message = dataclasses.replace(message, skipped=tuple(fetcher.skipped))
        except EmptyBatch:
            message = Batch(task.epoch_id, task.batch_index, wid, None, skipped=tuple(fetcher.skipped), empty=True)
        except EndOfData:
            message = Exhausted(task.epoch_id, task.batch_index, wid)
        except (SystemExit, KeyboardInterrupt):
            raise Ending(fatal_message(wid, config.where, "task", task)) from None
        except BaseException:
            return self._failed(task)
        if iterable:  # where this copy stands after the batch, for DataLoader.state_dict
            try:
                message = dataclasses.replace(message, worker_state=fetcher.state())
            except (SystemExit, KeyboardInterrupt):
                raise Ending(fatal_message(wid, config.where, "task", task)) from None
            except BaseException:
                return self._failed(task, "in state_dict()")
        return message


def _allocator(spec: FetchSpec, task: Task, writer: Optional[SlotWriter]) -> Any:
    """Where collate puts arrays: conveyor's own collate writes numpy leaves
    straight into the slot (samples placed row by row when it can); the main
    process converts to torch if the user asked for tensors. None for a
    user's collate_fn."""
    if spec.collate_into is None:
        return None
    if writer is None:
        return allocate_batch
    if spec.auto_collation and not spec.iterable:
        return RowPlacer(writer, len(task.indices), task.fill_threads)
    return SlotAllocator(writer)


def _worker_main(config: WorkerConfig, task_fd: int, result_fd: int) -> None:
    code = 0
    try:
        _start_parent_watch(config.parent_pid, config.die_with_parent)
        _keep_freed_memory()
        code = run_worker(config, task_fd, result_fd)
    except KeyboardInterrupt:
        # Ctrl-C reaches the whole process group; the main process raises
        # KeyboardInterrupt and stops the workers, so a worker leaves quietly.
        code = _INTERRUPTED_EXIT_CODE
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
    code = _send_fatal(result_fd, fatal_message(worker_id, f"in DataLoader worker process {worker_id}", "start"))
    os._exit(code)


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


def pickled_entry(worker_id: int, payload: bytes, task_fd: int, result_fd: int, shared_fds: tuple = ()) -> None:
    """Entry under ``forkserver``: the config arrives cloudpickled; the shared
    descriptors (:class:`WorkerFds`) arrive beside it, passed by the
    forkserver and renumbered."""
    _release_forkserver_alive_fd()
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
    process's error); then it is the main process's stderr again."""
    task_fd, result_fd, worker_id, stderr_fd = (int(a) for a in sys.argv[1:5])
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
