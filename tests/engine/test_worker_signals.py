"""Worker processes never run the handlers the user installed in the main
process (issue 32, item 2; the table in _engine/workers/worker_signals.py).

    a job's signal to the whole process group   only the main process's handler runs; the workers
    (scancel's SIGTERM, SLURM's USR1, SIGHUP,   ignore it and serve on, so the loop goes on after
    Ctrl-C)                                     its handler (fork, spawn, forkserver)
    a handler of the worker's own               installed by worker_init_fn: it runs
    a per-sample signal.alarm timeout           its TimeoutError reaches the loop

Each case runs a script in a session of its own (``start_new_session``),
so that the signal sent to its process group reaches nothing of the test
run's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import conveyor
import procutil

#: How long the script may take to have its workers serving (spawn on a
#: loaded machine); never asserted, only a bound on the wait.
READY_WITHIN_S = 60.0

SCRIPT = '''
import os, signal, sys, time
import numpy as np
import conveyor

out, method, signame, own = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "own"
signum = getattr(signal, signame)


class Slowish:
    """Each sample takes a little while, and leaves a file named for the worker's pid."""

    def __len__(self):
        return 10 ** 6

    def __getitem__(self, i):
        open(os.path.join(out, f"worker-{os.getpid()}"), "w").close()
        time.sleep(0.005)
        return np.array(i)


def note(path, line):
    with open(os.path.join(out, path), "a") as f:
        f.write(line + "\\n")


def worker_handler(signum, frame):
    note("worker-handlers", str(os.getpid()))


def init(worker_id):
    if own:  # (the worker's own handler, installed after conveyor's reset: it must run)
        signal.signal(signum, worker_handler)


if __name__ == "__main__":
    received = 0
    asked = []

    def checkpoint(signum, frame):  # (what a training script does on SIGTERM: save where it stands)
        note("checkpoint", f"{os.getpid()} {received}")
        asked.append(received)

    signal.signal(signum, checkpoint)
    loader = conveyor.DataLoader(Slowish(), batch_size=2, num_workers=2, multiprocessing_context=method,
                                 worker_init_fn=init)
    ready = os.path.join(out, "ready")
    for batch in loader:
        received += 1
        workers = [n for n in os.listdir(out) if n.startswith("worker-") and n != "worker-handlers"]
        if received >= 4 and len(workers) == 2 and not os.path.exists(ready):
            open(ready + ".tmp", "w").close()
            os.rename(ready + ".tmp", ready)  # (the test sends the signal now)
        if asked and received >= asked[0] + 3:  # (the workers served on after the signal)
            break
    note("done", f"{received}")
'''


def run_and_signal(tmp_path, method, signame, own=False):
    """Run the script; once its workers serve, send ``signame`` to its whole
    process group; its output folder once it has ended, and its pid."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "out"
    out.mkdir()
    env = procutil.script_env()
    with open(tmp_path / "stderr.txt", "w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(out), method, signame, "own" if own else "main"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + READY_WITHIN_S
            while not (out / "ready").exists():
                assert proc.poll() is None, f"the script ended early: {(tmp_path / 'stderr.txt').read_text()}"
                assert time.monotonic() < deadline, "the script's workers did not start"
                time.sleep(0.02)
            os.killpg(proc.pid, getattr(signal, signame))
            code = proc.wait(timeout=READY_WITHIN_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        stderr.seek(0)
        assert code == 0, f"the script failed ({code}): {stderr.read()}"
    return out, proc.pid


def lines(path):
    return path.read_text().split() if path.exists() else []


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "method,signame",
    [("fork", name) for name in ("SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGINT")]
    + [("spawn", "SIGTERM"), ("forkserver", "SIGTERM")],
)
def test_a_signal_to_the_job_runs_the_main_process_handler_only(tmp_path, method, signame):
    """A checkpointing handler writes its pid and the batches received: the
    main process's line alone, and the loop goes on after it (no worker
    ran the handler or died of the signal)."""
    out, main_pid = run_and_signal(tmp_path, method, signame)
    checkpoint = (out / "checkpoint").read_text().splitlines()
    assert len(checkpoint) == 1, f"more than one process ran the handler: {checkpoint}"
    pid, received = (int(x) for x in checkpoint[0].split())
    assert pid == main_pid
    assert received >= 4
    assert int(lines(out / "done")[0]) >= received + 3


@pytest.mark.timeout(60)
def test_a_handler_the_worker_installs_itself_still_runs(tmp_path):
    out, main_pid = run_and_signal(tmp_path, "fork", "SIGUSR1", own=True)
    workers = {int(n.split("-")[1]) for n in os.listdir(out) if n.startswith("worker-") and n != "worker-handlers"}
    assert {int(p) for p in lines(out / "worker-handlers")} == workers
    assert [int(x) for x in lines(out / "checkpoint")][0] == main_pid


class AlarmedSample:
    """Sample 3 hangs; a per-sample alarm of its own ends it with TimeoutError."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        def too_slow(signum, frame):
            raise TimeoutError(f"sample {i} took too long")

        signal.signal(signal.SIGALRM, too_slow)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            if i == 3:
                time.sleep(60)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return np.array(i)


@pytest.mark.timeout(60)
def test_a_per_sample_alarm_in_a_worker_still_works():
    """An alarm handler of the main process is not the worker's; the
    dataset's own one, set in __getitem__, runs and its error reaches the loop."""
    previous = signal.signal(signal.SIGALRM, lambda *_: os._exit(99))
    try:
        loader = conveyor.DataLoader(AlarmedSample(), batch_size=2, num_workers=2, multiprocessing_context="fork")
        with pytest.raises(TimeoutError, match="sample 3 took too long"):
            list(loader)
    finally:
        signal.signal(signal.SIGALRM, previous)


#: The signals the forkserver script reports, in its order.
JOB_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)

OWN_FORKSERVER_SCRIPT = """
import multiprocessing, signal, sys, time
import conveyor


def handlers(queue):
    queue.put([str(signal.getsignal(s)) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)])  # (JOB_SIGNALS)


if __name__ == "__main__":
    ctx = multiprocessing.get_context("forkserver")
    if sys.argv[1] == "after a loader":  # (the forkserver then has conveyor preloaded, and ignores the job's signals)
        list(conveyor.DataLoader(list(range(4)), batch_size=2, num_workers=1, multiprocessing_context="forkserver"))
    queue = ctx.Queue()
    child = ctx.Process(target=handlers, args=(queue,))
    child.start()
    print(queue.get(timeout=60))
    child.join()
    child = ctx.Process(target=time.sleep, args=(60,))
    child.start()
    child.terminate()
    child.join(30)
    print(child.exitcode)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["after a loader", "without a loader"])
def test_the_users_own_forkserver_processes_keep_the_default_signals(tmp_path, when):
    """The forkserver ignores the job's signals for conveyor's workers; the
    processes it starts for the user's own code (which import conveyor
    themselves) still get the defaults, so ``terminate()`` ends them."""
    script = tmp_path / "own.py"
    script.write_text(OWN_FORKSERVER_SCRIPT)
    env = procutil.script_env()
    done = subprocess.run([sys.executable, str(script), when], env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    seen, code = done.stdout.splitlines()[-2:]
    # (the defaults: what a fresh process started from here gets; under nohup, SIGHUP ignored)
    inherited = [signal.SIG_IGN if signal.getsignal(s) == signal.SIG_IGN else signal.SIG_DFL for s in JOB_SIGNALS]
    assert seen == str([str(each) for each in inherited])
    assert int(code) == -signal.SIGTERM
