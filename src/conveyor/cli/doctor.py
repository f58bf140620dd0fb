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

# (The docstring above is `conveyor doctor --help`.) The checks of the machine
# are doctor_checks.py's, those of a --data folder doctor_data.py's; here they
# run in order and make the report. Every check is looked up in this module's
# names when it runs, so a test can replace one with monkeypatch.setattr.

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from .._engine.cpu import usable_cores
from .doctor_checks import (
    FAIL,
    OK,
    WARN,
    Check,
    check_accelerator,
    check_cores,
    check_memfd,
    check_open_files,
    check_shm,
    check_start_method,
    check_threads,
    check_versions,
    shared_memory_kind,
)
from .doctor_data import ReadPass, check_data, check_images, read_pass, sample_files

__all__ = [
    "OK",
    "WARN",
    "FAIL",
    "Check",
    "ReadPass",
    "check_accelerator",
    "check_cores",
    "check_data",
    "check_images",
    "check_memfd",
    "check_open_files",
    "check_shm",
    "check_start_method",
    "check_threads",
    "check_versions",
    "read_pass",
    "sample_files",
    "shared_memory_kind",
    "run_checks",
    "format_text",
]


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
        "--data",
        type=Path,
        metavar="DIR",
        help="also time reading this folder, cold and warm (drops its cached pages first)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON list of {name, status, detail, fix} instead of text"
    )


def run(args: argparse.Namespace) -> int:
    checks = run_checks(usable_cores() if args.num_workers is None else args.num_workers, args.data)
    print(json.dumps([asdict(check) for check in checks], indent=2) if args.json else format_text(checks))
    return 1 if any(check.status == FAIL for check in checks) else 0
