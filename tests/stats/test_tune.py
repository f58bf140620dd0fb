"""``conveyor tune``: the choice among measured settings (settings within the noise tie and the
leanest wins; the advice never asks for a setting the sweep measured and did not recommend),
fed made-up measurements; a round measures several passes when one is short and keeps every
share it reports within [0, 1]; end to end, on tiny datasets, the command's table, JSON and
plot carry every round and the spread; FACTORY resolves from a module or a file, to a dataset
or a loader whose settings are kept; a bad FACTORY exits 2 with a message; budgets skip settings.

No duration is asserted. The two tests that compare settings use loading that sleeps (it takes
no CPU, so a busy machine does not change the order) and margins of 2x or a tie.
"""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
from conveyor.cli import main, tune_choice, tune_measure, tune_report, tune_sweep
from conveyor.cli.tune_choice import advise, noise, recommend, ties, tolerance
from conveyor.cli.tune_measure import Result, Round

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

    def tiny():
        return Sleepy(n=24, sleep_s=0)

    def loader():
        return conveyor.DataLoader(Sleepy(n=1000, sleep_s=0), batch_size=5, shuffle=False, collate_fn=recording_collate)

    def thread_loader():
        return conveyor.DataLoader(
            Sleepy(n=200, sleep_s=0), batch_size=5, num_workers=1, worker_method="thread", collate_fn=recording_collate
        )

    def not_a_dataset():
        return 42

    NOT_CALLABLE = 3
    """
)


def setting(
    workers,
    prefetch,
    *rates,
    batch=None,
    wait=0.5,
    advice="",
    advised_workers=None,
    advises_prefetch=False,
    memory=None,
    status="measured",
):
    """A made-up measured setting: one round per rate."""
    rounds = tuple(
        Round(
            rate,
            data_wait_fraction=wait,
            workers_busy_fraction=0.9,
            peak_memory_mb=memory,
            advice=advice,
            advised_workers=advised_workers,
            advises_prefetch=advises_prefetch,
            slowest_stage="fetch",
            slowest_share=0.9,
        )
        for rate in rates
    )
    return Result(workers, prefetch if workers else None, batch, status=status, rounds=rounds)


@pytest.fixture(scope="module", autouse=True)
def fonts_loaded(tmp_path_factory):
    """Draw one plot before any test's snapshot: matplotlib keeps the font
    files it has used open for the life of the process (a cache, not a leak)."""
    if importlib.util.find_spec("matplotlib") is not None:
        result = setting(1, 2, 1.0, 2.0)
        tune_report.plot([result], result, tmp_path_factory.mktemp("fonts") / "tune.png")


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


# ------------------------------------------------------------ the tie rule
def test_the_doctests_of_the_choice_hold():
    assert doctest.testmod(tune_choice).failed == 0


def test_settings_within_ten_percent_tie_and_the_fewest_workers_win():
    results = [
        setting(0, None, 50, 50, 50),
        setting(2, 2, 92, 92, 92),
        setting(4, 2, 100, 100, 100),
        setting(2, 4, 96, 96, 96),
    ]
    assert noise(results) == 0 and tolerance(results) == tune_choice.NEAR_BEST == 0.10
    assert recommend(results) is results[1]
    assert {r.workers for r in ties(results)} == {2, 4}
    results.append(setting(8, 2, 200, 200, 200))
    assert recommend(results).workers == 8  # twice as fast is no tie


def test_settings_are_compared_by_their_best_round_and_tie_within_how_far_it_stands_above_the_next():
    # Rounds slowed down now and then (a busy machine): the best rounds are 120 and 140, and a
    # best round stands about 23% above the next, so 1 worker is as fast within the noise.
    noisy = [setting(1, 2, 60, 90, 120), setting(2, 2, 80, 110, 140)]
    assert noise(noisy) == pytest.approx((30 / 140 + 30 / 120) / 2)
    assert recommend(noisy).workers == 1
    assert tune_choice.tie_rule(noisy) == "settings whose best round is within 23% of the fastest tie (the noise)"
    # Rounds that agree: 140 against 120 is a real gain.
    quiet = [setting(1, 2, 118, 119, 120), setting(2, 2, 138, 139, 140)]
    assert recommend(quiet).workers == 2
    assert tune_choice.tie_rule(quiet) == (
        "settings whose best round is within 10% of the fastest tie (10% at least, more than the noise)"
    )
    # A setting slowed down in most of its rounds is judged by its best one, not its median.
    busy = [setting(0, None, 300, 310, 320), setting(2, 2, 250, 300, 700, 720)]
    assert recommend(busy).workers == 2


def test_a_noise_over_twenty_percent_gets_a_note_with_the_load_average():
    noisy = [setting(1, 2, 60, 90, 120), setting(2, 2, 80, 110, 140)]
    note = tune_report.noise_note(noisy, (3.04, 4.5), cores=2)
    assert note.startswith("note: a setting's best round stands 23% above its next best")
    assert "(load average 3.0 at the start, 4.5 at the end, on 2 cores)" in note
    assert tune_report.noise_note([setting(1, 2, 118, 119, 120)], (0.5, 0.5), cores=2) == ""


def test_at_equal_speed_prefetch_then_memory_decide():
    results = [setting(2, 4, 100, 100, memory=50), setting(2, 2, 100, 100, memory=60)]
    assert recommend(results).prefetch == 2
    results = [setting(2, 2, 100, 100, batch=32, memory=60), setting(2, 2, 100, 100, batch=32, memory=50)]
    assert recommend(results).peak_memory_mb == 50


def test_settings_over_memory_or_not_measured_are_never_recommended():
    results = [setting(1, 2, 100, 100), setting(16, 2, 400, 400, status="over-memory")]
    assert recommend(results).workers == 1
    assert recommend([Result(1, 2, None, status="skipped-time")]) is None
    assert recommend([]) is None


#: Made-up sweeps: up to 8 settings (distinct workers and prefetch), each with 1 to 5 rounds.
rates = st.floats(min_value=1.0, max_value=1e5, allow_nan=False)
sweeps = st.dictionaries(
    st.tuples(st.integers(0, 8), st.sampled_from([2, 4, 8])),
    st.lists(rates, min_size=1, max_size=5),
    min_size=1,
    max_size=8,
).map(lambda found: [setting(w, p, *rs) for (w, p), rs in found.items()])


@settings(max_examples=300, deadline=None)
@given(sweeps, st.randoms(use_true_random=False))
def test_the_recommendation_is_the_leanest_setting_within_the_noise_of_the_fastest(results, random):
    rec = recommend(results)
    fastest = max(r.best_samples_per_s for r in results)
    assert rec.best_samples_per_s >= (1 - tolerance(results)) * fastest * (1 - 1e-12)
    # No setting that ties is leaner; no setting outside the tie is recommended.
    assert all(tune_choice.leanness(rec) <= tune_choice.leanness(r) for r in ties(results))
    # The order the settings ran in, and the unit of the rates, do not change the choice.
    shuffled = list(results)
    random.shuffle(shuffled)
    assert tune_choice.leanness(recommend(shuffled)) == tune_choice.leanness(rec)
    # (x4 is exact in floating point, so no rate crosses the tie's edge by rounding.)
    scaled = [setting(r.workers, r.prefetch, *(x.samples_per_s * 4 for x in r.rounds)) for r in results]
    assert tune_choice.leanness(recommend(scaled)) == tune_choice.leanness(rec)


# ---------------------------------------------------- advice that agrees
#: What the verdict says, in the forms that name a setting, with whether it names a worker
#: count and whether it tells to raise prefetch_factor (Verdict.advised_workers, .advises_prefetch).
ADVICE = [
    ("more workers: num_workers={n} (the workers are busy 98%; this machine has 2 cores)", True, False),
    (
        "load in worker processes: DataLoader(num_workers={n}); the main process spent 90% of wall time loading",
        True,
        False,
    ),
    (
        "the workers are busy only 20% of the time while the loop waits 40%: keep more batches in flight "
        "(raise prefetch_factor)",
        False,
        True,
    ),
    (
        "the loader keeps up; the workers are busy only 10% of the time, so num_workers={n} would do (less memory)",
        True,
        False,
    ),
    (
        "the 2 workers are busy 91% on 2 cores, so more workers will not help; fetch takes 97% of loading time",
        False,
        False,
    ),
]


def told(advice, n=0) -> dict:
    """A round's verdict fields for one of ADVICE with ``n`` as its worker count."""
    template, names_workers, prefetch = advice
    return {
        "advice": template.format(n=n),
        "advised_workers": n if names_workers else None,
        "advises_prefetch": prefetch,
    }


def named_workers(said: str) -> set[int]:
    """The worker counts that printed advice tells the user to set."""
    return {int(n) for n in re.findall(r"\bnum_workers=(\d+)", said)}


def test_advice_for_a_setting_the_sweep_measured_and_did_not_choose_gives_the_measurement_instead():
    results = [setting(1, 2, 755, 761, 770, **told(ADVICE[0], 2)), setting(2, 2, 740, 756, 790)]
    rec = recommend(results)
    assert rec.workers == 1
    said = advise(rec, results)
    assert "num_workers=2" not in said
    assert "2 workers, prefetch 2: best round 790 samples/s, median 756, slowest 740, as fast within the noise" in said
    assert "fetch (90% of loading time)" in said


def test_advice_to_raise_prefetch_is_replaced_when_a_larger_prefetch_was_measured():
    results = [setting(2, 2, 100, 101, **told(ADVICE[2])), setting(2, 4, 101, 102)]
    said = advise(recommend(results), results)
    assert "prefetch_factor" not in said and "2 workers, prefetch 4: best round 102 samples/s" in said


def test_advice_beyond_the_sweep_is_kept_and_says_it_was_not_measured():
    results = [setting(0, None, 100, 100, **told(ADVICE[1], 2))]
    said = advise(recommend(results), results)
    assert said.startswith("load in worker processes: DataLoader(num_workers=2)")
    assert "not measured here" in said and "--workers 0,2" in said


def test_without_a_round_long_enough_for_a_verdict_there_is_no_advice_but_how_to_get_one():
    short = Result(2, 2, None, rounds=(Round(100.0, bound="unknown", advice="iterate longer and ask again"),) * 2)
    said = advise(short, [short])
    assert said.startswith("none: no round of this setting was long enough") and "--max-seconds or --seconds" in said


@settings(max_examples=300, deadline=None)
@given(sweeps, st.sampled_from(ADVICE), st.integers(0, 9))
def test_the_advice_never_asks_for_a_measured_setting_other_than_the_recommended_one(results, template, n):
    rec = recommend(results)
    rec_with_advice = setting(rec.workers, rec.prefetch, *(r.samples_per_s for r in rec.rounds), **told(template, n))
    results = [rec_with_advice if r is rec else r for r in results]
    said = advise(recommend(results), results)
    for asked in named_workers(said):
        assert asked == rec.workers or asked not in {r.workers for r in results}
    if "prefetch_factor" in said:  # only when no more batches in flight were measured
        if rec.workers:
            assert max(r.prefetch for r in results if r.workers == rec.workers) <= rec.prefetch
        else:
            assert all(r.workers == 0 for r in results)
    printed = tune_report.describe_bound(recommend(results), results, step_ms=5)
    if "advice: " in printed:
        assert printed.split("advice: ", 1)[1] == said  # the printed advice is this one


# -------------------------------------------------------- a round, faked
class FakeLoader:
    """A loader of ``per_pass`` batches a pass, counting its passes, whose stats are made up."""

    def __init__(self, per_pass):
        self.per_pass, self.passes = per_pass, 0

    def __iter__(self):
        self.passes += 1
        return iter(range(self.per_pass))

    def stats(self, since=None):
        verdict = SimpleNamespace(
            bound="input",
            advice="advice",
            advised_workers=None,
            advises_prefetch=False,
            slowest_stage="fetch",
            slowest_share=0.5,
        )
        interval = SimpleNamespace(
            batches=10, samples_per_s=100.0, data_wait_fraction=0.75, workers_busy_fraction=0.5, verdict=lambda: verdict
        )
        return SimpleNamespace(first_batch_s=0.1, interval=interval if since is not None else None)


@pytest.mark.parametrize("workers, passes", [(1, 4), (3, 5)])
def test_a_round_leaves_out_a_first_batch_per_worker_and_runs_further_passes_until_its_batches_are_in(workers, passes):
    made = []

    def build(setting):
        made.append(FakeLoader(per_pass=3))
        return made[-1]

    measured = tune_measure.measure_round(build, Result(workers, 2, None), seconds=0.0, min_batches=10, step_s=0.0)
    # 3 batches a pass; 1 worker: the first left out, then 2 + 3 + 3 + 2 batches; 3 workers: the
    # first pass left out whole, then 3 + 3 + 3 + 1.
    assert len(made) == 1 and measured.passes == made[0].passes == passes
    assert (measured.samples_per_s, measured.data_wait_fraction, measured.workers_busy_fraction) == (100, 0.75, 0.5)
    assert (measured.first_batch_s, measured.bound, measured.slowest_stage) == (0.1, "input", "fetch")


def test_a_round_of_a_loader_without_batches_is_none():
    assert tune_measure.measure_round(lambda s: FakeLoader(0), Result(0, None, None), 0.0, 5, 0.0) is None


def test_a_round_delivers_at_least_twice_the_batches_in_flight():
    options = tune_sweep.SweepOptions(rounds=3, seconds=1.0, min_batches=20, step_s=0.0, max_seconds=9, budget=None)
    assert options.round_batches(Result(0, None, None)) == 20
    assert options.round_batches(Result(4, 8, None)) == 64


def test_rounds_take_turns_over_the_settings_every_other_one_backwards(monkeypatch):
    monkeypatch.setattr(tune_sweep, "MIN_ROUND_S", 0.0)  # fake loaders: no verdict to wait for
    order = []

    def build(setting):
        order.append(setting.workers)
        return FakeLoader(per_pass=4)

    options = tune_sweep.SweepOptions(rounds=3, seconds=0.0, min_batches=1, step_s=0.0, max_seconds=60, budget=None)
    seen = []
    results = tune_sweep.sweep(tune_sweep.plan([0, 1, 2], [2], [None]), build, options, lambda n, rs: seen.append(n))
    assert order == [0, 1, 2, 2, 1, 0, 0, 1, 2] and seen == [1, 2, 3]
    assert [len(r.rounds) for r in results] == [3, 3, 3]


def test_default_workers_double_up_to_twice_the_cores():
    assert tune_sweep.default_workers(1) == [0, 1, 2]
    assert tune_sweep.default_workers(2) == [0, 1, 2, 4]
    assert tune_sweep.default_workers(3) == [0, 1, 2, 4, 6]
    assert tune_sweep.default_workers(16) == [0, 1, 2, 4, 8, 16, 32]


def test_plan_runs_zero_workers_once_per_batch_size_then_rising_workers_per_prefetch():
    settings_ = tune_sweep.plan([4, 0, 1], [2, 4], [None])
    assert [(s.workers, s.prefetch) for s in settings_] == [(0, None), (1, 2), (4, 2), (1, 4), (4, 4)]
    assert [s.batch_size for s in tune_sweep.plan([0, 1], [2], [8, 16])] == [8, 8, 16, 16]


# ------------------------------------------------------------- end to end
@pytest.mark.timeout(90)
def test_a_sweep_writes_every_round_and_the_spread_to_the_table_json_and_plot(data_file, tmp_path, capsys):
    out_dir = tmp_path / "new" / "out"
    status, out, _ = run_tune(
        capsys,
        f"{data_file}:tiny",
        "--batch-size",
        4,
        "--workers",
        "0,1",
        "--prefetch",
        "2,3",
        "--rounds",
        2,
        "--seconds",
        0,
        "--min-batches",
        9,
        "--step-ms",
        1,
        "--out",
        out_dir,
    )
    assert status == 0, out
    assert "round 1 of 2: samples/s" in out and "round 2 of 2: samples/s" in out
    assert "samples/s best" in out and "(2 rounds)" in out and "noise: " in out
    report = json.loads((out_dir / "tune.json").read_text())
    assert set(report) >= {
        "factory",
        "loader",
        "settings",
        "machine",
        "results",
        "noise",
        "tie_tolerance",
        "recommendation",
    }
    assert report["settings"]["rounds"] == 2 and report["machine"]["cores"] >= 1
    assert report["tie_tolerance"] >= max(report["noise"], tune_choice.NEAR_BEST)
    assert [(r["workers"], r["prefetch"]) for r in report["results"]] == [(0, None), (1, 2), (1, 3)]
    for row in report["results"]:
        assert row["status"] == "measured" and len(row["rounds"]) == 2
        rates = sorted(r["samples_per_s"] for r in row["rounds"])
        assert row["samples_per_s_min"] == rates[0] <= row["samples_per_s"] <= rates[-1] == row["samples_per_s_max"]
        # 6 batches a pass of 24 samples: each round of at least 9 batches ran several passes.
        assert all(r["batches"] >= 9 and r["passes"] >= 2 for r in row["rounds"])
        shares = [row["data_wait_fraction"], row["workers_busy_fraction"]] + [
            r[name] for r in row["rounds"] for name in ("data_wait_fraction", "workers_busy_fraction")
        ]
        assert all(0 <= share <= 1 for share in shares if share is not None)
        assert row["peak_memory_mb"] > 0
    rec = report["recommendation"]
    assert {"bound", "advice", "tied_with", "rounds", "samples_per_s_min", "samples_per_s_max"} <= set(rec)
    # One longer round of the recommended setting gives the verdict: 20 batches at least.
    assert rec["verdict_round"]["batches"] >= 20 and "in a longer round of this setting" in out
    assert f"recommended: num_workers={rec['workers']}" in out
    if importlib.util.find_spec("matplotlib") is None:
        assert "matplotlib is not installed" in out
    else:
        assert (out_dir / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(90)
def test_loading_that_sleeps_gains_from_every_worker_and_the_most_are_recommended(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys,
        f"{data_file}:sleepy",
        "--batch-size",
        8,
        "--workers",
        "0,1,4",
        "--prefetch",
        2,
        "--rounds",
        2,
        "--seconds",
        0.4,
        "--min-batches",
        5,
        "--out",
        out_dir,
    )
    assert status == 0, out
    report = json.loads((out_dir / "tune.json").read_text())
    rows = by_workers(report)
    # Throughput ~ linear in workers (sleep, not CPU): 4 workers far ahead of 1.
    assert rows[4]["samples_per_s_min"] > 2 * rows[1]["samples_per_s_max"]
    assert report["recommendation"]["workers"] == 4
    assert "recommended: num_workers=4, prefetch_factor=2" in out
    assert "no --step-ms" in out


@pytest.mark.timeout(90)
def test_a_step_longer_than_loading_ties_every_setting_and_the_fewest_workers_win(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys,
        f"{data_file}:fast",
        "--batch-size",
        8,
        "--workers",
        "0,1,2",
        "--prefetch",
        2,
        "--rounds",
        2,
        "--step-ms",
        50,
        "--seconds",
        0.4,
        "--min-batches",
        5,
        "--out",
        out_dir,
    )
    assert status == 0, out
    rec = json.loads((out_dir / "tune.json").read_text())["recommendation"]
    assert rec["workers"] <= 1  # all run at the step's pace: the fewest workers within the noise win
    assert rec["bound"] == "compute"
    assert "compute-bound" in out


# ------------------------------------------------------------------ FACTORY
@pytest.mark.timeout(60)
def test_a_loader_from_the_factory_keeps_its_batch_size_order_and_collate(data_file, capsys):
    status, out, _ = run_tune(capsys, f"{data_file}:loader", "--workers", 0, "--seconds", 0, "--rounds", 2)
    assert status == 0, out
    assert "from the factory" in out
    seen = sys.modules[data_file.stem].SEEN
    assert seen[0] == [0, 1, 2, 3, 4]  # shuffle=False kept, and its collate_fn
    assert {len(batch) for batch in seen} == {5}


@pytest.mark.timeout(60)
def test_a_loader_with_thread_workers_is_measured_with_thread_workers(data_file, capsys):
    status, out, _ = run_tune(capsys, f"{data_file}:thread_loader", "--workers", 1, "--seconds", 0, "--rounds", 2)
    assert status == 0, out
    assert sys.modules[data_file.stem].SEEN  # collate ran in a thread of this process, not in a worker process


@pytest.mark.timeout(60)
def test_batch_sizes_vary_a_loaders_batch_size(data_file, capsys):
    status, out, _ = run_tune(
        capsys, f"{data_file}:loader", "--workers", 0, "--batch-sizes", "3,7", "--seconds", 0, "--rounds", 2
    )
    assert status == 0, out
    sizes = {len(batch) for batch in sys.modules[data_file.stem].SEEN}
    assert sizes - {1000 % 3, 1000 % 7} == {3, 7}  # (the last batch of each pass of 1000 is shorter)
    assert "batch" in out.split("workers  prefetch", 1)[1].splitlines()[0]  # the header has a batch column


@pytest.mark.timeout(60)
def test_a_module_in_the_current_folder_imports_by_name(data_file, monkeypatch, capsys):
    monkeypatch.chdir(data_file.parent)
    status, out, _ = run_tune(capsys, f"{data_file.stem}:fast", "--workers", "0,1", "--prefetch", 2, "--seconds", 0)
    assert status == 0, out
    assert "conveyor.DataLoader(Sleepy, batch_size=32, shuffle=True)" in out
    assert "recommended: num_workers=" in out


@pytest.mark.timeout(60)
def test_torch_builds_conveyors_torch_loader(data_file, capsys):
    pytest.importorskip("torch")
    status, out, _ = run_tune(capsys, f"{data_file}:fast", "--torch", "--workers", 0, "--seconds", 0)
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


@pytest.mark.parametrize(
    "option, message", [(("--rounds", 1), "--rounds must be at least 2"), (("--prefetch", 0), "at least 1")]
)
def test_a_bad_option_exits_2_saying_what_is_wrong(option, message, data_file, capsys):
    status, out, err = run_tune(capsys, f"{data_file}:fast", *option)
    assert status == 2 and message in err and out == ""


@pytest.mark.timeout(60)
def test_the_command_line_runs_a_module_from_the_current_folder_and_exits_2_on_a_bad_one(data_file):
    env = {**os.environ, "PYTHONPATH": SRC_DIR}
    command = [sys.executable, "-m", "conveyor.cli", "tune"]
    good = subprocess.run(
        [*command, f"{data_file.stem}:fast", "--workers", "0", "--seconds", "0"],
        cwd=data_file.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
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
        capsys,
        f"{data_file}:fast",
        "--workers",
        "0,1,2",
        "--prefetch",
        2,
        "--seconds",
        0,
        "--max-rss-gb",
        0.001,
        "--out",
        out_dir,
    )
    assert status == 1  # nothing fits: no recommendation
    results = json.loads((out_dir / "tune.json").read_text())["results"]
    assert [(r["workers"], r["status"]) for r in results] == [
        (0, "over-memory"),
        (1, "skipped-memory"),
        (2, "skipped-memory"),
    ]
    assert len(results[0]["rounds"]) == 1  # over budget: not measured again
    assert "no setting was measured" in out


@pytest.mark.timeout(60)
def test_settings_past_the_time_budget_are_skipped_and_later_rounds_not_begun(data_file, tmp_path, capsys):
    out_dir = tmp_path / "out"
    status, out, _ = run_tune(
        capsys,
        f"{data_file}:sleepy",
        "--batch-size",
        8,
        "--workers",
        "0,1,2",
        "--prefetch",
        2,
        "--rounds",
        3,
        "--seconds",
        0.3,
        "--max-seconds",
        0.6,
        "--out",
        out_dir,
    )
    assert status == 0, out
    # A round of 0 workers lasts 0.4 s at least (10 batches of 8 samples that sleep 5 ms each):
    # after it, another would pass 0.6 s.
    results = json.loads((out_dir / "tune.json").read_text())["results"]
    assert [r["status"] for r in results] == ["measured", "skipped-time", "skipped-time"]
    assert len(results[0]["rounds"]) == 1
    assert "--max-seconds 0.6 reached after 1 of 3 rounds" in out


@pytest.mark.timeout(60)
def test_tree_memory_counts_child_processes():
    alone = tune_measure.tree_memory_bytes()
    assert alone and alone > 1 << 20
    code = "import sys; print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        child.stdout.readline()  # an interpreter by now, no longer a fork sharing our pages
        assert tune_measure.tree_memory_bytes(child.pid) > 1 << 20
        assert tune_measure.tree_memory_bytes() > alone + (1 << 20)
    finally:
        child.stdin.close()
        child.wait(timeout=20)
        child.stdout.close()


def test_without_matplotlib_the_json_is_written_and_the_plot_skipped(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    options = tune_sweep.SweepOptions(rounds=2, seconds=1.0, min_batches=5, step_s=0.0, max_seconds=5.0, budget=None)
    rec = setting(1, 2, 10.0, 12.0)
    tune_report.write_outputs(tmp_path, "m:f", "a loader", options, [rec], rec)
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert (tmp_path / "tune.json").exists() and not (tmp_path / "tune.png").exists()
