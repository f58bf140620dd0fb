"""The suite's leak check (conftest.leave_nothing_behind) blames a test only
for what its own process tree made: a file another program puts in
/dev/shm while the test runs is not the test's leak, while one the test
process or its child holds, or one with conveyor's name, is."""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import conftest
import procutil

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(not os.path.isdir(procutil.SHM_DIR), reason="no /dev/shm here"),
]

#: How long a helper process gets to make its file (it takes milliseconds).
APPEAR_WITHIN_S = 20.0

#: A process that makes /dev/shm/<name> for each name given, writes its pid
#: next to the first, then either exits at once (leaving the files: a
#: program that forgot them) or keeps them open until they are unlinked.
MAKER = textwrap.dedent(
    """
    import os, sys, time
    keep, names = sys.argv[1] == "keep", sys.argv[2:]
    fds = []
    for name in names:
        fd = os.open(os.path.join("/dev/shm", name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, 4096)
        fds.append(fd)
    with open(os.path.join("/dev/shm", names[0]) + ".pid", "w") as f:
        f.write(str(os.getpid()))
    if not keep:
        sys.exit(0)
    deadline = time.monotonic() + 60
    while os.path.exists(os.path.join("/dev/shm", names[0])) and time.monotonic() < deadline:
        time.sleep(0.02)
    """
)


def _wait_for_pid_file(name: str) -> int:
    path = Path(procutil.SHM_DIR, name + ".pid")
    deadline = time.monotonic() + APPEAR_WITHIN_S
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text:
            return int(text)
        time.sleep(procutil.POLL_S)
    raise AssertionError(f"the helper never made /dev/shm/{name}")


def _unlink(*names: str) -> None:
    for name in names:
        for path in (Path(procutil.SHM_DIR, name), Path(procutil.SHM_DIR, name + ".pid")):
            path.unlink(missing_ok=True)


def _start_foreign_maker(mode: str, names: list[str]) -> int:
    """Run MAKER as a process that is not our descendant, as another
    program on the machine would be (a shell starts it in the background
    and exits at once, so it is adopted by init); return its pid."""
    argv = " ".join(shlex.quote(arg) for arg in [sys.executable, "-c", MAKER, mode, *names])
    subprocess.run(["sh", "-c", f"{argv} </dev/null >/dev/null 2>&1 &"], check=True)
    return _wait_for_pid_file(names[0])


@pytest.mark.parametrize("mode", ["exit", "keep"])
def test_a_file_another_program_makes_during_the_test_is_not_its_leak(mode):
    """Another program's multiprocessing shared memory (psm_*) and torch
    file (torch_<its pid>_<n>), left behind (its process exited) or held
    open, appear in /dev/shm during the test: not counted."""
    before = conftest.snapshot()
    token = secrets.token_hex(4)
    names = [f"psm_{token}", f"sem.mp-{token}"]
    try:
        pid = _start_foreign_maker(mode, names)
        torch_name = f"torch_{pid}_{token}"
        Path(procutil.SHM_DIR, torch_name).touch()  # as if that process had made it too
        names.append(torch_name)
        assert pid not in procutil.descendants(), "the helper should not be this test's descendant"
        assert set(names) <= procutil.shm_files()
        assert procutil.new_shm_files(before.shm) == set()
        assert "/dev/shm files" not in conftest.leftovers(before)
    finally:
        _unlink(*names)


def test_a_file_this_process_holds_is_counted():
    before = conftest.snapshot()
    name = f"psm_{secrets.token_hex(4)}"
    fd = os.open(os.path.join(procutil.SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        assert procutil.new_shm_files(before.shm) == {name}
    finally:
        os.close(fd)
        _unlink(name)


def test_a_file_a_child_holds_is_counted():
    before = conftest.snapshot()
    name = f"psm_{secrets.token_hex(4)}"
    child = subprocess.Popen([sys.executable, "-c", MAKER, "keep", name])
    try:
        assert _wait_for_pid_file(name) == child.pid
        assert procutil.new_shm_files(before.shm) == {name}
    finally:
        _unlink(name)  # the child then exits
        child.wait(APPEAR_WITHIN_S)


def test_a_file_with_conveyor_s_name_left_behind_is_counted():
    """conveyor unlinks its /dev/shm files the moment it makes them, so one
    that stays is a leak, even when nobody holds it any more."""
    before = conftest.snapshot()
    name = f"{procutil.CONVEYOR_SHM_PREFIX}slot-{secrets.token_hex(4)}"
    try:
        Path(procutil.SHM_DIR, name).touch()
        assert procutil.new_shm_files(before.shm) == {name}
    finally:
        _unlink(name)
