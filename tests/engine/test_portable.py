"""The portable fallbacks (``conveyor/_engine/portable.py``), run on Linux
with the Linux-only paths switched off, as on macOS:

    Linux path (off here)           fallback checked here
    memfd_create                    shm_open + shm_unlink (slots, stop flag); a temporary file (stacks)
    posix_fallocate                 ftruncate alone
    pidfd_open                      a spawn worker's life pipe
    pipe2 + F_SETPIPE_SZ            os.pipe
    SIGRTMIN + 3                    SIGUSR2 asks a worker for its stack

and the import where Linux's calls, or Windows' missing ones, are absent
(a subprocess that deletes them before it imports conveyor).
"""

from __future__ import annotations

import functools
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy as np
import pytest

import conveyor
import procutil
from conveyor._engine import portable
from conveyor._engine.errors import WorkerDiedError
from conveyor._engine.executor.watchdog import StallWarning
from conveyor._engine.transport.slots import StopFlag
from conveyor._engine.workers import stacks
from toy_datasets import SlowAt1, Squares

#: A hang shows as a failure, never as a stuck suite.
pytestmark = pytest.mark.timeout(60)

METHODS = ["fork", "spawn"]
TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(conveyor.__file__)))
#: A cap on every wait in this module: far beyond need, below the timeout.
WAIT_CAP_S = 30.0


@pytest.fixture
def linux_paths_off(monkeypatch):
    """The engine as on macOS: every Linux-only call left unused."""
    monkeypatch.setattr(portable, "LINUX_PATHS", False)


# ------------------------------------------------------------------ helpers
class Images:
    """Sample i: a 3x32x32 float32 image full of i (12 KiB; a batch of 8 is
    96 KiB, far above the 32 KiB below which a batch travels inline)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full((3, 32, 32), i, np.float32)


class Growing:
    """Sample i is (i + 1) x 4096 int32: each batch of one needs a bigger slot."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return np.arange((i + 1) * 4096, dtype=np.int32) + i


class Hangs:
    """Every sample after the first hangs (the worker is killed meanwhile)."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        if i > 0:
            time.sleep(WAIT_CAP_S)
        return np.full(16384, i, np.int32)


class Segfaults:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        os.kill(os.getpid(), signal.SIGSEGV)


def record_pid(log_dir: str, worker_id: int) -> None:
    """worker_init_fn: leave ``<log_dir>/worker<id>`` holding this worker's pid."""
    path = os.path.join(log_dir, f"worker{worker_id}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)


def worker_pid(log_dir, worker_id: int = 0) -> int:
    path = os.path.join(str(log_dir), f"worker{worker_id}")
    deadline = time.monotonic() + WAIT_CAP_S
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"worker {worker_id} never ran worker_init_fn"
        time.sleep(0.01)
    return int(open(path).read())


def open_files() -> list[str]:
    """What each of this process's descriptors refers to."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:  # the descriptor listdir itself used
            pass
    return found


def on_shared_memory(array: np.ndarray) -> bool:
    """Whether ``array`` is a view on a mapping (a slot), not a copy that
    travelled through the pipe."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):
        base = base.obj
    return isinstance(base, mmap.mmap)


def conveyor_names(directory: str) -> set[str]:
    try:
        return {name for name in os.listdir(directory) if name.startswith(portable.SHM_PREFIX)}
    except OSError:
        return set()


# ----------------------------------------------------------- the switch
def test_the_switch_turns_each_linux_path_off(linux_paths_off):
    assert stacks.stack_signal() == signal.SIGUSR2
    assert not portable.pidfd_works()
    fd = portable.shared_memory_file("slot")
    try:
        target = os.readlink(f"/proc/self/fd/{fd}")
        assert target.startswith("/dev/shm/conveyor-slot-") and target.endswith("(deleted)"), target
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)
    r, w = portable.pipe(1 << 20)
    os.close(r)
    os.close(w)


def test_the_linux_paths_are_the_default_on_linux():
    if portable.LINUX_PATHS is False:
        pytest.skip("CONVEYOR_PORTABLE=1 is set for this run")
    assert stacks.stack_signal() == signal.SIGRTMIN + 3
    fd = portable.shared_memory_file("slot")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:conveyor-slot")
    finally:
        os.close(fd)
    assert portable.workers_unsupported() is None


# ----------------------------------------------------- batches and slots
@pytest.mark.parametrize("method", METHODS)
def test_batches_are_right_and_big_ones_are_views_on_unlinked_shared_memory(linux_paths_off, method):
    expected = [b.tolist() for b in conveyor.DataLoader(Images(40), batch_size=8)]
    small = [b.tolist() for b in conveyor.DataLoader(Squares(20), batch_size=4)]
    loader = conveyor.DataLoader(Images(40), batch_size=8, num_workers=2, multiprocessing_context=method)
    got = []
    for batch in loader:
        assert on_shared_memory(batch), "a 96 KiB batch should be a view on a slot"
        if not got:
            files = open_files()
            slots = [f for f in files if f.startswith("/dev/shm/conveyor-slot-")]
            assert slots and all(f.endswith("(deleted)") for f in slots), files
            assert [f for f in files if f.startswith("/dev/shm/conveyor-stop-")], "the stop flag is shared memory too"
            assert not [f for f in files if "memfd:" in f or "pidfd" in f], files
            assert not conveyor_names("/dev/shm"), "every name is unlinked as soon as it is made"
        got.append(batch.tolist())
    assert got == expected
    loader = conveyor.DataLoader(Squares(20), batch_size=4, num_workers=2, multiprocessing_context=method)
    assert [b.tolist() for b in loader] == small


@pytest.mark.parametrize("method", METHODS)
def test_a_slot_grows_without_posix_fallocate(linux_paths_off, method):
    expected = [b.tolist() for b in conveyor.DataLoader(Growing(), batch_size=1)]
    loader = conveyor.DataLoader(Growing(), batch_size=1, num_workers=1, multiprocessing_context=method)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no note that a slot could not grow
        got = [b.tolist() for b in loader]
    assert got == expected


def test_where_shared_memory_is_sized_once_a_bigger_batch_travels_through_the_pipe(linux_paths_off, monkeypatch):
    """macOS lets a POSIX shared-memory object be sized once (a second
    ftruncate fails with EINVAL); emulated here, and inherited by fork
    workers. Every batch is still right, with one warning that says why."""
    real_ftruncate = os.ftruncate

    def once(fd, length):
        if os.fstat(fd).st_size > 0:
            raise OSError(22, "Invalid argument")
        real_ftruncate(fd, length)

    expected = [b.tolist() for b in conveyor.DataLoader(Growing(), batch_size=1)]
    monkeypatch.setattr(os, "ftruncate", once)
    loader = conveyor.DataLoader(
        Growing(), batch_size=1, num_workers=1, prefetch_factor=1, multiprocessing_context="fork"
    )
    with pytest.warns(UserWarning, match="sizes POSIX shared memory once only") as record:
        got = [b.tolist() for b in loader]
    assert got == expected
    assert len(record) == 1, [str(w.message) for w in record]


def test_the_stop_flag_is_seen_by_a_process_that_inherits_it(linux_paths_off):
    flag = StopFlag()
    try:
        code = (
            "import sys\nfrom conveyor._engine.transport.slots import StopFlag\n"
            "sys.exit(0 if StopFlag(int(sys.argv[1])).is_set() else 1)"
        )
        run = functools.partial(
            subprocess.run, [sys.executable, "-c", code, str(flag.fd)], pass_fds=(flag.fd,), timeout=WAIT_CAP_S
        )
        assert run().returncode == 1
        flag.set()
        assert run().returncode == 0
    finally:
        flag.close()


# ------------------------------------------------------------- sentinels
@pytest.mark.parametrize("method", METHODS)
def test_a_worker_killed_with_sigkill_is_reported(linux_paths_off, tmp_path, method):
    """Under spawn the death is seen through the worker's life pipe: the
    loader's timeout (far longer) would fire instead if it were not."""
    loader = conveyor.DataLoader(
        Hangs(),
        batch_size=1,
        num_workers=1,
        multiprocessing_context=method,
        timeout=WAIT_CAP_S,
        worker_init_fn=functools.partial(record_pid, str(tmp_path)),
    )
    it = iter(loader)
    assert next(it).tolist() == [[0] * 16384]
    pid = worker_pid(tmp_path)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as info:
        next(it)
    assert str(info.value).startswith(f"DataLoader worker (pid {pid}) is killed by signal: Killed."), str(info.value)
    del it


@pytest.mark.parametrize("method", METHODS)
def test_a_crashed_worker_reports_its_stack_from_the_temporary_file(linux_paths_off, method):
    loader = conveyor.DataLoader(Segfaults(), batch_size=1, num_workers=1, multiprocessing_context=method)
    with pytest.raises(WorkerDiedError) as info:
        list(loader)
    message = str(info.value)
    assert "Segmentation fault" in message and "Its Python stack when it crashed:" in message, message
    assert "in __getitem__" in message, message


# ---------------------------------------------------------- stack dumps
@pytest.mark.parametrize("method", METHODS)
def test_a_stall_warning_shows_the_stack_asked_for_with_sigusr2(linux_paths_off, tmp_path, method):
    loader = conveyor.DataLoader(
        SlowAt1(3, 1.5),
        batch_size=1,
        num_workers=1,
        stall_warning=0.5,
        multiprocessing_context=method,
        worker_init_fn=functools.partial(record_pid, str(tmp_path)),
    )
    it = iter(loader)
    worker_pid(tmp_path)  # start-up stays out of the stall window
    with pytest.warns(StallWarning) as record:
        got = [b.tolist() for b in it]
    assert got == [[0], [1], [2]]
    stalls = [str(w.message) for w in record if issubclass(w.category, StallWarning)]
    assert len(stalls) == 1, stalls
    stack = stalls[0].split("Its stack:", 1)[1]
    assert "__getitem__" in stack and "toy_datasets.py" in stack, stalls[0]
    del it


# ------------------------------------------------- the main process killed
KILLED_SCRIPT = """
import sys, time
import numpy as np
import conveyor
from conveyor._engine import portable

class Images:
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return np.full((3, 32, 32), i, np.float32)

if __name__ == "__main__":
    assert not portable.LINUX_PATHS
    loader = conveyor.DataLoader(Images(), batch_size=8, num_workers=2, multiprocessing_context=sys.argv[1])
    for k, batch in enumerate(loader):
        if k == 5:
            print("loading", flush=True)
            time.sleep(60)  # killed meanwhile, with slots in use and batches in flight
"""


@pytest.mark.parametrize("method", METHODS)
def test_nothing_is_left_behind_when_the_main_process_is_killed(tmp_path, method):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(KILLED_SCRIPT))
    env = dict(os.environ, CONVEYOR_PORTABLE="1")
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, TESTS_DIR] + [p for p in [env.get("PYTHONPATH")] if p])
    shm_before, tmp_before = conveyor_names("/dev/shm"), conveyor_names(tempfile.gettempdir())
    proc = subprocess.Popen(
        [sys.executable, str(script), method], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    family: list = []
    try:
        assert proc.stdout.readline() == "loading\n", "the script ended before it loaded"
        family = list(procutil.descendants(proc.pid))
        assert len(family) >= 2, family
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        left = procutil.wait_until_gone(family, WAIT_CAP_S)
        assert not left, f"workers {left} outlived their SIGKILLed main process"
    finally:
        proc.stdout.close()
        for pid in procutil.running(family):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert conveyor_names("/dev/shm") - shm_before == set()
    assert conveyor_names(tempfile.gettempdir()) - tmp_before == set()


# ------------------------------------------------------------- imports
STRIP_LINUX = """
import os, signal, sys
sys.modules["fcntl"] = None  # "import fcntl" now raises ImportError
for name in ("memfd_create", "pidfd_open", "pipe2", "posix_fallocate"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("SIGRTMIN", "SIGRTMAX"):
    if hasattr(signal, name):
        delattr(signal, name)
"""

STRIP_WINDOWS = (
    STRIP_LINUX
    + """
import faulthandler, select
for name in ("fork", "register_at_fork", "readv", "writev"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("SIGUSR1", "SIGUSR2"):
    delattr(signal, name)
del faulthandler.register, select.poll
"""
)


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([SRC_DIR, TESTS_DIR] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop(portable.ENV_VAR, None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=WAIT_CAP_S)


def test_without_linux_calls_conveyor_imports_and_workers_load_through_the_fallbacks():
    """No fcntl, memfd, pidfd, pipe2, posix_fallocate, real-time signals:
    import works, and so do workers (fork and spawn), through the fallbacks."""
    code = (
        "import torch\n"
        + STRIP_LINUX
        + textwrap.dedent(
            """
        import conveyor, conveyor.torch
        from toy_datasets import Squares
        expected = [b.tolist() for b in conveyor.DataLoader(Squares(24), batch_size=4)]
        for method in ("fork", "spawn"):
            loader = conveyor.DataLoader(Squares(24), batch_size=4, num_workers=2, multiprocessing_context=method)
            assert [b.tolist() for b in loader] == expected, method
        print("ok")
        """
        )
    )
    result = run_python(code)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


WINDOWS_CHECK = textwrap.dedent(
    """
    import conveyor, conveyor.torch
    assert [b.tolist() for b in conveyor.DataLoader(list(range(6)), batch_size=3)] == [[0, 1, 2], [3, 4, 5]]
    assert len(list(conveyor.torch.DataLoader(list(range(6)), batch_size=3))) == 2
    try:  # refused when the loader is built, naming the way out
        conveyor.DataLoader(list(range(6)), batch_size=3, num_workers=2)
    except NotImplementedError as exc:
        print(exc)
    """
)


@pytest.mark.parametrize("signals", ["posix", "windows"])
def test_where_workers_cannot_run_conveyor_imports_loads_in_process_and_says_so(signals):
    """As on Windows: no poll, no fork, no readv/writev, no
    faulthandler.register, no SIGUSR1/2 (and, for "windows", none of the
    POSIX-only signals). ``import conveyor`` and ``num_workers=0`` work;
    ``num_workers=2`` raises an error that names the way out."""
    strip = STRIP_WINDOWS
    if signals == "windows":
        strip += (
            "for name in ('SIGKILL', 'SIGBUS', 'SIGCHLD', 'SIGHUP', 'SIGQUIT', 'SIGPIPE', 'SIGALRM'):\n"
            "    delattr(signal, name)\n"
        )
    result = run_python("import torch\n" + strip + WINDOWS_CHECK)
    assert result.returncode == 0, result.stderr
    assert "do not run on this platform" in result.stdout and "num_workers=0" in result.stdout, result.stdout
