"""``conveyor tune``: on datasets whose best setting is known (loading that
sleeps gains from every worker; a loop that sleeps longer than loading needs
few), the sweep recommends it; FACTORY resolves from a module or a file, to a
dataset or a loader whose settings are kept; a bad FACTORY exits 2 with a
message; budgets skip settings; ``--out`` writes tune.json and tune.png.

Timings are never asserted, only orderings with wide margins, so a busy
2-core machine does not make these flaky: sleep takes no CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import conveyor
from conveyor.cli import main
from conveyor.cli import tune
from conveyor.cli.tune import Result

SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(conveyor.__file__)))

#: A module that tests write into tmp_path and name as FACTORY's module.
DATA_MODULE = textwrap.dedent(
    """
    import time
    import conveyor

    class Sleepy(conveyor.Dataset):
        '''Sample i is i, after sleeping ``sleep_s`` (I/O-like: takes no CPU).'''

        def __init__(self, n=20_000, sleep_s=0.005):
            self.n, self.sleep_s = n, sleep_s

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.sleep_s:
                time.sleep(self.sleep_s)
            return i

    #: What the loader's own collate_fn saw, in the main process (num_workers=0).
    SEEN = []

    def recording_collate(samples):
        SEEN.append(list(samples))
        return samples

    def sleepy():
        return Sleepy()

    def fast():
        return Sleepy(sleep_s=0)

    def loader():
        return conveyor.DataLoader(Sleepy(n=1000, sleep_s=0), batch_size=5, shuffle=False, collate_fn=recording_collate)

    def not_a_dataset():
        return 42

    NOT_CALLABLE = 3
    """
)


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded(tmp_path_factory):
    """Draw one plot before any test's snapshot: matplotlib keeps the font
    files it has used open for the life of the process (a cache, not a leak)."""
    if importlib.util.find_spec("matplotlib") is not None:
        result = Result(1, 2, None, samples_per_s=1.0, data_wait_fraction=0.5)
        tune.plot([result], result, tmp_path_factory.mktemp("fonts") / "tune.png")


@pytest.fixture
def data_file(tmp_path, monkeypatch):
    """A fresh copy of DATA_MODULE under a name of its own; sys.path restored and the module forgotten after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / f"tune_data_{os.urandom(4).hex()}.py"
    path.write_text(DATA_MODULE)
    yield path
    sys.modules.pop(path.stem, None)  # only it: torch or matplotlib, imported by a test, stay loaded


def run_tune(capsys, *argv):
    """(exit status, stdout, stderr) of ``conveyor tune ARGV`` in this process."""
    status = main(["tune", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def by_workers(report):
    return {r["workers"]: r for r in report["results"] if r["status"] == "measured"}


# ------------------------------------------------------------ recommendations
@pytest.mark.timeout(60)
def test_loading_that_sleeps_gains_from_every_worker_and_the_most_are_recommended(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys, f"{data_file}:sleepy", "--batch-size", 8, "--workers", "0,1,2,4", "--prefetch", 2,
        "--seconds", 0.8, "--out", out_dir,
    )  # fmt: skip
    assert status == 0, out
    report = json.loads((out_dir / "tune.json").read_text())
    rows = by_workers(report)
    assert sorted(rows) == [0, 1, 2, 4]
    # Throughput ~ linear in workers (sleep, not CPU): 4 workers far ahead of 1, more than 5% ahead of 2.
    assert rows[4]["samples_per_s"] > 2 * rows[1]["samples_per_s"]
    assert rows[4]["samples_per_s"] > 1.2 * rows[2]["samples_per_s"]
    assert rows[0]["data_wait_fraction"] > 0.5  # the loop waits while the main process loads
    assert report["recommendation"]["workers"] == 4
    assert "recommended: num_workers=4, prefetch_factor=2" in out
    assert "no --step-ms" in out


@pytest.mark.timeout(60)
def test_a_step_longer_than_loading_is_compute_bound_and_few_workers_are_recommended(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys, f"{data_file}:fast", "--batch-size", 8, "--workers", "0,1,2", "--prefetch", 2,
        "--step-ms", 50, "--seconds", 0.8, "--out", out_dir,
    )  # fmt: skip
    assert status == 0, out
    rec = json.loads((out_dir / "tune.json").read_text())["recommendation"]
    assert rec["workers"] <= 1  # all run at the step's pace: the fewest workers within 5% win
    assert rec["data_wait_fraction"] < 0.10
    assert rec["bound"] == "compute"
    assert "compute-bound" in out


def test_recommend_takes_the_leanest_setting_within_five_percent_of_the_best():
    def measured(workers, prefetch, rate):
        return Result(workers, prefetch, None, samples_per_s=rate, data_wait_fraction=0.0)

    results = [measured(0, None, 50.0), measured(2, 2, 97.0), measured(4, 2, 100.0), measured(2, 4, 96.0)]
    assert tune.recommend(results) == results[1]
    results.append(measured(8, 2, 200.0))
    assert tune.recommend(results).workers == 8
    skipped = Result(16, 2, None, status="over-memory", samples_per_s=400.0)
    assert tune.recommend(results + [skipped]).workers == 8  # over budget: never recommended
    assert tune.recommend([Result(1, 2, None, status="skipped-time")]) is None


def test_default_workers_double_up_to_twice_the_cores():
    assert tune.default_workers(1) == [0, 1, 2]
    assert tune.default_workers(2) == [0, 1, 2, 4]
    assert tune.default_workers(3) == [0, 1, 2, 4, 6]
    assert tune.default_workers(16) == [0, 1, 2, 4, 8, 16, 32]


def test_plan_runs_zero_workers_once_per_batch_size_then_rising_workers_per_prefetch():
    settings = tune.plan([4, 0, 1], [2, 4], [None])
    assert [(s.workers, s.prefetch) for s in settings] == [(0, None), (1, 2), (4, 2), (1, 4), (4, 4)]
    assert [s.batch_size for s in tune.plan([0, 1], [2], [8, 16])] == [8, 8, 16, 16]


# ------------------------------------------------------------------ FACTORY
@pytest.mark.timeout(60)
def test_a_loader_from_the_factory_keeps_its_batch_size_order_and_collate(data_file, capsys):
    status, out, _ = run_tune(capsys, f"{data_file}:loader", "--workers", 0, "--seconds", 0.2)
    assert status == 0, out
    assert "from the factory" in out
    seen = sys.modules[data_file.stem].SEEN
    assert seen[0] == [0, 1, 2, 3, 4]  # shuffle=False kept, and its collate_fn
    assert {len(batch) for batch in seen} == {5}


@pytest.mark.timeout(60)
def test_batch_sizes_vary_a_loaders_batch_size(data_file, capsys):
    status, out, _ = run_tune(capsys, f"{data_file}:loader", "--workers", 0, "--batch-sizes", "3,7", "--seconds", 0.1)
    assert status == 0, out
    sizes = {len(batch) for batch in sys.modules[data_file.stem].SEEN}
    assert sizes - {1000 % 3, 1000 % 7} == {3, 7}  # (the last batch of each pass of 1000 is shorter)
    assert "batch" in out.splitlines()[2]  # the header has a batch column


@pytest.mark.timeout(60)
def test_a_module_in_the_current_folder_imports_by_name(data_file, monkeypatch, capsys):
    monkeypatch.chdir(data_file.parent)
    status, out, _ = run_tune(capsys, f"{data_file.stem}:fast", "--workers", "0,1", "--prefetch", 2, "--seconds", 0.2)
    assert status == 0, out
    assert "conveyor.DataLoader(Sleepy, batch_size=32, shuffle=True)" in out
    assert "recommended: num_workers=" in out


@pytest.mark.timeout(60)
def test_torch_builds_conveyors_torch_loader(data_file, capsys):
    pytest.importorskip("torch")
    status, out, _ = run_tune(capsys, f"{data_file}:fast", "--torch", "--workers", 0, "--seconds", 0.1)
    assert status == 0, out
    assert "conveyor.torch.DataLoader(Sleepy" in out


@pytest.mark.parametrize(
    "spec, message",
    [
        ("tune_no_such_module:make", "cannot import 'tune_no_such_module'"),
        ("{module}:missing", "has no attribute 'missing'"),
        ("{module}:NOT_CALLABLE", "not a function"),
        ("{module}", "expected MODULE:FACTORY"),
        ("{path}:", "expected MODULE:FACTORY"),
        ("no/such/file.py:make", "no such file"),
        ("{path}:not_a_dataset", "which DataLoader rejects"),
    ],
)
def test_a_bad_factory_exits_2_saying_what_is_wrong(spec, message, data_file, monkeypatch, capsys):
    monkeypatch.chdir(data_file.parent)
    status, out, err = run_tune(capsys, spec.format(module=data_file.stem, path=data_file))
    assert status == 2
    assert message in err and err.startswith("conveyor tune: error: ")
    assert out == ""


@pytest.mark.timeout(60)
def test_the_command_line_runs_a_module_from_the_current_folder_and_exits_2_on_a_bad_one(data_file):
    env = {**os.environ, "PYTHONPATH": SRC_DIR}
    command = [sys.executable, "-m", "conveyor.cli", "tune"]
    good = subprocess.run(
        [*command, f"{data_file.stem}:fast", "--workers", "0", "--seconds", "0.1"],
        cwd=data_file.parent, env=env, capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert good.returncode == 0, good.stderr
    assert "recommended: num_workers=0" in good.stdout
    bad = subprocess.run(
        [*command, "nomodule:x"], cwd=data_file.parent, env=env, capture_output=True, text=True, timeout=50
    )
    assert bad.returncode == 2
    assert "cannot import 'nomodule'" in bad.stderr


# ------------------------------------------------------------------ budgets
@pytest.mark.timeout(60)
def test_settings_past_the_memory_budget_are_marked_and_the_rest_skipped(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys, f"{data_file}:fast", "--workers", "0,1,2", "--prefetch", 2, "--seconds", 0.2,
        "--max-rss-gb", 0.001, "--out", out_dir,
    )  # fmt: skip
    assert status == 1  # nothing fits: no recommendation
    statuses = [(r["workers"], r["status"]) for r in json.loads((out_dir / "tune.json").read_text())["results"]]
    assert statuses == [(0, "over-memory"), (1, "skipped-memory"), (2, "skipped-memory")]
    assert "no setting was measured" in out


@pytest.mark.timeout(60)
def test_settings_past_the_time_budget_are_skipped(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys, f"{data_file}:sleepy", "--batch-size", 8, "--workers", "0,1,2", "--prefetch", 2,
        "--seconds", 0.3, "--max-seconds", 0.5, "--out", out_dir,
    )  # fmt: skip
    assert status == 0, out
    results = json.loads((out_dir / "tune.json").read_text())["results"]
    assert [r["status"] for r in results] == ["measured", "skipped-time", "skipped-time"]


def test_tree_memory_counts_child_processes():
    alone = tune.tree_memory_bytes()
    assert alone and alone > 1 << 20
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # an interpreter by now, no longer a fork sharing our pages
        assert tune.tree_memory_bytes(child.pid) > 1 << 20
        assert tune.tree_memory_bytes() > alone + (1 << 20)
    finally:
        child.stdin.close()
        child.wait(timeout=20)
        child.stdout.close()


# ------------------------------------------------------------------- --out
@pytest.mark.timeout(60)
def test_out_writes_the_table_machine_and_recommendation_as_json_and_a_plot(data_file, tmp_path, capsys):
    out_dir = tmp_path / "new" / "out"
    status, out, _ = run_tune(
        capsys, f"{data_file}:fast", "--workers", "0,1", "--prefetch", "2,3", "--seconds", 0.2, "--out", out_dir
    )
    assert status == 0, out
    report = json.loads((out_dir / "tune.json").read_text())
    assert set(report) >= {"factory", "loader", "settings", "machine", "results", "recommendation"}
    assert report["machine"]["cores"] >= 1 and report["settings"]["seconds"] == 0.2
    assert [(r["workers"], r["prefetch"]) for r in report["results"]] == [(0, None), (1, 2), (1, 3)]
    for row in report["results"]:
        assert set(row) >= {"samples_per_s", "data_wait_fraction", "workers_busy_fraction", "first_batch_s"}
        assert row["samples_per_s"] > 0 and row["peak_memory_mb"] > 0 and row["status"] == "measured"
    assert report["recommendation"]["samples_per_s"] > 0
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in out
    else:
        assert (out_dir / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_json_is_written_and_the_plot_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    args = tune.argparse.Namespace(factory="m:f", seconds=1.0, step_ms=0.0, max_seconds=5.0, out=tmp_path)
    rec = Result(1, 2, None, samples_per_s=10.0, data_wait_fraction=0.5)
    tune.write_outputs(args, [rec], rec, "a loader", None)
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert (tmp_path / "tune.json").exists() and not (tmp_path / "tune.png").exists()
