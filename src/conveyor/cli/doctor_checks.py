"""The checks of `conveyor doctor` that look at the machine itself: versions,
cores against the planned workers, the start method, threads, shared memory
(memfd and /dev/shm), the open-file limit and the accelerator.

Each check returns one :class:`Check` (OK, WARN or FAIL, what it saw, and a
fix for WARN and FAIL) and is a function of the values it judges; each value
is read from this machine unless passed (the default FROM_SYSTEM), which is
how a bad machine is faked. torch is imported only inside the checks that
ask it, and only when installed. doctor_data.py checks a --data folder;
doctor.py runs them all and prints the report.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from .._engine import portable
from .._engine.cpu import usable_cores

try:
    import resource
except ImportError:  # Windows: no limit on open files to read
    resource = None  # type: ignore[assignment]

OK, WARN, FAIL = "OK", "WARN", "FAIL"
_MIB = 1 << 20
_GIB = 1 << 30
#: Docker's default /dev/shm is 64 MiB, the size behind most "bus error" and
#: NCCL failures in containers; a few GiB fits any common batch many times.
SHM_FAIL_BELOW_BYTES = 64 * _MIB
SHM_WARN_BELOW_BYTES = 1 * _GIB
#: Each worker holds pipes, and the main process one descriptor per slot
#: (prefetch_factor × num_workers + 3): a few hundred for a big pool.
NOFILE_FAIL_BELOW = 256
NOFILE_WARN_BELOW = 4096


class _FromSystem:
    """The default of a check's parameters: read the value from this machine.
    (None cannot be that default: for several values it means "absent".)"""

    def __repr__(self) -> str:
        return "FROM_SYSTEM"


FROM_SYSTEM: Any = _FromSystem()


@dataclass(frozen=True)
class Check:
    """One result of the checklist."""

    name: str
    status: str  # OK, WARN or FAIL
    detail: str  # what was seen
    fix: str = ""  # what to do; set for WARN and FAIL


def size_text(n: float) -> str:
    """``n`` bytes in GiB, MiB or KiB, as the checks print it."""
    if n >= _GIB:
        return f"{n / _GIB:.1f} GiB"
    return f"{n / _MIB:.0f} MiB" if n >= _MIB else f"{n / 1024:.0f} KiB"


def _given(value: Any, read: Callable[[], Any]) -> Any:
    return read() if value is FROM_SYSTEM else value


def _on_linux() -> bool:
    return sys.platform.startswith("linux")


# ------------------------------------------------------------------ checks


def check_cores(num_workers: int, cores: int = FROM_SYSTEM) -> Check:
    """Planned workers against usable cores: more workers than cores take turns."""
    cores = _given(cores, usable_cores)
    seen = f"{num_workers} workers planned, {cores} usable cores"
    if num_workers > cores:
        fewer = cores - 1 if cores > 2 else cores
        return Check(
            "cores",
            WARN,
            f"{seen}: more processes than cores take turns with each other and the training loop",
            f"use num_workers={fewer} or fewer; more workers than cores help only when they mostly wait on I/O "
            f"(network storage, remote reads)",
        )
    if num_workers == cores and cores > 2:
        seen += f"; num_workers={cores - 1} leaves a core to the training loop and is often as fast"
    return Check("cores", OK, seen)


def shared_memory_kind() -> tuple[Optional[str], str]:
    """How batches travel here: ``("memfd", "")``, ``("shm_open", "")``, or
    ``(None, why)`` when neither works and they go through pipes. Asks
    ``portable.shared_memory_file`` (what the slots use) for one file and
    looks at what it got."""
    try:
        fd = portable.shared_memory_file("doctor")
    except OSError as exc:
        return None, str(exc)
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc (macOS), and no memfd there either
        target = ""
    finally:
        os.close(fd)
    return ("memfd" if target.startswith("/memfd:") else "shm_open"), ""


def check_memfd(
    kind: Optional[str] = FROM_SYSTEM, why: str = "", linux: bool = FROM_SYSTEM, forced_portable: bool = FROM_SYSTEM
) -> Check:
    """Which shared memory carries batches (``kind``): memfd on Linux, POSIX
    shared memory elsewhere or where memfd is refused, or none (pipes)."""
    if kind is FROM_SYSTEM:
        kind, why = shared_memory_kind()
    linux = _given(linux, _on_linux)
    forced_portable = _given(forced_portable, lambda: not portable.LINUX_PATHS)
    if kind == "memfd":
        return Check("memfd", OK, "memfd_create works: batches travel in anonymous shared memory, not in /dev/shm")
    if kind is None:
        return Check(
            "memfd",
            WARN,
            f"no anonymous shared memory ({why}): batches travel through pipes (same data, slower)",
            "allow memfd_create in the container's seccomp profile, or mount a tmpfs at /dev/shm",
        )
    posix = "batches travel in POSIX shared memory (shm_open, unlinked at once)"
    if not linux:
        return Check("memfd", OK, f"no memfd on this platform: {posix}")
    if forced_portable:
        why, fix = f"{portable.ENV_VAR}=1 is set", f"unset {portable.ENV_VAR} (it selects the macOS paths, for tests)"
    else:
        why = "memfd_create is missing or refused (a kernel before 3.17, or a seccomp filter)"
        fix = "allow memfd_create in the seccomp profile (or update the kernel); meanwhile docker run --shm-size=8g"
    return Check("memfd", WARN, f"{why}: {posix} in /dev/shm, whose size then limits them", fix)


def check_shm(
    free_bytes: Optional[int] = FROM_SYSTEM,
    total_bytes: Optional[int] = FROM_SYSTEM,
    kind: Optional[str] = FROM_SYSTEM,
    linux: bool = FROM_SYSTEM,
    path: str = "/dev/shm",
) -> Check:
    """Room in /dev/shm (``free_bytes`` None: missing). It holds conveyor's
    batches only on the shm_open path (``kind``); memfd counts against the
    container's memory limit instead, so a small /dev/shm is then one level
    less severe (it still breaks torch.multiprocessing tensors and NCCL)."""
    if free_bytes is FROM_SYSTEM or total_bytes is FROM_SYSTEM:
        try:
            st = os.statvfs(path)
            free_bytes, total_bytes = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        except OSError:
            free_bytes = total_bytes = None
    kind = _given(kind, lambda: shared_memory_kind()[0])
    if free_bytes is None and not _given(linux, _on_linux):
        return Check("/dev/shm", OK, f"no {path} on this platform: the system sizes POSIX shared memory itself")
    users = "torch.multiprocessing tensors and NCCL buffers live there"
    users += ", and conveyor's batches" if kind == "shm_open" else ", not conveyor's batches"
    if free_bytes is None:
        level, seen = 2, f"{path} is missing"
        fix = f"mount a tmpfs there (mount -t tmpfs -o size=8G tmpfs {path}, as root), or docker run --shm-size=8g"
    else:
        level = 2 if free_bytes < SHM_FAIL_BELOW_BYTES else 1 if free_bytes < SHM_WARN_BELOW_BYTES else 0
        seen = f"{size_text(free_bytes)} free" + (f" of {size_text(total_bytes)}" if total_bytes is not None else "")
        fix = (
            f"give it room: docker run --shm-size=8g (Kubernetes: an emptyDir with medium: Memory at {path}), or "
            f"mount -o remount,size=8G {path} (root); files left there by crashed programs take room too"
        )
    if kind != "shm_open":
        level = max(level - 1, 0)
    status = (OK, WARN, FAIL)[level]
    return Check("/dev/shm", status, f"{seen}; {users}", fix if status != OK else "")


def check_open_files(soft: int = FROM_SYSTEM, hard: int = FROM_SYSTEM) -> Check:
    """The soft limit on open files (RLIMIT_NOFILE): workers, pipes and slots
    each take descriptors, and "Too many open files" stops the loader."""
    if soft is FROM_SYSTEM or hard is FROM_SYSTEM:
        if resource is None:
            return Check("open files", OK, "no RLIMIT_NOFILE on this platform")
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = {-1, getattr(resource, "RLIM_INFINITY", -1)}
    seen = f"soft limit {'unlimited' if soft in unlimited else soft}, hard {'unlimited' if hard in unlimited else hard}"
    if soft in unlimited or soft >= NOFILE_WARN_BELOW:
        return Check("open files", OK, seen)
    target, keep = (65536, "resource.RLIM_INFINITY") if hard in unlimited else (min(65536, hard), hard)
    fix = f"ulimit -n {target} before starting Python, or in it resource.setrlimit(resource.RLIMIT_NOFILE, "
    fix += f"({target}, {keep}))"
    if target < NOFILE_WARN_BELOW:  # only root raises a hard limit
        fix += "; raise the hard limit as root: /etc/security/limits.conf, or docker run --ulimit nofile=65536:65536"
    status = FAIL if soft < NOFILE_FAIL_BELOW else WARN
    return Check("open files", status, f"{seen}: workers, pipes and shared-memory slots each hold descriptors", fix)


def check_start_method(
    num_workers: int, default: str = FROM_SYSTEM, available: Sequence[str] = FROM_SYSTEM, problem: str = FROM_SYSTEM
) -> Check:
    """The start method workers get when the loader is given no
    ``multiprocessing_context`` (the platform default, as with torch), and
    ``problem``: why workers cannot run here ("" when they can)."""
    problem = _given(problem, lambda: portable.workers_unsupported() or "")
    available = _given(available, multiprocessing.get_all_start_methods)
    # allow_none: without it, asking would fix the start method of this process.
    default = _given(default, lambda: multiprocessing.get_start_method(allow_none=True) or available[0])
    if problem and num_workers > 0:
        return Check("start method", FAIL, problem, "use num_workers=0, or run on Linux or macOS")
    seen = f"{default} by default (available: {', '.join(available)})"
    if default == "fork" or num_workers == 0:
        return Check("start method", OK, seen)
    fix = "pass persistent_workers=True so workers start once, not every epoch"
    if "fork" in available:
        fix += "; or multiprocessing_context='fork' if the script has started no threads before the loader"
    detail = f"{seen}: each worker is a new process given the pickled dataset; each epoch's first batch waits for them"
    return Check("start method", WARN, detail, fix)


def _leading_int(value: Optional[str]) -> Optional[int]:
    """OMP_NUM_THREADS may list one count per nesting level ("8,2"): the first counts."""
    try:
        return int((value or "").split(",")[0])
    except ValueError:
        return None


def _import_torch() -> tuple[Any, str]:
    """(torch, "") if it imports, (None, "") if not installed, (None, why) if broken."""
    if importlib.util.find_spec("torch") is None:
        return None, ""
    try:
        import torch
    except Exception as exc:  # a broken install raises anything from OSError to AttributeError
        return None, f"{type(exc).__name__}: {exc}"
    return torch, ""


def _torch_threads() -> Optional[int]:
    torch = _import_torch()[0]
    return None if torch is None else torch.get_num_threads()


def check_threads(
    cores: int = FROM_SYSTEM, torch_threads: Optional[int] = FROM_SYSTEM, env: Mapping[str, str] = FROM_SYSTEM
) -> Check:
    """Threads of the main process (``torch_threads``, None without torch) and
    OMP/MKL_NUM_THREADS, which the BLAS of every worker follows too. Workers
    run one torch thread each: conveyor sets it, as torch does."""
    cores, env = _given(cores, usable_cores), _given(env, lambda: os.environ)
    torch_threads = _given(torch_threads, _torch_threads)
    parts = ["torch not installed" if torch_threads is None else f"torch {torch_threads} threads in the main process"]
    too_many = [f"torch {torch_threads}"] if torch_threads is not None and torch_threads > cores else []
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        parts.append(f"{var}={env.get(var, 'unset')}")
        count = _leading_int(env.get(var))
        if count is not None and count > cores:
            too_many.append(f"{var}={count}")
    seen = f"{', '.join(parts)}; {cores} usable cores; 1 torch thread per worker"
    if not too_many:
        return Check("threads", OK, seen)
    return Check(
        "threads",
        WARN,
        f"{seen}: {', '.join(too_many)} exceed the cores, so threads wait for each other",
        f"export OMP_NUM_THREADS={cores} (or lower) before starting Python, or torch.set_num_threads({cores}) "
        f"in the main process",
    )


def _describe_accelerator(torch: Any) -> Optional[str]:
    if torch.cuda.is_available():  # CUDA and ROCm
        return f"CUDA, {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6: MPS, XPU, ...
    if accelerator is None:
        return None
    current = accelerator.current_accelerator()
    return None if current is None else f"{current.type}, {accelerator.device_count()} device(s)"


def check_accelerator(torch_installed: bool = FROM_SYSTEM, accelerator: Optional[str] = FROM_SYSTEM) -> Check:
    """Whether ``pin_memory=True`` helps: only with an accelerator to copy to."""
    if torch_installed is FROM_SYSTEM or accelerator is FROM_SYSTEM:
        torch, broken = _import_torch()
        if broken:
            return Check("accelerator", WARN, f"torch is installed but does not import: {broken}", "reinstall torch")
        torch_installed = torch is not None
        accelerator = _describe_accelerator(torch) if torch_installed else None
    if not torch_installed:
        return Check("accelerator", OK, "torch not installed: batches are numpy arrays; pin_memory does not apply")
    if accelerator is None:
        return Check("accelerator", OK, "none: pin_memory has no effect here; leave it False")
    overlap = "pin_memory=True lets host-to-device copies overlap compute (.to(device, non_blocking=True))"
    return Check("accelerator", OK, f"{accelerator}: {overlap}")


def check_versions() -> Check:
    """Versions worth pasting into a bug report."""
    import numpy

    from .. import __version__ as version

    torch, broken = _import_torch()
    torch_version = torch.__version__ if torch is not None else "broken" if broken else "not installed"
    return Check(
        "versions",
        OK,
        f"Python {platform.python_version()}, numpy {numpy.__version__}, conveyor {version}, "
        f"torch {torch_version}, {platform.platform()}",
    )
