"""The operating-system calls the engine needs that only Linux has, each
beside the portable way to do the same where it is missing.

    need                            Linux (the default)                    elsewhere, or switched off
    memory the workers share        memfd_create                           shm_open, and shm_unlink at once
      growing it                    ftruncate + posix_fallocate            ftruncate alone
    a file faulthandler writes      memfd_create                           a temporary file, unlinked at once
    a spawn worker's end            pidfd_open                             a life pipe (workers/launch.py)
    pipes                           pipe2(O_CLOEXEC), F_SETPIPE_SZ 1 MiB   os.pipe (non-inheritable), default size
    the signal asking for a stack   SIGRTMIN + 3                           SIGUSR2
    a worker dies with its parent   prctl(PR_SET_PDEATHSIG, SIGKILL)       the worker's parent-watch thread only

Each fallback keeps the ownership rule of the Linux path: a file is
anonymous or unlinked right after it is created, before any worker starts,
so nothing is left in /dev/shm or the temporary directory whatever process
is killed (only a kill inside the few microseconds between shm_open and
shm_unlink could leave a name behind).

Platforms: Linux takes the first column; macOS and the BSDs the second (the
engine's workers need ``select.poll`` and POSIX pipes); Windows imports
conveyor and loads with ``num_workers=0`` only (:func:`workers_unsupported`).

The switch: ``CONVEYOR_PORTABLE=1`` in the environment, read once when this
module is first imported, turns every Linux-only path off on Linux too, as
if on macOS; tests flip :data:`LINUX_PATHS` instead (``monkeypatch``). Each
choice is made when it is used, so a flip applies to the next pool. Workers
follow their main process, so that both sides pick the same stack signal:
fork inherits the flag, spawn gets the variable in its environment, and
forkserver gets the flag as an argument (``workers/launch.py``).
"""

from __future__ import annotations

import errno
import os
import secrets
import select
import sys
import tempfile
from typing import Optional

#: The environment variable that turns the Linux-only paths off (value "1").
ENV_VAR = "CONVEYOR_PORTABLE"
#: False: take the portable path even where the Linux call exists.
LINUX_PATHS: bool = os.environ.get(ENV_VAR, "") != "1"
#: Names of POSIX shared-memory objects start with this (macOS allows 30
#: characters in all: "/conveyor-slot-" and 8 hex digits are 23).
SHM_PREFIX = "conveyor-"
#: Attempts at a free random name before giving up (a clash is already rare).
_NAME_TRIES = 8


def _memfd(name: str) -> Optional[int]:
    """An anonymous memory file, or None where memfd is missing or refused
    (a kernel before 3.17, a seccomp filter)."""
    if not (LINUX_PATHS and hasattr(os, "memfd_create")):
        return None
    try:
        return os.memfd_create(name, os.MFD_CLOEXEC)
    except OSError:
        return None


def _unlinked_shm(name: str) -> int:
    """A POSIX shared-memory object whose name is gone before this returns:
    only descriptors (this one, and the copies workers inherit) keep it."""
    import _posixshmem  # POSIX only; ImportError on Windows

    for _ in range(_NAME_TRIES):
        path = f"/{SHM_PREFIX}{name}-{secrets.token_hex(4)}"
        try:
            fd = _posixshmem.shm_open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
        except FileExistsError:
            continue
        try:
            _posixshmem.shm_unlink(path)
            os.set_inheritable(fd, False)  # workers get it through fork or pass_fds, nothing else does
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise FileExistsError(errno.EEXIST, f"no free shared-memory name after {_NAME_TRIES} tries")


def shared_memory_file(name: str) -> int:
    """An empty file of memory that several processes map (slots, the stop
    flag): a memfd, else a POSIX shared-memory object unlinked at once.
    Raises OSError where neither exists (batches then travel through the
    pipes)."""
    fd = _memfd(f"conveyor-{name}")
    if fd is not None:
        return fd
    try:
        return _unlinked_shm(name)
    except (OSError, ImportError) as exc:
        raise OSError(errno.ENOSYS, f"no anonymous shared memory here (memfd_create, shm_open: {exc})") from exc


def scratch_file(name: str) -> int:
    """An empty anonymous file that one process ``write()``s and another
    reads (a worker's stack): a memfd, else a temporary file unlinked at
    once. Not POSIX shared memory: macOS refuses read() and write() on it."""
    fd = _memfd(f"conveyor-{name}")
    if fd is not None:
        return fd
    fd, path = tempfile.mkstemp(prefix=f"{SHM_PREFIX}{name}-")
    try:
        os.unlink(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def resize_shared_file(fd: int, size: int) -> None:
    """Grow a :func:`shared_memory_file` to ``size`` bytes.

    Linux reserves the memory too (``posix_fallocate``), so that a full
    /dev/shm or memory limit fails here, as an OSError the caller can act
    on. Without it (macOS has no posix_fallocate) the file is only sized,
    and that costs: a system out of shared memory fails later, at the
    first write to a page that has none (SIGBUS on a full tmpfs; macOS
    backs shared memory with swap). macOS also sizes a POSIX shared-memory
    object once only: a second ftruncate fails with EINVAL, reported here
    as such (the slot's batch then travels through the pipe).
    """
    try:
        os.ftruncate(fd, size)
    except OSError as exc:
        if exc.errno == errno.EINVAL and os.fstat(fd).st_size > 0:
            raise OSError(errno.EINVAL, "this system sizes POSIX shared memory once only (macOS)") from exc
        raise
    if LINUX_PATHS and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)


def pipe(buffer_bytes: Optional[int] = None) -> tuple[int, int]:
    """A pipe whose ends are closed on exec, with ``buffer_bytes`` of buffer
    where the system lets a process choose (Linux), else its default."""
    if not (LINUX_PATHS and hasattr(os, "pipe2")):
        return os.pipe()  # non-inheritable since Python 3.4 (PEP 446)
    r, w = os.pipe2(os.O_CLOEXEC)
    if buffer_bytes is None:
        return r, w
    try:
        import fcntl

        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, buffer_bytes)
    except (ImportError, AttributeError, OSError):  # a lower pipe-max-size: the default buffer still works
        pass
    return r, w


_pidfd_works: Optional[bool] = None


def pidfd_works() -> bool:
    """Whether ``os.pidfd_open`` gives a waitable descriptor here (it exists
    from Python 3.9 on Linux, but kernels before 5.3 refuse it)."""
    global _pidfd_works
    if not (LINUX_PATHS and hasattr(os, "pidfd_open")):
        return False
    if _pidfd_works is None:
        try:
            os.close(os.pidfd_open(os.getpid()))
            _pidfd_works = True
        except OSError:
            _pidfd_works = False
    return _pidfd_works


#: prctl's option that sets the signal a process gets when its parent ends (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> bool:
    """Have the kernel SIGKILL this process the moment the thread that
    started it ends (``prctl(PR_SET_PDEATHSIG)``): a worker then goes with
    a killed main process even while it holds the GIL in a C call or is
    stopped, when its parent-watch thread cannot run. True when armed;
    False where Linux's call is missing or switched off (the watch thread
    then does the job alone)."""
    if not (LINUX_PATHS and sys.platform.startswith("linux")):
        return False
    import ctypes
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0


def realtime_signals() -> bool:
    """Whether to use a real-time signal (SIGRTMIN + n): Linux has them, macOS not."""
    import signal

    return LINUX_PATHS and hasattr(signal, "SIGRTMIN")


def workers_unsupported() -> Optional[str]:
    """Why worker processes cannot run on this platform, or None when they can."""
    if os.name == "posix" and hasattr(select, "poll"):
        return None
    return (
        f"conveyor's worker processes (num_workers > 0) do not run on this platform ({sys.platform}): "
        f"they wait on pipes with select.poll(), which it lacks. Use num_workers=0 (batches are "
        f"loaded in the main process), or run on Linux (tested) or macOS."
    )
