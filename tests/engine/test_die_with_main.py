"""No process outlives its main (issue 32, item 6): once the main process
is SIGKILLed (the OOM killer, a scheduler's ``kill -9``), every process it
started that runs user code goes, whatever it is doing.

    worker state                                   methods              ends by
    blocked in a system call (a FIFO's open)       fork, spawn          the kernel, or the watch thread
    idle, persistent, between two epochs           fork, spawn          the kernel, or the watch thread
    loading its config, user code holding the GIL  spawn, forkserver    the kernel (armed before the config loads)
    started by a thread that is not the main one,  fork, spawn          the kernel (the thread that starts a
      holding the GIL                                                   process lives as long as the main)
    ``conveyor pack``'s writers, holding the GIL   fork, spawn          the kernel (armed in each writer)

(Workers busy holding the GIL, sleeping or stopped: test_worker_failures.py.)
Each case runs a script in a session of its own, which the test SIGKILLs
once its processes are in the state, then waits, up to a generous bound,
until they are gone (a zombie counts as gone: its new parent reaps it).
Whatever is left is killed with the session's process group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import procutil

#: How long the script may take to get its processes into the state (spawn
#: on a loaded machine); a bound on the wait, never asserted.
READY_WITHIN_S = 60.0
#: How long the processes get to go once the main process is killed. The
#: kernel kills them at once; the bound only absorbs a loaded machine.
GONE_WITHIN_S = 30.0

COMMON = '''
import os, re, signal, sys, threading, time
import numpy as np
import conveyor

out = sys.argv[1]


def mark():
    """Say that this process is in the state the test waits for."""
    open(os.path.join(out, f"pid-{os.getpid()}"), "w").close()


def hold_the_gil():
    re.match(r"(a+)+$", "a" * 64 + "b")  # (backtracks for hours; no other thread of this process runs)
'''

LOADER_SCRIPT = (
    COMMON
    + '''

class Blocked:
    def __len__(self):
        return 100

    def __getitem__(self, i):
        mark()
        open(os.path.join(out, "fifo"), "rb")  # (blocks in open(): nobody ever opens it for writing)
        return np.array(i)


class Quick:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        mark()
        return np.array(i)


class Busy(Quick):
    def __getitem__(self, i):
        mark()
        hold_the_gil()
        return np.array(i)


class SlowToLoad(Quick):
    """Unpickling it in the worker (spawn, forkserver) runs user code that holds the GIL."""

    def __init__(self):
        self.index = "an index the worker loads"  # (a state to unpickle: __setstate__ is called)

    def __setstate__(self, state):
        mark()
        hold_the_gil()


if __name__ == "__main__":
    method, state = sys.argv[2], sys.argv[3]
    if state == "blocked":
        os.mkfifo(os.path.join(out, "fifo"))
        list(conveyor.DataLoader(Blocked(), batch_size=2, num_workers=2, multiprocessing_context=method))
    elif state == "idle":
        loader = conveyor.DataLoader(Quick(), batch_size=2, num_workers=2, multiprocessing_context=method,
                                     persistent_workers=True)
        list(loader)
        open(os.path.join(out, "ready"), "w").close()
        time.sleep(600)
    elif state == "loading":
        list(conveyor.DataLoader(SlowToLoad(), batch_size=2, num_workers=2, multiprocessing_context=method))
    elif state == "from a thread":
        loader = conveyor.DataLoader(Busy(), batch_size=2, num_workers=2, multiprocessing_context=method)
        thread = threading.Thread(target=lambda: list(loader))
        thread.start()
        thread.join()
'''
)

PACK_SCRIPT = (
    COMMON
    + """

class Busy:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        mark()
        hold_the_gil()
        return {"txt": b"x"}


def make():
    return Busy()


if __name__ == "__main__":
    import conveyor.cli.packing as packing
    from conveyor.cli import main

    method = sys.argv[2]
    packing.multiprocessing.get_all_start_methods = lambda: [method]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(["pack", f"{os.path.splitext(os.path.basename(__file__))[0]}:make", os.path.join(out, "shards"),
                   "--max-samples", "1", "--workers", "2"]))
"""
)


def kill_main_and_wait(tmp_path, script_text, *args, processes=2):
    """Run the script; once ``processes`` of its processes are in the state
    (each left a pid file; and the script said "ready" if it says so),
    SIGKILL it; the pids of those still running after GONE_WITHIN_S, and
    how long the others took."""
    script = tmp_path / "deathscript.py"
    script.write_text(textwrap.dedent(script_text))
    out = tmp_path / "out"
    out.mkdir()
    env = procutil.script_env()
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(out), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + READY_WITHIN_S
            wants_ready = "idle" in args
            while True:
                pids = [int(name.split("-")[1]) for name in os.listdir(out) if name.startswith("pid-")]
                if len(pids) >= processes and (not wants_ready or (out / "ready").exists()):
                    break
                assert proc.poll() is None, f"the script ended early: {(tmp_path / 'stderr.txt').read_text()}"
                assert time.monotonic() < deadline, f"the processes did not get there: {pids}"
                time.sleep(0.02)
            pids = [pid for pid in pids if pid != proc.pid]
            assert proc.poll() is None, f"the script ended early: {(tmp_path / 'stderr.txt').read_text()}"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_at = time.monotonic()
            left = procutil.wait_until_gone(pids, GONE_WITHIN_S)
            took_s = time.monotonic() - killed_at
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # (whatever is left: the test has failed)
            except ProcessLookupError:
                pass
            if proc.poll() is None:
                proc.wait()
    return left, took_s


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "method,state",
    [(m, s) for m in ("fork", "spawn") for s in ("blocked", "idle", "from a thread")]
    + [("spawn", "loading"), ("forkserver", "loading")],
)
def test_workers_go_with_a_killed_main_process(tmp_path, method, state):
    left, took_s = kill_main_and_wait(tmp_path, LOADER_SCRIPT, method, state)
    assert not left, f"workers {left} ({state}, {method}) outlived their SIGKILLed main process by {took_s:.0f} s"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pack_writers_go_with_a_killed_pack(tmp_path, method):
    left, took_s = kill_main_and_wait(tmp_path, PACK_SCRIPT, method)
    assert not left, f"pack's writers {left} ({method}) outlived the SIGKILLed command by {took_s:.0f} s"
