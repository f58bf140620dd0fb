"""``conveyor doctor``: each check judges faked values as a user would want
(a bad value warns or fails with a fix naming the remedy), and the command
prints text or JSON and exits 1 exactly when a check fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import conveyor
from conveyor._engine import portable
from conveyor.cli import doctor, main
from conveyor.cli.doctor import FAIL, OK, WARN, Check, ReadPass

MIB = 1 << 20
SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(conveyor.__file__)))


# ------------------------------------------------------------------- cores
def test_more_workers_than_cores_warns_and_names_a_count_that_fits():
    check = doctor.check_cores(8, cores=2)
    assert check.status == WARN
    assert "num_workers=2" in check.fix


def test_workers_equal_to_many_cores_is_ok_with_a_note_on_the_main_process():
    check = doctor.check_cores(16, cores=16)
    assert check.status == OK
    assert "num_workers=15" in check.detail


def test_fewer_workers_than_cores_is_ok():
    assert doctor.check_cores(1, cores=2) == Check("cores", OK, "1 workers planned, 2 usable cores")


# ---------------------------------------------------------------- /dev/shm
def test_shm_nearly_full_fails_where_batches_live_there():
    check = doctor.check_shm(free_bytes=10 * MIB, total_bytes=64 * MIB, kind="shm_open")
    assert check.status == FAIL
    assert "--shm-size" in check.fix and "remount" in check.fix


def test_shm_nearly_full_only_warns_when_batches_use_memfd():
    check = doctor.check_shm(free_bytes=10 * MIB, total_bytes=64 * MIB, kind="memfd")
    assert check.status == WARN
    assert "--shm-size" in check.fix


def test_shm_under_a_gib_warns():
    check = doctor.check_shm(free_bytes=500 * MIB, total_bytes=512 * MIB, kind="shm_open")
    assert check.status == WARN
    assert "--shm-size" in check.fix


def test_shm_with_room_is_ok():
    check = doctor.check_shm(free_bytes=8 << 30, total_bytes=8 << 30, kind="memfd")
    assert check.status == OK and check.fix == ""


def test_missing_shm_fails_on_linux_and_says_how_to_mount_it():
    check = doctor.check_shm(free_bytes=None, total_bytes=None, kind="shm_open", linux=True)
    assert check.status == FAIL
    assert "mount -t tmpfs" in check.fix


def test_missing_shm_is_ok_off_linux():
    assert doctor.check_shm(free_bytes=None, total_bytes=None, kind="shm_open", linux=False).status == OK


# -------------------------------------------------------------- open files
def test_open_file_limit_below_256_fails():
    check = doctor.check_open_files(soft=128, hard=1 << 20)
    assert check.status == FAIL
    assert "ulimit -n 65536" in check.fix and "setrlimit" in check.fix


def test_open_file_limit_of_1024_warns():
    assert doctor.check_open_files(soft=1024, hard=1 << 20).status == WARN


def test_low_hard_limit_says_root_must_raise_it():
    check = doctor.check_open_files(soft=1024, hard=1024)
    assert check.status == WARN
    assert "ulimit -n 1024" in check.fix and "--ulimit nofile" in check.fix


def test_high_open_file_limit_is_ok():
    assert doctor.check_open_files(soft=65536, hard=65536).status == OK


# ------------------------------------------------------------ start method
def test_spawn_by_default_warns_and_suggests_persistent_workers():
    check = doctor.check_start_method(4, default="spawn", available=["spawn", "fork", "forkserver"], problem="")
    assert check.status == WARN
    assert "persistent_workers=True" in check.fix


def test_fork_by_default_is_ok():
    assert doctor.check_start_method(4, default="fork", available=["fork", "spawn"], problem="").status == OK


def test_platform_without_workers_fails_only_when_workers_are_planned():
    failing = doctor.check_start_method(2, default="spawn", available=["spawn"], problem="no select.poll")
    assert failing.status == FAIL and "num_workers=0" in failing.fix
    assert doctor.check_start_method(0, default="spawn", available=["spawn"], problem="no select.poll").status == OK


# ----------------------------------------------------------------- threads
def test_torch_threads_beyond_the_cores_warn():
    check = doctor.check_threads(cores=2, torch_threads=8, env={})
    assert check.status == WARN
    assert "torch.set_num_threads(2)" in check.fix


def test_omp_num_threads_beyond_the_cores_warns():
    check = doctor.check_threads(cores=4, torch_threads=None, env={"OMP_NUM_THREADS": "16,2"})
    assert check.status == WARN
    assert "OMP_NUM_THREADS=4" in check.fix


def test_threads_within_the_cores_are_ok_without_torch():
    check = doctor.check_threads(cores=4, torch_threads=None, env={"MKL_NUM_THREADS": "1"})
    assert check.status == OK
    assert "torch not installed" in check.detail


# -------------------------------------------------------------------- memfd
def test_no_shared_memory_at_all_warns_that_batches_use_pipes():
    check = doctor.check_memfd(kind=None, why="ENOSYS", linux=True, forced_portable=False)
    assert check.status == WARN
    assert "pipes" in check.detail and "seccomp" in check.fix


def test_memfd_refused_on_linux_warns():
    check = doctor.check_memfd(kind="shm_open", linux=True, forced_portable=False)
    assert check.status == WARN
    assert "seccomp" in check.fix


def test_conveyor_portable_set_on_linux_says_to_unset_it():
    check = doctor.check_memfd(kind="shm_open", linux=True, forced_portable=True)
    assert check.status == WARN
    assert f"unset {portable.ENV_VAR}" in check.fix


def test_posix_shared_memory_off_linux_and_memfd_are_ok():
    assert doctor.check_memfd(kind="shm_open", linux=False, forced_portable=False).status == OK
    assert doctor.check_memfd(kind="memfd", linux=True, forced_portable=False).status == OK


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd is Linux's")
def test_shared_memory_kind_follows_the_engine(monkeypatch):
    """The doctor asks the engine's own function, so it sees the engine's switch."""
    expected = "memfd" if portable.LINUX_PATHS else "shm_open"
    assert doctor.shared_memory_kind() == (expected, "")
    monkeypatch.setattr(portable, "LINUX_PATHS", False)
    assert doctor.shared_memory_kind() == ("shm_open", "")


# -------------------------------------------------------------- accelerator
def test_accelerator_checks_are_ok_and_say_when_pinning_helps():
    assert "numpy" in doctor.check_accelerator(torch_installed=False, accelerator=None).detail
    assert "no effect" in doctor.check_accelerator(torch_installed=True, accelerator=None).detail
    with_gpu = doctor.check_accelerator(torch_installed=True, accelerator="CUDA, 1 × H200")
    assert with_gpu.status == OK and "pin_memory=True" in with_gpu.detail


def test_versions_name_python_numpy_and_conveyor():
    check = doctor.check_versions()
    assert check.status == OK
    assert f"conveyor {conveyor.__version__}" in check.detail and "numpy" in check.detail


# --------------------------------------------------------------------- data
def write_files(folder, count, size):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"{i:04d}.bin").write_bytes(os.urandom(size))
    return folder


def fake_read(cold_s, warm_s):
    """A reader that reports fixed timings instead of touching storage."""

    def read(paths, cold):
        size = sum(os.path.getsize(path) for path in paths)
        return ReadPass(len(paths), size, cold_s if cold else warm_s)

    return read


def test_cold_reads_much_slower_than_warm_warn_with_a_storage_fix(tmp_path):
    folder = write_files(tmp_path / "data", 4, 256 * 1024)
    check = doctor.check_data(folder, read=fake_read(cold_s=1.0, warm_s=0.01))
    assert check.status == WARN
    assert "SSD" in check.fix and "num_workers" in check.fix
    assert "pack" not in check.fix  # the files are big: packing would not help


def test_big_files_read_fast_are_ok(tmp_path):
    folder = write_files(tmp_path / "data", 4, 256 * 1024)
    check = doctor.check_data(folder, read=fake_read(cold_s=0.001, warm_s=0.0005))
    assert check.status == OK
    assert "4 files" in check.detail


def test_many_small_files_warn_and_suggest_shards(tmp_path):
    folder = write_files(tmp_path / "data", 50, 1024)
    check = doctor.check_data(folder, read=fake_read(cold_s=0.001, warm_s=0.001))
    assert check.status == WARN
    assert "shard" in check.fix


def test_data_is_read_for_real_in_nested_folders(tmp_path):
    write_files(tmp_path / "data" / "a", 3, 1000)
    write_files(tmp_path / "data" / "b", 2, 3000)
    files = doctor.sample_files(tmp_path / "data")
    assert [os.path.basename(os.path.dirname(path)) for path, _ in files] == ["a"] * 3 + ["b"] * 2
    for cold in (True, False):
        done = doctor.read_pass([path for path, _ in files], cold)
        assert (done.files, done.bytes) == (5, 9000)
    assert doctor.check_data(tmp_path / "data").status == WARN  # 1.8 KiB a file


def test_sampling_stops_at_the_byte_budget(tmp_path):
    folder = write_files(tmp_path / "data", 10, 1000)
    assert len(doctor.sample_files(folder, max_bytes=3000)) == 3
    assert len(doctor.sample_files(folder, max_files=4)) == 4


def test_missing_or_empty_data_folder(tmp_path):
    assert doctor.check_data(tmp_path / "nowhere").status == FAIL
    (tmp_path / "empty").mkdir()
    assert doctor.check_data(tmp_path / "empty").status == WARN


# ---------------------------------------------------------------------- CLI
def test_json_output_lists_every_check_and_the_status_follows_failures(capsys):
    status = main(["doctor", "--json", "--num-workers", "1"])
    checks = json.loads(capsys.readouterr().out)
    names = [check["name"] for check in checks]
    assert names == ["versions", "cores", "start method", "threads", "memfd", "/dev/shm", "open files", "accelerator"]
    assert all(set(check) == {"name", "status", "detail", "fix"} for check in checks)
    assert all(check["status"] in (OK, WARN, FAIL) for check in checks)
    assert all(check["fix"] for check in checks if check["status"] != OK)
    assert status == (1 if any(check["status"] == FAIL for check in checks) else 0)


def test_a_failing_check_makes_the_exit_status_1_and_prints_its_fix(monkeypatch, capsys):
    failing = Check("open files", FAIL, "soft limit 64", "ulimit -n 65536")
    monkeypatch.setattr(doctor, "check_open_files", lambda: failing)
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FAIL open files: soft limit 64\n     fix: ulimit -n 65536\n" in out
    assert out.rstrip().endswith("1 failed")


def test_a_check_that_raises_becomes_a_warning_and_the_rest_still_run(monkeypatch, capsys):
    def broken(num_workers):
        raise RuntimeError("odd system")

    monkeypatch.setattr(doctor, "check_cores", broken)
    main(["doctor", "--json"])
    checks = {check["name"]: check for check in json.loads(capsys.readouterr().out)}
    assert checks["broken"]["status"] == WARN and "odd system" in checks["broken"]["detail"]
    assert "accelerator" in checks


def test_data_option_adds_a_data_check(tmp_path, capsys):
    folder = write_files(tmp_path / "data", 20, 2000)
    main(["doctor", "--data", str(folder), "--num-workers", "0"])
    out = capsys.readouterr().out
    assert "WARN data: 20 files" in out and "shard" in out


@pytest.mark.timeout(60)
def test_python_m_conveyor_cli_doctor_runs_without_importing_torch_up_front():
    env = {**os.environ, "PYTHONPATH": SRC_DIR}
    code = "import sys, conveyor.cli.doctor; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=50)
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "doctor", "--num-workers", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert "OK   versions:" in done.stdout
    assert done.returncode == (1 if "\nFAIL " in "\n" + done.stdout else 0), done.stderr
