"""loader.stats(): per-stage timings, rates, the verdict, live views, traces, profilers.

Durations come from sleeping stages (a sleep takes time but no CPU, so the
two cores of a shared machine do not blur which stage is slow); tests
assert which stage dominates and that the books balance, never how long
anything took.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import time

import numpy as np
import pytest

import conveyor
from conveyor.stats import LOADING_STAGES, STAGES, JsonLinesWriter, LoaderStats
from toy_datasets import Sleepy, Squares

pytestmark = pytest.mark.timeout(120)

REQUIRED_KEYS = {
    "batches",
    "samples",
    "wall_s",
    "samples_per_s",
    "first_batch_s",
    "data_wait_fraction",
    "workers_busy_fraction",
    "stages",
}
#: wait + compute is wall time by construction; only float rounding separates them.
BOOKS_TOLERANCE_S = 1e-6


def _loader(flavor: str, dataset, **kwargs):
    if flavor == "torch":
        import conveyor.torch as ct

        return ct.DataLoader(dataset, **kwargs)
    return conveyor.DataLoader(dataset, **kwargs)


def _drain(loader, step_s: float = 0.0) -> int:
    count = 0
    for _ in loader:
        if step_s:
            time.sleep(step_s)
        count += 1
    return count


@pytest.mark.parametrize("flavor", ["numpy", "torch"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_fields_are_there_and_json_takes_them(flavor, num_workers):
    loader = _loader(flavor, Squares(50), batch_size=8, num_workers=num_workers)
    assert _drain(loader) == 7
    stats = loader.stats()
    assert isinstance(stats, LoaderStats)
    out = json.loads(json.dumps(stats.to_dict()))
    assert REQUIRED_KEYS <= set(out)
    assert out["batches"] == 7 and out["samples"] == 50 and out["errors"] == 0
    assert set(out["stages"]) == set(STAGES)
    for stage in out["stages"].values():
        assert set(stage) == {"total_s", "p50_s", "p90_s", "p99_s"}
        assert 0 <= stage["p50_s"] <= stage["p90_s"] <= stage["p99_s"]
    assert out["wall_s"] > 0 and out["samples_per_s"] > 0
    assert 0 < out["first_batch_s"] <= out["wall_s"]
    assert 0 <= out["data_wait_fraction"] <= 1
    assert out["num_workers"] == num_workers and out["passes"] == 1
    assert out["stages"]["fetch"]["total_s"] > 0 and out["stages"]["collate"]["total_s"] > 0
    if num_workers:
        assert out["worker_start_s"] > 0
        assert out["stages"]["transport"]["total_s"] > 0
        assert out["slots_in_use"] >= 0  # (small batches travel inline; see the test below)
    else:
        assert out["worker_start_s"] is None
        assert out["stages"]["transport"]["total_s"] == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_wait_and_compute_add_up_to_wall_time(num_workers):
    loader = conveyor.DataLoader(Sleepy(24, 0.004), batch_size=4, num_workers=num_workers)
    _drain(loader, step_s=0.01)
    stats = loader.stats()
    stages = stats.stages
    assert abs(stages["wait"].total_s + stages["compute"].total_s - stats.wall_s) < BOOKS_TOLERANCE_S
    # The loop slept 10 ms a batch: compute holds at least that.
    assert stages["compute"].total_s >= 6 * 0.01
    if num_workers == 0:
        # In the main process, the loop waits exactly while a batch loads:
        # the loading stages account for the wait, less the loader's own
        # bookkeeping (within 10% of wall time, stated tolerance).
        loading = sum(stages[name].total_s for name in LOADING_STAGES)
        assert loading <= stages["wait"].total_s
        assert stages["wait"].total_s - loading < 0.10 * stats.wall_s


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_slow_getitem_is_input_bound_on_fetch(num_workers):
    # 40 batches and at least 0.8 s of sleeping: enough for a verdict.
    loader = conveyor.DataLoader(Sleepy(160, 0.01), batch_size=4, num_workers=num_workers)
    _drain(loader)
    stats = loader.stats()
    verdict = stats.verdict(cores=2)
    assert verdict.bound == "input"
    assert verdict.slowest_stage == "fetch"
    assert verdict.slowest_share > 0.8
    assert stats.data_wait_fraction > 0.5
    # Sleeping is waiting, not computing: the advice says so (or, without
    # workers, says to use them).
    assert stats.loading_cpu_fraction < 0.5
    if num_workers:
        assert "more workers than cores" in verdict.advice
    else:
        assert "num_workers=" in verdict.advice
    text = io.StringIO()
    assert stats.summary(file=text, cores=2) is None  # (printed once; nothing for a REPL to show again)
    assert "input-bound" in text.getvalue() and "fetch" in text.getvalue()
    assert text.getvalue() == stats.text(cores=2) + "\n"


def test_a_slow_training_step_is_compute_bound():
    loader = conveyor.DataLoader(Squares(200), batch_size=8, num_workers=2)
    _drain(loader, step_s=0.03)
    verdict = loader.stats().verdict(cores=2)
    assert verdict.bound == "compute"
    assert "keeps up" in verdict.advice
    assert "compute-bound" in str(verdict)


def test_no_batches_yet_has_nothing_to_say():
    loader = conveyor.DataLoader(Squares(8), batch_size=4)
    stats = loader.stats()
    assert stats.batches == 0 and stats.wall_s == 0
    assert stats.verdict().bound == "unknown"


def test_samples_of_an_iterable_dataset_and_its_short_last_batch():
    loader = conveyor.DataLoader(conveyor.ShardedIterable(list(range(23))), batch_size=4, num_workers=2)
    assert _drain(loader) == 6  # 2 workers: 12 + 11 items, batches of 4, 4, 4 and 4, 4, 3
    stats = loader.stats()
    assert stats.batches == 6 and stats.samples == 23


def test_failed_batches_are_counted_as_errors():
    class FailsAt3(Squares):
        def __getitem__(self, i):
            if i == 3:
                raise KeyError(i)
            return i

    loader = conveyor.DataLoader(FailsAt3(16), batch_size=4, num_workers=2)
    seen = []
    it = iter(loader)
    while True:
        try:
            seen.append(next(it))
        except KeyError:
            continue
        except StopIteration:
            break
    stats = loader.stats()
    assert len(seen) == 3 and stats.batches == 4 and stats.errors == 1 and stats.samples == 12


def test_stats_add_up_over_passes_and_intervals_count_from_a_snapshot():
    loader = conveyor.DataLoader(Squares(40), batch_size=10, num_workers=2, persistent_workers=True)
    _drain(loader)
    first = loader.stats()
    _drain(loader)
    second = loader.stats(since=first)
    assert second.batches == 8 and second.passes == 2
    assert second.interval is not None
    assert second.interval.batches == 4 and second.interval.samples == 40
    assert 0 < second.interval.wall_s < second.wall_s
    assert second.to_dict()["interval"]["batches"] == 4


def test_a_pass_left_early_counts_until_its_last_batch():
    loader = conveyor.DataLoader(Squares(100), batch_size=10)
    for k, _ in enumerate(loader):
        if k == 2:
            break
    at_break = loader.stats()
    time.sleep(0.05)  # after the break: not the loader's time
    stats = loader.stats()
    assert stats.batches == 3 and stats.wall_s == at_break.wall_s
    _drain(loader)
    assert loader.stats().batches == 13 and loader.stats().passes == 2


def test_on_stats_calls_back_with_intervals_and_at_the_end_of_each_pass(tmp_path):
    calls = []
    loader = conveyor.DataLoader(Sleepy(20, 0.002), batch_size=2)
    remove = loader.on_stats(calls.append, every_s=0.01)
    path = tmp_path / "stats.jsonl"
    loader.on_stats(JsonLinesWriter(path), every_s=0.01)
    _drain(loader)
    assert len(calls) >= 2
    assert calls[-1].batches == 10
    assert sum(call.interval.batches if call.interval else call.batches for call in calls) == 10
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines and lines[-1]["batches"] == 10 and "time" in lines[-1]
    remove()
    before = len(calls)
    _drain(loader)
    assert len(calls) == before


def test_bad_stats_arguments_fail_at_construction():
    with pytest.raises(TypeError, match="collect_stats"):
        conveyor.DataLoader(Squares(4), collect_stats=1)
    with pytest.raises(ValueError, match="collect_stats=False"):
        conveyor.DataLoader(Squares(4), collect_stats=False, progress=True)
    loader = conveyor.DataLoader(Squares(4), collect_stats=False)
    assert _drain(loader) == 4
    with pytest.raises(RuntimeError, match="collect_stats=True"):
        loader.stats()
    with pytest.raises(ValueError, match="every_s"):
        conveyor.DataLoader(Squares(4)).on_stats(print, every_s=0)
    with pytest.raises(TypeError, match="callable"):
        conveyor.DataLoader(Squares(4)).on_stats("print")


def test_nothing_is_printed_unless_asked(capfd):
    _drain(conveyor.DataLoader(Squares(20), batch_size=4, num_workers=2))
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_the_progress_bar_shows_rate_wait_and_busy(capfd, monkeypatch):
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread left behind
    monkeypatch.setattr(conveyor.stats.live, "BAR_EVERY_S", 0.01)
    loader = conveyor.DataLoader(Sleepy(40, 0.002), batch_size=2, num_workers=2, progress=True)
    _drain(loader)
    err = capfd.readouterr().err
    assert "20/20" in err
    assert "samples/s" in err and "data wait" in err and "workers busy" in err


def test_a_pickled_loader_starts_its_stats_afresh():
    loader = conveyor.DataLoader(Squares(20), batch_size=4)
    _drain(loader)
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.stats().batches == 0
    _drain(copy)
    assert copy.stats().batches == 5 and loader.stats().batches == 5


def test_the_trace_puts_every_workers_spans_on_one_timeline(tmp_path):
    path = tmp_path / "trace.json"
    loader = conveyor.DataLoader(Sleepy(16, 0.002), batch_size=4, num_workers=2)
    with loader.trace(path):
        _drain(loader)
    events = json.loads(path.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    by_name = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    assert len(by_name["fetch"]) == 4 and len(by_name["collate"]) == 4 and len(by_name["wait (next)"]) == 4
    worker_pids = {span["pid"] for span in by_name["fetch"]}
    assert os.getpid() not in worker_pids and 1 <= len(worker_pids) <= 2
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert any(name.startswith("worker ") for name in names)
    # One clock: each batch's fetch starts before the loop receives it.
    received = {span["args"]["batch"]: span["ts"] + span["dur"] for span in by_name["wait (next)"]}
    for span in by_name["fetch"]:
        assert span["ts"] < received[span["args"]["batch"]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_profiler_sees_the_same_dataloader_range_as_torch(num_workers):
    torch = pytest.importorskip("torch")
    import torch.utils.data as tud

    import conveyor.torch as ct

    def ranges(loader):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in loader:
                pass
        return sorted({e.key for e in prof.key_averages() if e.key.startswith("enumerate(DataLoader)")})

    dataset = list(range(16))
    expected = ranges(tud.DataLoader(dataset, batch_size=4, num_workers=num_workers))
    assert expected  # torch opens one
    assert ranges(ct.DataLoader(dataset, batch_size=4, num_workers=num_workers)) == expected


def test_percentiles_follow_the_slow_batches():
    class SlowEvery10th(Squares):
        def __getitem__(self, i):
            if i % 40 == 0:
                time.sleep(0.02)
            return np.int64(i)

    loader = conveyor.DataLoader(SlowEvery10th(400), batch_size=4)
    _drain(loader)
    fetch = loader.stats().stages["fetch"]
    assert fetch.p50_s < 0.01 <= fetch.p99_s


def test_slots_in_use_counts_the_batches_the_loop_holds():
    dataset = conveyor.TensorDataset(np.zeros((40, 32768), np.float32))
    loader = conveyor.DataLoader(dataset, batch_size=4, num_workers=2)
    held = [batch for batch in loader]  # every batch (512 KiB, a large leaf: a view) kept: each holds its slot
    assert loader.stats().slots_in_use >= 3
    del held


# ----------------------------------------------------------- the verdict's rules


def _stats(num_workers=2, wait=0.5, busy=0.9, cpu=0.9, cpu_wait=0.0, slowest="fetch", passes=1, startup=0.0):
    """LoaderStats of a 10 s run whose loading time is all in ``slowest``."""
    from conveyor.stats import StageStats

    stages = {name: StageStats(0.0, 0.0, 0.0, 0.0) for name in STAGES}
    stages[slowest] = StageStats(8.0, 0.02, 0.03, 0.05)
    stages["wait"] = StageStats(10.0 * wait, 0.0, 0.0, 0.0)
    stages["compute"] = StageStats(10.0 * (1 - wait), 0.0, 0.0, 0.0)
    return LoaderStats(
        batches=400,
        samples=12800,
        errors=0,
        wall_s=10.0,
        samples_per_s=1280.0,
        batches_per_s=40.0,
        first_batch_s=startup,
        worker_start_s=0.1 if num_workers else None,
        worker_starts=passes if num_workers else 0,
        data_wait_fraction=wait,
        startup_s=startup,
        steady_wait_fraction=wait,
        workers_busy_fraction=busy,
        loading_cpu_fraction=cpu,
        loading_cpu_wait_fraction=cpu_wait,
        num_workers=num_workers,
        slots_in_use=0,
        passes=passes,
        stages=stages,
        loading_off_cpu_fraction=None if cpu_wait is None else max(0.0, 1.0 - cpu - cpu_wait),
    )


@pytest.mark.parametrize(
    "stats, bound, words",
    [
        (_stats(wait=0.02, busy=0.1, num_workers=8), "compute", "num_workers=2"),
        (_stats(num_workers=0), "input", "num_workers=4"),
        (_stats(slowest="sampler"), "input", "sampler"),
        (_stats(slowest="transport"), "input", "smaller dtypes"),
        (_stats(slowest="pin"), "input", "pin_memory"),
        (_stats(cpu=0.4, cpu_wait=0.5), "input", "free core"),
        (_stats(cpu=0.1), "input", "more workers than cores"),
        (_stats(cpu=0.1), "input", 'worker_method="thread"'),
        (_stats(cpu=0.1), "input", "reads_in_flight=8"),
        (_stats(num_workers=2, busy=0.95), "input", "more workers: num_workers=4"),
        (_stats(num_workers=4, busy=0.95), "input", "make __getitem__ cheaper"),
        (_stats(num_workers=4, busy=0.95, slowest="collate"), "input", "default_collate"),
        (_stats(busy=0.4), "input", "prefetch_factor"),
        (_stats(startup=3.0, passes=3), "input", "persistent_workers=True"),
    ],
)
def test_each_rule_of_the_verdict_names_its_remedy(stats, bound, words):
    verdict = stats.verdict(cores=4)
    assert verdict.bound == bound
    assert words in verdict.advice, verdict.advice


def test_the_thread_clock_tells_computing_from_sleeping():
    from conveyor._engine.cpu import ThreadClock

    clock = ThreadClock(every_s=0.0)
    try:
        started = time.perf_counter()
        clock.begin(started)
        time.sleep(0.05)
        slept_cpu, slept_wait = clock.end()
        slept_span = time.perf_counter() - started
        clock.begin(time.perf_counter())
        end = time.thread_time() + 0.05  # (CPU time: a loaded machine does not shorten it)
        while time.thread_time() < end:
            pass
        busy_cpu, _ = clock.end()
    finally:
        clock.close()
    assert slept_cpu < 0.02 and busy_cpu >= 0.045
    # Read inside the span: on a CPU and waiting for one fit in it.
    if slept_wait == slept_wait:  # (NaN where the system does not report it)
        assert slept_cpu + slept_wait <= slept_span


def test_the_thread_clock_measures_a_batch_only_when_one_is_due():
    from conveyor._engine.cpu import ThreadClock

    clock = ThreadClock(every_s=3600.0)
    try:
        clock.begin(time.perf_counter())
        first = clock.end()
        clock.begin(time.perf_counter())
        second = clock.end()
    finally:
        clock.close()
    assert first[0] == first[0]  # the first batch is measured
    assert second[0] != second[0] and second[1] != second[1]  # the next hour's are not (NaN)


def test_persistent_workers_are_not_advised_twice():
    import dataclasses

    persistent = dataclasses.replace(_stats(startup=3.0, passes=3), worker_starts=1)
    advice = persistent.verdict(cores=4).advice
    assert "persistent_workers" not in advice and "no batch loaded" in advice


def test_worker_starts_count_once_with_persistent_workers():
    loader = conveyor.DataLoader(Squares(20), batch_size=5, num_workers=2, persistent_workers=True)
    _drain(loader)
    _drain(loader)
    assert loader.stats().worker_starts == 1 and loader.stats().passes == 2
    fresh = conveyor.DataLoader(Squares(20), batch_size=5, num_workers=2)
    _drain(fresh)
    _drain(fresh)
    assert fresh.stats().worker_starts == 2
