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
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any, Optional

import cloudpickle

from .worker import WorkerConfig, fork_entry, pickled_entry

#: Task pipes get this much buffer, so that sending a task never waits on a
#: worker that is itself busy sending a big result (1 MiB is Linux's default
#: pipe-max-size for unprivileged processes).
_TASK_PIPE_BYTES = 1 << 20

START_METHODS = ("fork", "spawn", "forkserver")


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


def _pipe(bigger: bool = False) -> tuple[int, int]:
    r, w = os.pipe()
    if bigger:
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _TASK_PIPE_BYTES)
        except OSError:  # a lower pipe-max-size: the default buffer still works
            pass
    return r, w


class Channels:
    """The two pipes of one worker. The main process keeps ``tasks`` (write)
    and ``results`` (read); the worker gets the other two ends, which the main
    process closes once the worker has started."""

    def __init__(self) -> None:
        task_r, task_w = _pipe(bigger=True)
        result_r, result_w = _pipe()
        self.tasks = Connection(task_w, readable=False)
        self.results = Connection(result_r, writable=False)
        self.worker_tasks = Connection(task_r, writable=False)
        self.worker_results = Connection(result_w, readable=False)

    def main_fds(self) -> tuple[int, int]:
        return self.tasks.fileno(), self.results.fileno()

    def close_worker_ends(self) -> None:
        self.worker_tasks.close()
        self.worker_results.close()

    def close(self) -> None:
        self.close_worker_ends()
        self.tasks.close()
        self.results.close()


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
            args=(config, channels.worker_tasks, channels.worker_results),
            name=f"conveyor-worker-{config.worker_id}",
            daemon=True,
        )
        proc.start()
        return WorkerProcess(proc.pid, proc.sentinel, proc)
    if method == "forkserver":
        ctx = multiprocessing.get_context("forkserver")
        proc = ctx.Process(
            target=pickled_entry,
            args=(
                config.worker_id,
                payload,
                channels.worker_tasks,
                channels.worker_results,
                tuple(_PassedFd(fd) for fd in _shared_fds(config)),
            ),
            name=f"conveyor-worker-{config.worker_id}",
            daemon=True,
        )
        proc.start()
        return WorkerProcess(proc.pid, proc.sentinel, proc)
    if method == "spawn":
        return _spawn(config.worker_id, channels, _shared_fds(config))
    raise ValueError(f"unknown start method {method!r}; expected one of {START_METHODS}")


def _shared_fds(config: WorkerConfig) -> tuple:
    """The shared-memory descriptors a worker inherits: stop flag, then slots."""
    return () if config.stop_fd is None else (config.stop_fd, *config.slot_fds)


def _spawn(worker_id: int, channels: Channels, shared_fds: tuple) -> WorkerProcess:
    task_fd, result_fd = channels.worker_tasks.fileno(), channels.worker_results.fileno()
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

    Called once every worker has been started (so that interpreters start
    side by side) and after the worker ends were closed here (so that a child
    that died makes this fail with BrokenPipeError instead of waiting).
    """
    if method != "spawn":
        return
    header = {"sys_path": list(sys.path)}
    channels.tasks.send_bytes(pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL))
    channels.tasks.send_bytes(payload)


def pickle_config(config: WorkerConfig) -> bytes:
    """Cloudpickle the config: objects defined in ``__main__``, in a notebook
    or as lambdas travel by value."""
    return cloudpickle.dumps(config, protocol=pickle.HIGHEST_PROTOCOL)
