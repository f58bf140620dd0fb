"""Starting worker processes, one way per start method.

    fork        multiprocessing's fork context; the config is inherited, not pickled
    forkserver  multiprocessing's forkserver context; the config travels cloudpickled
    spawn       a fresh ``python -c`` of conveyor's own: it imports what the
                config needs and nothing else (the user's ``__main__`` is not
                re-imported, so a script that imports torch does not make
                numpy-only workers import it, and workers start fast)

A worker that dies while starting, before it can send its own report
(Python fails to start, the user's script run again by multiprocessing's
forkserver raises), leaves what it printed in its stack file
(``stacks.StackFile``), which the main process puts into the error: under
spawn the file is the child's stderr until its config has loaded; under
forkserver it is the first descriptor the child inherits, and conveyor,
imported by the script run again, copies the exception there
(:func:`_keep_start_failures`).

Each start gives a :class:`WorkerProcess` with a pid, a waitable sentinel, an
exit code, and ``kill``/``join``. The sentinel of a fork or forkserver worker
is multiprocessing's; a spawn worker's is a pidfd where Linux has one, else
its life pipe: the main process keeps the read end, the worker inherits the
write end and never writes to it, so the read end turns readable (end of
file) when the worker exits, however it dies (``_engine/portable.py`` lists each
such fallback).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import traceback
import weakref
from multiprocessing import reduction
from typing import Any, Optional

from .. import portable
from ..loading.serving import WorkerConfig
from ..transport.pickling import SpawnFds, dumps, starting_a_child
from ..transport.wire import FrameReader, FrameWriter, pack
from . import worker_signals
from .process import fork_entry, pickled_entry
from .starter import start_from_a_lasting_thread

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


if hasattr(os, "register_at_fork"):  # (not on Windows, which has no fork)
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
        """Release the sentinel (a pidfd or a life pipe's read end under
        spawn) once the process has been reaped."""
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


class Channels:
    """The two pipes of one worker. The main process keeps ``tasks`` (a
    non-blocking :class:`FrameWriter`) and ``results`` (a non-blocking
    :class:`FrameReader`); the worker gets the other two ends, which the main
    process closes once the worker has started."""

    def __init__(self) -> None:
        task_r, task_w = portable.pipe(_PIPE_BYTES)
        result_r, result_w = portable.pipe(_PIPE_BYTES)
        self.worker_task_fd = task_r
        self.worker_result_fd = result_w
        self.tasks = FrameWriter(task_w)
        self.results = FrameReader(result_r)
        self._open = [task_r, result_w, task_w, result_r]

    def main_fds(self) -> tuple[int, int]:
        return self.tasks.fd, self.results.fd

    def worker_fds(self) -> tuple[int, ...]:
        """The worker's ends, while this process still holds them (until the worker has started)."""
        return tuple(fd for fd in (self.worker_task_fd, self.worker_result_fd) if fd in self._open)

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

    def __reduce__(self) -> tuple:
        return _rebuild_fd, (reduction.DupFd(self.fd),)


def resolve_start_method(context: Any) -> str:
    """``None`` → the platform default; a name or a context → its name.
    Called before any worker starts: raises NotImplementedError, naming the
    way out, on a platform where workers cannot run (Windows)."""
    unsupported = portable.workers_unsupported()
    if unsupported is not None:
        raise NotImplementedError(unsupported)
    if context is None:
        return multiprocessing.get_start_method()
    if isinstance(context, str):
        return context
    return context.get_start_method()


def start_worker(
    method: str, config: WorkerConfig, payload: Optional[bytes], channels: Channels, payload_fds: tuple = ()
) -> WorkerProcess:
    """Start one worker; ``payload`` is the cloudpickled config and
    ``payload_fds`` the descriptors it refers to (spawn; see pickle_config).
    A fork or spawn worker is started by a thread that lives as long as
    this process (starter.py), so that the kernel kills it with this
    process and with nothing else; a forkserver worker's parent is the
    forkserver."""
    if method in ("fork", "spawn"):
        return start_from_a_lasting_thread(_start, method, config, payload, channels, payload_fds)
    return _start(method, config, payload, channels, payload_fds)


def _start(
    method: str, config: WorkerConfig, payload: Optional[bytes], channels: Channels, payload_fds: tuple
) -> WorkerProcess:
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
        return _started(proc)
    if method == "forkserver":
        worker_signals.preload_in_forkserver()  # (before the forkserver starts: it then ignores the job's signals)
        server = multiprocessing.get_context("forkserver")
        served = server.Process(
            target=_forkserver_entry,
            args=(
                # First: the child finds it among its inherited descriptors before it runs anything of ours.
                _PassedFd(config.fds.stack) if config.fds.stack is not None else -1,
                portable.LINUX_PATHS,
                config.worker_id,
                _PickledWhileStarting(config),
                _PassedFd(channels.worker_task_fd),
                _PassedFd(channels.worker_result_fd),
                tuple(_PassedFd(fd) if fd >= 0 else fd for fd in config.fds.as_tuple()),
            ),
            name=f"conveyor-worker-{config.worker_id}",
            daemon=True,
        )
        served.start()
        _mp_workers.add(served)
        return _started(served)
    if method == "spawn":
        shared = tuple(fd for fd in config.fds.as_tuple() if fd >= 0)
        payload_only = tuple(fd for fd in payload_fds if fd not in shared)
        return _spawn(config, channels, shared + payload_only)
    raise ValueError(f"unknown start method {method!r}; expected one of {START_METHODS}")


def _started(proc: Any) -> WorkerProcess:
    """A multiprocessing Process just started, as a WorkerProcess."""
    assert proc.pid is not None  # (started: it has one)
    return WorkerProcess(proc.pid, proc.sentinel, proc)


def _forkserver_entry(stack_fd: int, linux_paths: bool, *args: Any) -> None:
    """A forkserver worker takes its main process's side of the portable
    switch (the forkserver itself may have started under another)."""
    if stack_fd >= 0:
        os.close(stack_fd)  # (a second copy of the stack file: the config names the one it uses)
    portable.LINUX_PATHS = linux_paths
    pickled_entry(*args)


#: Stack files are named so (``portable.scratch_file("stack")``), which is how
#: a forkserver child knows the descriptor it inherited first is one.
_STACK_FILE_MARK = "conveyor-stack"


def _forkserver_child_stack_fd() -> Optional[int]:
    """In a process that multiprocessing's forkserver started as a conveyor
    worker: its stack file (the first descriptor it inherited); else None."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    fds = getattr(getattr(forkserver, "_forkserver", None), "_inherited_fds", None)
    if not fds:
        return None
    try:
        if _STACK_FILE_MARK not in os.readlink(f"/proc/self/fd/{fds[0]}"):
            return None
    except OSError:  # (no /proc: no report, the exit code still says it)
        return None
    return int(fds[0])


def _keep_start_failures() -> None:
    """In a process that multiprocessing's forkserver is starting as a
    conveyor worker (its parent's main script runs again, as ``__mp_main__``,
    before the worker's own code): copy an exception that ends the start
    into the worker's stack file too, for the main process's error. Runs
    when conveyor is imported: there, or in the forkserver itself (which
    imports conveyor first: worker_signals.preload_in_forkserver), whose
    children then have the hook already; does nothing in any other process."""
    starting = getattr(multiprocessing.current_process(), "_inheriting", False)
    if not (starting and _forkserver_child_stack_fd() is not None) and not worker_signals.in_forkserver():
        return
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        report_fd = _forkserver_child_stack_fd()
        if report_fd is not None:
            try:
                os.write(report_fd, "".join(traceback.format_exception(kind, value, tb)).encode("utf-8", "replace"))
            except OSError:
                pass
        previous(kind, value, tb)

    sys.excepthook = hook


_keep_start_failures()


def _spawn(config: WorkerConfig, channels: Channels, shared_fds: tuple) -> WorkerProcess:
    """Start ``python -c``; its stderr goes to the stack file until its
    config has loaded (then to this process's stderr, passed as a
    descriptor of its own), so what a failing start prints reaches the error.
    Its argv also says which process it dies with, and how (spawn_main)."""
    task_fd, result_fd, stack_fd = channels.worker_task_fd, channels.worker_result_fd, config.fds.stack
    parent_pid = os.getpid() if config.parent_pid is None else config.parent_pid
    try:
        stderr_fd = os.dup(2) if stack_fd is not None else -1
    except OSError:  # (no stderr at all: nothing to keep apart)
        stderr_fd = -1
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.pop(portable.ENV_VAR, None)
    if not portable.LINUX_PATHS:
        env[portable.ENV_VAR] = "1"
    code = "from conveyor._engine.workers.process import spawn_main; spawn_main()"
    life_r, life_w = (-1, -1) if portable.pidfd_works() else portable.pipe()
    passed = (task_fd, result_fd, *shared_fds, *(fd for fd in (life_w, stderr_fd) if fd >= 0))
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                str(task_fd),
                str(result_fd),
                str(config.worker_id),
                str(stderr_fd),
                str(parent_pid),
                str(int(config.die_with_parent)),
            ],
            pass_fds=passed,
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=stack_fd if stderr_fd >= 0 else None,
        )
    except BaseException:
        if life_r >= 0:
            os.close(life_r)
        raise
    finally:
        for fd in (life_w, stderr_fd):  # the worker's copies alone keep them open
            if fd >= 0:
                os.close(fd)
    if life_r >= 0:
        return WorkerProcess(proc.pid, life_r, proc)
    try:
        return WorkerProcess(proc.pid, os.pidfd_open(proc.pid), proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise


def deliver_config(method: str, channels: Channels, payload: Optional[bytes]) -> None:
    """Under spawn, send the header and the config down the task pipe.

    Queued without waiting (a big dataset travels by value): the executor's
    poll loop writes the rest as the worker reads it, and notices if the
    worker dies instead.
    """
    if method != "spawn":
        return
    assert payload is not None  # (spawn: the config travels pickled)
    channels.tasks.put(pack({"sys_path": list(sys.path)}))
    channels.tasks.put(payload)


def pickle_config(config: WorkerConfig) -> tuple[bytes, tuple]:
    """Cloudpickle the config for a spawn worker: objects defined in
    ``__main__``, in a notebook or as lambdas travel by value; and the
    descriptors that multiprocessing objects in it share, to pass along."""
    with starting_a_child(SpawnFds()) as launcher:
        payload = dumps(config)
    return payload, tuple(launcher.fds)


class _PickledWhileStarting:
    """The config of a forkserver worker: cloudpickled (by value, as for
    spawn) while multiprocessing starts the child, so that multiprocessing
    objects in it pass their descriptors the forkserver's way. The child
    receives the bytes, and unpickles them itself (pickled_entry), so that
    a failure there is reported as the worker's."""

    def __init__(self, config: WorkerConfig):
        self.config = config

    def __reduce__(self) -> tuple:
        return bytes, (dumps(self.config),)
