"""A Ray that conveyor started is stopped by conveyor (issue 32, item 6):
with ``worker_method="ray"`` and no ``ray.init()`` in the script, nothing
of Ray is left once the script ends, with or without ``ray.shutdown()``.

The script is a torch user's (torch imported first, whose own finalizers
then run at exit after Ray's shutdown, and a loader's with them), and it
ends with its loader still alive (held by the traceback of the exception
it ends with), so that the loader is stopped after Ray has shut down at
exit: stopping its actors then must not start a Ray of its own (each of
Ray's calls does, when Ray is not running), which nothing would ever stop.
It runs in a session of its own; every process of that session must be
gone once it has ended.
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

pytest.importorskip("ray")
pytest.importorskip("torch")

#: How long Ray's processes get to end after the script did (Ray's own
#: shutdown stops a dozen of them; a loaded machine is slow at it).
GONE_WITHIN_S = 60.0

SCRIPT = textwrap.dedent(
    """
    import torch
    import conveyor.torch as data

    def train():
        loader = data.DataLoader(list(range(8)), batch_size=2, num_workers=2, worker_method="ray",
                                 persistent_workers=True)
        for epoch in range(2):
            assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        raise RuntimeError("the script ends, its loader alive and no ray.shutdown()")

    train()
    """
)


def session_processes(sid: int) -> list[int]:
    """The processes of session ``sid`` that still run."""
    found = []
    for pid in procutil.pids():
        try:
            if os.getsid(pid) == sid and procutil.is_running(pid):
                found.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return found


@pytest.mark.timeout(300)
def test_a_ray_conveyor_started_leaves_nothing_once_the_script_ends(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    # RAY_ADDRESS=local: conveyor's ray.init() starts a Ray of its own, even while a ray.cluster_utils.Cluster
    # of another run on this machine has written its address where a plain ray.init() would look.
    env = procutil.script_env(PYTHONWARNINGS="ignore", RAY_AUTH_MODE="disabled", RAY_ADDRESS="local")
    # stderr goes to a file, not a pipe: a process left behind would hold a
    # pipe open and make reading it hang instead of failing the test.
    with open(tmp_path / "stderr.txt", "w") as stderr_file:
        proc = subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=stderr_file,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=240)
        stderr = (tmp_path / "stderr.txt").read_text()
        assert "the script ends, its loader alive" in stderr, stderr[-3000:]
        assert stderr.count("Started a local Ray instance") == 1, stderr[-3000:]
        deadline = time.monotonic() + GONE_WITHIN_S
        left = session_processes(proc.pid)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = session_processes(proc.pid)
        described = {pid: procutil.cmdline(pid)[:80] for pid in left}
        assert not left, f"Ray's processes outlived the script that started Ray through conveyor: {described}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in session_processes(proc.pid):  # (the test has failed: leave nothing running)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
