"""The checks of `conveyor doctor --data DIR`: how fast that folder reads,
cold (its cached pages dropped first) and warm, whether its files are too
small to be read one by one, and whether its JPEGs decode fast here.
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from .doctor_checks import FAIL, OK, WARN, Check, size_text

_MIB = 1 << 20
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
    seen = f"{len(files)} files, {size_text(cold.bytes)}, mean {size_text(mean_bytes)}: {first} {cold.rate()}"
    seen += f", warm {warm.rate()}"
    problems, fixes = [], []
    slowdown = warm.bytes_per_s / max(cold.bytes_per_s, 1e-9)
    if slowdown > COLD_SLOWDOWN_WARN and cold.bytes_per_s < COLD_WARN_BELOW_BYTES_PER_S:
        problems.append(f"reading from storage is {slowdown:.0f}× slower than from the page cache")
        # Packing is the small-files fix below; for big files it would not help.
        fixes.append(
            "copy the data to a local SSD (or into memory if it fits), or raise num_workers so that more "
            "reads are in flight at once"
        )
    if mean_bytes < SMALL_FILE_BYTES:
        problems.append("files this small cost an open and a lookup each")
        fixes.append("pack samples into shard files of ~100 MiB (tar or record files) read in order")
    if not problems:
        return Check("data", OK, seen)
    return Check("data", WARN, f"{seen}; {'; '.join(problems)}", "; ".join(fixes))


def check_images(folder: Path) -> Optional[Check]:
    """JPEGs in the data folder: whether conveyor.images decodes them fast
    here, and whether they are large (conveyor/images/advice.py); None without JPEGs."""
    from ..images.advice import jpeg_advice

    found = jpeg_advice([path for path, _ in sample_files(Path(folder))]) if Path(folder).is_dir() else None
    return None if found is None else Check("images", *found)
