"""Check this machine for what makes an input pipeline slow or crash.

The checks: versions, cores against the workers you plan, the start
method, thread settings, shared memory (memfd and /dev/shm), the open-file
limit and the accelerator; with --data DIR, also how fast that folder
reads, cold (its cached pages dropped first) and warm.

Each check prints one line, OK, WARN or FAIL, with what it saw; a warning
or failure adds a "fix:" line that says what to do. The exit status is 1
when a check fails, else 0, so a job's prologue or CI can stop on it.

examples:
  conveyor doctor
  conveyor doctor --num-workers 8 --data /data/train
  conveyor doctor --json > doctor.json
"""

# (The docstring above is `conveyor doctor --help`.) Every check is a function
# of the values it judges; each value is read from this machine unless passed
# (the default FROM_SYSTEM), which is how the tests fake a bad machine. torch
# is imported only inside the checks that ask it, and only when installed.

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import platform
import stat
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar, Union

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
#: How much of a --data folder to read: enough to get past the disk's own
#: cache, little enough to take seconds.
READ_MAX_BYTES = 256 * _MIB
READ_MAX_FILES = 10_000
_READ_CHUNK_BYTES = 1 * _MIB
#: Below this mean size, opening a file costs about as much as reading it.
SMALL_FILE_BYTES = 64 * 1024
#: Storage sets the pace when cold reads are this many times slower than
#: warm ones and also below the rate: any disk is some 5× slower than the page
#: cache, but an 8-GPU ResNet-50 job reads ~3000 JPEGs of ~110 KB, ~330 MB/s.
COLD_SLOWDOWN_WARN = 5.0
COLD_WARN_BELOW_BYTES_PER_S = 400e6


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


def _size(n: float) -> str:
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
            "cores", WARN, f"{seen}: more processes than cores take turns with each other and the training loop",
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
            "memfd", WARN, f"no anonymous shared memory ({why}): batches travel through pipes (same data, slower)",
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
        seen = f"{_size(free_bytes)} free" + (f" of {_size(total_bytes)}" if total_bytes is not None else "")
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
        "threads", WARN, f"{seen}: {', '.join(too_many)} exceed the cores, so threads wait for each other",
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
        "versions", OK, f"Python {platform.python_version()}, numpy {numpy.__version__}, conveyor {version}, "
        f"torch {torch_version}, {platform.platform()}",
    )


# -------------------------------------------------------------- data folder


@dataclass(frozen=True)
class ReadPass:
    """One timed read of the sampled files, each from start to end."""

    files: int
    bytes: int
    seconds: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / max(self.seconds, 1e-9)

    def rate(self) -> str:
        return f"{self.bytes_per_s / 1e6:.0f} MB/s, {self.files / max(self.seconds, 1e-9):.0f} files/s"


def sample_files(folder: Path, max_bytes: int = READ_MAX_BYTES, max_files: int = READ_MAX_FILES) -> list[tuple]:
    """(path, size) of regular files under ``folder`` in sorted walk order,
    until ``max_bytes`` or ``max_files`` (a dataset's first files stand in
    for the rest: walking all of a big one can take minutes)."""
    found: list[tuple[str, int]] = []
    total = 0
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:  # a broken link, or a file gone since the listing
                continue
            if stat.S_ISREG(st.st_mode):
                found.append((path, st.st_size))
                total += st.st_size
                if total >= max_bytes or len(found) >= max_files:
                    return found
    return found


def _drop_cached_pages(path: str) -> None:
    """Ask the kernel to forget ``path``'s cached pages. Needs no root, and
    drops only clean pages: a file written moments ago may stay cached."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_pass(paths: Sequence[str], cold: bool) -> ReadPass:
    """Read every file through once and time it; ``cold`` first drops their
    cached pages (where the system has ``posix_fadvise``), outside the timing."""
    if cold and hasattr(os, "posix_fadvise"):
        for path in paths:
            _drop_cached_pages(path)
    buffer = bytearray(_READ_CHUNK_BYTES)  # one buffer: time the storage, not the allocator
    total = 0
    start = time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                total += n
    return ReadPass(len(paths), total, time.perf_counter() - start)


def check_data(folder: Path, read: Callable[[Sequence[str], bool], ReadPass] = read_pass) -> Check:
    """Read speed of a dataset folder, cold then warm (``read(paths, cold)``),
    and whether its files are too small to be read one by one."""
    folder = Path(folder)
    if not folder.is_dir():
        return Check("data", FAIL, f"{folder} is not a folder", "pass --data the folder your Dataset reads")
    files = sample_files(folder)
    if not files:
        return Check("data", WARN, f"no files under {folder}", "pass --data the folder your Dataset reads")
    paths = [path for path, _ in files]
    try:
        cold, warm = read(paths, True), read(paths, False)
    except OSError as exc:
        return Check("data", FAIL, f"cannot read {folder}: {exc}", "check the files' permissions and the mount")
    mean_bytes = sum(size for _, size in files) / len(files)
    first = "cold" if hasattr(os, "posix_fadvise") else "first read"
    seen = f"{len(files)} files, {_size(cold.bytes)}, mean {_size(mean_bytes)}: {first} {cold.rate()}"
    seen += f", warm {warm.rate()}"
    problems, fixes = [], []
    slowdown = warm.bytes_per_s / max(cold.bytes_per_s, 1e-9)
    if slowdown > COLD_SLOWDOWN_WARN and cold.bytes_per_s < COLD_WARN_BELOW_BYTES_PER_S:
        problems.append(f"reading from storage is {slowdown:.0f}× slower than from the page cache")
        # Packing is the small-files fix below; for big files it would not help.
        fixes.append("copy the data to a local SSD (or into memory if it fits), or raise num_workers so that more "
                     "reads are in flight at once")
    if mean_bytes < SMALL_FILE_BYTES:
        problems.append("files this small cost an open and a lookup each")
        fixes.append("pack samples into shard files of ~100 MiB (tar or record files) read in order")
    if not problems:
        return Check("data", OK, seen)
    return Check("data", WARN, f"{seen}; {'; '.join(problems)}", "; ".join(fixes))


# ---------------------------------------------------------------------- CLI


_Found = TypeVar("_Found", bound=Optional[Check])


def _safely(check: Callable[..., _Found], *args: Any, **kwargs: Any) -> Union[_Found, Check]:
    """Run one check; one that raises becomes a WARN naming the error, so a
    probe broken by an odd system does not hide the other checks."""
    try:
        return check(*args, **kwargs)
    except Exception as exc:
        name = getattr(check, "__name__", "check").removeprefix("check_")
        return Check(name, WARN, f"the check itself failed: {type(exc).__name__}: {exc}", "report it to conveyor")


def run_checks(num_workers: int, data: Optional[Path] = None) -> list[Check]:
    """Every check, in the order printed. Each is looked up here by name, so
    a test can replace one with ``monkeypatch.setattr``."""
    kind, why = shared_memory_kind()  # asked once: two checks judge it
    checks = [_safely(check_versions), _safely(check_cores, num_workers), _safely(check_start_method, num_workers)]
    checks += [_safely(check_threads), _safely(check_memfd, kind, why), _safely(check_shm, kind=kind)]
    checks += [_safely(check_open_files), _safely(check_accelerator)]
    if data is not None:
        checks.append(_safely(check_data, data))
        images = _safely(check_images, data)
        checks += [images] if images is not None else []
    return checks


def check_images(folder: Path) -> Optional[Check]:
    """JPEGs in the data folder: whether conveyor.images decodes them fast
    here, and whether they are large (conveyor/images/advice.py); None without JPEGs."""
    from ..images.advice import jpeg_advice

    found = jpeg_advice([path for path, _ in sample_files(Path(folder))]) if Path(folder).is_dir() else None
    return None if found is None else Check("images", *found)


def format_text(checks: Sequence[Check]) -> str:
    """One line per check, a ``fix:`` line under each WARN and FAIL, and a count."""
    lines = []
    for check in checks:
        lines.append(f"{check.status:<4} {check.name}: {check.detail}")
        if check.status != OK and check.fix:
            lines.append(f"     fix: {check.fix}")
    warned, failed = (sum(check.status == status for check in checks) for status in (WARN, FAIL))
    lines.append(f"{len(checks)} checks: {warned} to look at, {failed} failed")
    return "\n".join(lines)


def _count(text: str) -> int:
    if int(text) < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--num-workers", type=_count, metavar="N", help="the num_workers you plan to use (default: the usable cores)"
    )
    parser.add_argument(
        "--data", type=Path, metavar="DIR", help="also time reading this folder, cold and warm (drops its cached pages first)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON list of {name, status, detail, fix} instead of text"
    )


def run(args: argparse.Namespace) -> int:
    checks = run_checks(usable_cores() if args.num_workers is None else args.num_workers, args.data)
    print(json.dumps([asdict(check) for check in checks], indent=2) if args.json else format_text(checks))
    return 1 if any(check.status == FAIL for check in checks) else 0
