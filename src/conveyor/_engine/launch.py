"""Starting worker processes, one way per start method.

    fork        multiprocessing's fork context; the config is inherited, not pickled
    forkserver  multiprocessing's forkserver context; the config travels cloudpickled
    spawn       a fresh ``python -c`` of conveyor's own: it imports what the
                config needs and nothing else (the user's ``__main__`` is not
                re-imported, so a script that imports torch does not make
                numpy-only workers import it, and workers start fast)

Each start gives a :class:`WorkerProcess` with a pid, a waitable sentinel, an
exit code, and ``kill``/``join``.
"""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import pickle
import subprocess
import sys
import weakref
from multiprocessing import reduction
from typing import Any, Optional

import cloudpickle

from .wire import FrameReader, FrameWriter, pack
from .worker import WorkerConfig, fork_entry, pickled_entry

#: Pipes get this much buffer (Linux's default pipe-max-size for unprivileged
#: processes), so that most tasks and inline results go in one write.
_PIPE_BYTES = 1 << 20

START_METHODS = ("fork", "spawn", "forkserver")

#: Workers started through multiprocessing (fork, forkserver). A child that
#: the user's script forks with os.fork inherits multiprocessing's list of
#: children, and at its exit terminates the daemons among them: this
#: process's workers. The child forgets them (see _forget_workers_in_child).
_mp_workers: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _forget_workers_in_child() -> None:
    children = getattr(multiprocessing.process, "_children", None)
    if children:
        for process in list(_mp_workers):
            children.discard(process)
    _mp_workers.clear()


os.register_at_fork(after_in_child=_forget_workers_in_child)


class WorkerProcess:
    """A started worker: pid, sentinel (for ``connection.wait``), exit code."""

    def __init__(self, pid: int, sentinel: Any, process: Any):
        self.pid = pid
        self.sentinel = sentinel
        self._process = process

    @property
    def exitcode(self) -> Optional[int]:
        """``None`` while running; negative signal number if killed."""
        p = self._process
        return p.poll() if isinstance(p, subprocess.Popen) else p.exitcode

    def kill(self) -> None:
        try:
            self._process.kill()
        except (ProcessLookupError, OSError, AttributeError):
            pass

    def join(self, timeout_s: Optional[float]) -> bool:
        """Wait for the exit; True when it has exited."""
        p = self._process
        if isinstance(p, subprocess.Popen):
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                return False
            return True
        p.join(timeout_s)
        return p.exitcode is not None

    def close(self) -> None:
        """Release the sentinel once the process has been reaped."""
        if isinstance(self._process, subprocess.Popen):
            try:
                os.close(self.sentinel)
            except OSError:
                pass
        else:
            try:
                self._process.close()
            except ValueError:
                pass


def _pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:  # a lower pipe-max-size: the default buffer still works
        pass
    return r, w


class Channels:
    """The two pipes of one worker. The main process keeps ``tasks`` (a
    non-blocking :class:`FrameWriter`) and ``results`` (a non-blocking
    :class:`FrameReader`); the worker gets the other two ends, which the main
    process closes once the worker has started."""

    def __init__(self) -> None:
        task_r, task_w = _pipe()
        result_r, result_w = _pipe()
        self.worker_task_fd = task_r
        self.worker_result_fd = result_w
        self.tasks = FrameWriter(task_w)
        self.results = FrameReader(result_r)
        self._open = [task_r, result_w, task_w, result_r]

    def main_fds(self) -> tuple[int, int]:
        return self.tasks.fd, self.results.fd

    def _close(self, fd: int) -> None:
        if fd in self._open:
            self._open.remove(fd)
            os.close(fd)

    def close_worker_ends(self) -> None:
        self._close(self.worker_task_fd)
        self._close(self.worker_result_fd)

    def close(self) -> None:
        for fd in list(self._open):
            self._close(fd)


def _rebuild_fd(handle: Any) -> int:
    return handle.detach()


class _PassedFd:
    """A descriptor handed to a forkserver child: pickled through
    multiprocessing's DupFd while the Process starts, a number again there."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _rebuild_fd, (reduction.DupFd(self.fd),)


def resolve_start_method(context: Any) -> str:
    """``None`` → the platform default; a name or a context → its name."""
    if context is None:
        return multiprocessing.get_start_method()
    if isinstance(context, str):
        return context
    return context.get_start_method()


def start_worker(method: str, config: WorkerConfig, payload: Optional[bytes], channels: Channels) -> WorkerProcess:
    """Start one worker; ``payload`` is the cloudpickled config (spawn and
    forkserver)."""
    if method == "fork":
        ctx = multiprocessing.get_context("fork")
        proc = ctx.Process(
            target=fork_entry,
            args=(config, channels.worker_task_fd, channels.worker_result_fd),
            name=f"conveyor-worker-{config.worker_id}",
            daemon=True,
        )
        proc.start()
        _mp_workers.add(proc)
        return WorkerProcess(proc.pid, proc.sentinel, proc)
    if method == "forkserver":
        ctx = multiprocessing.get_context("forkserver")
        proc = ctx.Process(
            target=pickled_entry,
            args=(
                config.worker_id,
                payload,
                _PassedFd(channels.worker_task_fd),
                _PassedFd(channels.worker_result_fd),
                tuple(_PassedFd(fd) if fd >= 0 else fd for fd in config.fds.as_tuple()),
            ),
            name=f"conveyor-worker-{config.worker_id}",
            daemon=True,
        )
        proc.start()
        _mp_workers.add(proc)
        return WorkerProcess(proc.pid, proc.sentinel, proc)
    if method == "spawn":
        return _spawn(config.worker_id, channels, tuple(fd for fd in config.fds.as_tuple() if fd >= 0))
    raise ValueError(f"unknown start method {method!r}; expected one of {START_METHODS}")


def _spawn(worker_id: int, channels: Channels, shared_fds: tuple) -> WorkerProcess:
    task_fd, result_fd = channels.worker_task_fd, channels.worker_result_fd
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    code = "from conveyor._engine.worker import spawn_main; spawn_main()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(task_fd), str(result_fd), str(worker_id)],
        pass_fds=(task_fd, result_fd, *shared_fds),
        env=env,
        stdin=subprocess.DEVNULL,
    )
    return WorkerProcess(proc.pid, os.pidfd_open(proc.pid), proc)


def deliver_config(method: str, channels: Channels, payload: Optional[bytes]) -> None:
    """Under spawn, send the header and the config down the task pipe.

    Queued without waiting (a big dataset travels by value): the executor's
    poll loop writes the rest as the worker reads it, and notices if the
    worker dies instead.
    """
    if method != "spawn":
        return
    channels.tasks.put(pack({"sys_path": list(sys.path)}))
    channels.tasks.put(payload)


def pickle_config(config: WorkerConfig) -> bytes:
    """Cloudpickle the config: objects defined in ``__main__``, in a notebook
    or as lambdas travel by value."""
    return cloudpickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
