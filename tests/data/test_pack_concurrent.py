"""Several ``conveyor pack`` runs of one source into one folder at once:
they take turns through OUT/pack.lock (a waiting run says so on one line,
or refuses with --no-wait), and the folder verifies and is byte-identical
to a single pack; a lock left by a killed run, or by a run on another
machine whose heartbeat stopped, is taken over."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conveyor.cli import main as cli
from conveyor.cli.pack import verify

pytestmark = pytest.mark.timeout(240)

#: Each run waits for this file, so that all start packing together.
GO = "CONVEYOR_TEST_GO"
#: Sample 4 of the slow source blocks once this names a file to create first.
BLOCK = "CONVEYOR_TEST_BLOCK_AT"
START = (
    "import os, sys, time; from conveyor.cli import main\n"
    "go = os.environ.get('CONVEYOR_TEST_GO')\n"
    "deadline = time.monotonic() + 60\n"
    "while go and not os.path.exists(go) and time.monotonic() < deadline: time.sleep(0.005)\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


class Slow:
    def __len__(self):
        return 8

    def __getitem__(self, i):
        marker = os.environ.get(BLOCK)
        if marker and i == 4:
            open(marker, "w").close()
            time.sleep(3600)
        return {"bin": bytes([i]) * 2000, "cls": i}


def make_slow():
    return Slow()


def files_of(folder) -> dict:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def start(args, env=None):
    return subprocess.Popen(
        [sys.executable, "-c", START, "pack", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            (root / c / f"{i}.bin").write_bytes(f"{c}{i}".encode() * 300)
    return root


@pytest.mark.parametrize("runs", [2, 4])
@pytest.mark.parametrize("no_wait", [False, True], ids=["wait", "no-wait"])
def test_concurrent_packs_end_in_one_good_folder(src, tmp_path, runs, no_wait):
    single = tmp_path / "single"
    assert cli(["pack", str(src), str(single), "--max-samples", "2", "--workers", "1"]) == 0
    for attempt in range(3):
        out, go = tmp_path / f"out{attempt}", tmp_path / f"go{attempt}"
        args = [src, out, "--max-samples", "2", "--workers", "2"] + (["--no-wait"] if no_wait else [])
        procs = [start(args, {GO: str(go)}) for _ in range(runs)]
        go.touch()
        results = [(p.wait(timeout=120), *p.communicate(timeout=60)) for p in procs]
        for code, stdout, stderr in results:
            lines = stderr.strip().splitlines()
            if code == 0:
                assert "packed" in stdout and all("waiting for another conveyor pack" in line for line in lines)
                assert len(lines) <= 1, stderr
            else:
                assert no_wait and code == 1 and len(lines) == 1, (code, stderr)
                assert "another conveyor pack is at work on" in lines[0]
        assert any(code == 0 for code, _, _ in results)
        assert verify(str(out)) == []
        assert files_of(out) == files_of(single)


def test_a_lock_left_by_a_killed_run_does_not_block_the_next(tmp_path):
    out, spec, marker = tmp_path / "out", f"{__file__}:make_slow", tmp_path / "blocked"
    killed = start([spec, out, "--max-samples", "2", "--workers", "1"], {BLOCK: str(marker)})
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert killed.poll() is None and time.monotonic() < deadline, killed.communicate()
            time.sleep(0.01)
        assert (out / "pack.lock").exists()
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate()
    again = subprocess.run(
        [sys.executable, "-c", START, "pack", spec, str(out), "--max-samples", "2", "--workers", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0, again.stderr
    assert "took over the lock" in again.stderr and "has ended" in again.stderr
    single = tmp_path / "single"
    assert cli(["pack", spec, str(single), "--max-samples", "2", "--workers", "1"]) == 0
    assert verify(str(out)) == [] and files_of(out) == files_of(single)


def write_lock(out, host, pid, machine, age_s):
    out.mkdir(parents=True, exist_ok=True)
    lock = out / "pack.lock"
    lock.write_text(
        json.dumps(
            {
                "run": "0123456789abcdef",
                "host": host,
                "pid": pid,
                "machine": machine,
                "started": "",
                "since": time.time() - age_s,
            }
        )
    )
    os.utime(lock, (time.time() - age_s, time.time() - age_s))
    return lock


def test_a_stale_lock_from_another_machine_is_taken_over(src, tmp_path, capsys):
    out = tmp_path / "out"
    write_lock(out, "node-that-died", 4242, "another-boot pid:[1]", age_s=3600)
    assert cli(["pack", str(src), str(out), "--max-samples", "2", "--workers", "1"]) == 0
    assert "took over the lock" in capsys.readouterr().err
    assert verify(str(out)) == [] and not (out / "pack.lock").exists()


def test_a_live_holder_is_waited_for_or_refused(src, tmp_path):
    import socket

    from conveyor.cli.pack_lock import _machine, _started

    out = tmp_path / "out"
    lock = write_lock(out, socket.gethostname(), os.getpid(), _machine(), age_s=0)
    data = json.loads(lock.read_text())
    data["started"] = _started(os.getpid())
    lock.write_text(json.dumps(data))
    refused = subprocess.run(
        [sys.executable, "-c", START, "pack", str(src), str(out), "--max-samples", "2", "--no-wait"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    assert f"another conveyor pack is at work on {out} (pid {os.getpid()}" in refused.stderr
    waiting = start([src, out, "--max-samples", "2", "--workers", "1"])
    try:
        line = waiting.stderr.readline()
        assert "waiting for another conveyor pack" in line
        assert waiting.poll() is None
        lock.unlink()  # (the holder is done)
        assert waiting.wait(timeout=120) == 0
    finally:
        if waiting.poll() is None:
            os.killpg(waiting.pid, signal.SIGKILL)
        waiting.communicate()
    assert verify(str(out)) == []
