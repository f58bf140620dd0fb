"""Every share the stats give lies in [0, 100%], and the shares that split
one whole add up to it: in LoaderStats, to_dict(), the printed table and
verdict, and the live bar, for real loads and for any raw figures (hypothesis).

The loads compare orderings only (a sleeping dataset spends less of its
loading time on a CPU than a spinning one; CPU burners beside a spinning
one make it wait for a core more), never durations, so they hold on a
loaded two-core machine.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
from conveyor._engine.executor.records import DeliveryTimes, Timings
from conveyor._engine.transport.messages import LoadTimes
from conveyor.stats import StatsRecorder, live
from conveyor.stats.figures import Mark, fractions
from conveyor.stats.machine import CoreUse
from toy_datasets import Sleepy

#: Shares are rounded to whole percents when printed; three of them can
#: then miss 100 by at most 1.5 points.
ROUNDING_POINTS = 1.5


class Spinning:
    """Map-style: each sample costs ``cpu_s`` of this thread's CPU time (a
    loaded machine stretches its wall time, not its CPU time)."""

    def __init__(self, n: int, cpu_s: float):
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return i


def assert_shares_hold(stats) -> None:
    """Each share in [0, 1]; each split adds up to its whole."""
    out = stats.to_dict()
    for name, value in out.items():
        if name.endswith("_fraction") and value is not None:
            assert 0.0 <= value <= 1.0, (name, value)
    loading = (stats.loading_cpu_fraction, stats.loading_cpu_wait_fraction, stats.loading_off_cpu_fraction)
    if None not in loading:
        assert math.isclose(sum(loading), 1.0, abs_tol=1e-9), loading
    cores = (stats.cores_job_fraction, stats.cores_others_fraction, stats.cores_idle_fraction)
    if None not in cores:
        assert math.isclose(sum(cores), 1.0, abs_tol=1e-9), cores
    stage_shares = [stats.stage_share(name) for name in conveyor.stats.LOADING_STAGES]
    assert all(0.0 <= share <= 1.0 for share in stage_shares)
    assert sum(stage_shares) == pytest.approx(1.0) or sum(stage_shares) == 0.0
    assert_printed_shares_hold(stats.text(cores=2))


def assert_printed_shares_hold(text: str) -> None:
    """Every percent printed is within 0-100, and a line of parts adds up to 100."""
    for value in re.findall(r"(-?[\d.]+)%", text):
        assert 0.0 <= float(value) <= 100.0, (value, text)
    for line in text.splitlines():
        if "not measured" in line:
            continue
        if line.startswith("  loading time of") or " while passes ran: " in line:
            parts = [float(v) for v in re.findall(r"(\d+)%", line.split(":", 1)[1])]
            assert abs(sum(parts) - 100.0) <= ROUNDING_POINTS, line


def _run(dataset, num_workers: int = 1, batch_size: int = 2):
    loader = conveyor.DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
    for _ in loader:
        pass
    return loader.stats()


# ----------------------------------------------------------- real loads


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_sleeping_loading_spends_less_of_its_time_on_a_cpu_than_spinning(num_workers):
    sleeping = _run(Sleepy(60, 0.005), num_workers)
    spinning = _run(Spinning(60, 0.005), num_workers)
    for stats in (sleeping, spinning):
        assert_shares_hold(stats)
        assert stats.cpu_measured_batches == stats.batches == 30  # (every batch takes over a millisecond)
    assert sleeping.loading_cpu_fraction < spinning.loading_cpu_fraction
    if sys.platform.startswith("linux"):
        # A sleep is neither on a CPU nor waiting for one: it waits on something else.
        assert sleeping.loading_off_cpu_fraction > spinning.loading_off_cpu_fraction


@pytest.mark.timeout(120)
@pytest.mark.serial  # (the machine's cores measured: another test's load would count as the burners')
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="waiting for a core is measured on Linux")
def test_cpu_burners_beside_make_spinning_loading_wait_for_a_core():
    alone = _run(Spinning(160, 0.004))
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(3)]
    try:
        crowded = _run(Spinning(160, 0.004))
    finally:
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.wait()
    for stats in (alone, crowded):
        assert_shares_hold(stats)
    assert crowded.loading_cpu_wait_fraction > alone.loading_cpu_wait_fraction
    assert crowded.cores_others_fraction > alone.cores_others_fraction
    verdict = crowded.verdict()
    if verdict.bound == "input" and crowded.loading_cpu_wait_fraction >= 0.25:
        assert verdict.advice.startswith("other processes on this machine take the cores"), verdict.advice


@pytest.mark.timeout(120)
def test_an_interval_after_batches_loaded_ahead_keeps_workers_busy_within_their_time():
    # The tune case: the snapshot comes after the first batch, while the
    # workers already load the next ones; those run partly before it.
    loader = conveyor.DataLoader(Sleepy(120, 0.004), batch_size=2, num_workers=2, prefetch_factor=4)
    it = iter(loader)
    next(it)
    start = loader.stats()
    for _ in it:
        pass
    stats = loader.stats(since=start)
    assert_shares_hold(stats)
    assert_shares_hold(stats.interval)
    assert 0.0 < stats.interval.workers_busy_fraction <= 1.0


@pytest.mark.timeout(120)
def test_the_progress_bar_prints_shares_within_100_percent(capfd, monkeypatch):
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)  # no monitor thread left behind
    monkeypatch.setattr(conveyor.stats.live, "BAR_EVERY_S", 0.01)
    loader = conveyor.DataLoader(Sleepy(80, 0.002), batch_size=2, num_workers=2, prefetch_factor=8, progress=True)
    for _ in loader:
        time.sleep(0.001)
    err = capfd.readouterr().err
    assert "workers busy" in err
    assert_printed_shares_hold(err.replace("100%|", "|"))  # (tqdm's own bar shows 100% done)


# ----------------------------------------------------------- any raw figures

_seconds = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
_any_cpu = st.one_of(st.just(math.nan), st.floats(min_value=-1.0, max_value=1e3, allow_nan=False))


@settings(max_examples=300, deadline=None)
@given(
    counts=st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)),
    totals=st.tuples(*[_seconds] * 6),
    cores=st.one_of(st.none(), st.tuples(*[_seconds] * 4)),
    num_workers=st.integers(0, 64),
)
def test_any_raw_totals_give_shares_in_range_that_add_up(counts, totals, cores, num_workers):
    wall, busy, measured, cpu, wait, startup = totals
    mark = Mark(
        rows=0,
        batches=counts[0],
        samples=0,
        errors=0,
        wall_s=wall,
        at=0.0,
        busy_s=busy,
        cpu_batches=counts[0],
        cpu_wait_batches=counts[1],
        cpu_measured_s=measured,
        cpu_s=cpu,
        cpu_wait_s=wait,
        startup_s=startup,
        stage_totals=(0.0,) * 8,
        cores=None if cores is None else CoreUse(*cores),
    )
    shares = fractions(mark, num_workers)
    for value in shares:
        assert value is None or 0.0 <= value <= 1.0
    loading = shares.loading_cpu, shares.loading_cpu_wait, shares.loading_off_cpu
    if None not in loading:
        assert math.isclose(sum(loading), 1.0, abs_tol=1e-9)
    split = shares.cores_job, shares.cores_others, shares.cores_idle
    if None not in split:
        assert math.isclose(sum(split), 1.0, abs_tol=1e-9)


_batch = st.tuples(
    st.floats(min_value=-5.0, max_value=5.0),  # started_at, relative to the pass's start
    st.floats(min_value=0.0, max_value=2.0),  # fetch_s
    st.floats(min_value=0.0, max_value=0.5),  # collate_s
    _any_cpu,
    _any_cpu,
    st.integers(0, 3),  # worker
)


def _delivered(started_at, fetch_s, collate_s, cpu_s, cpu_wait_s, worker):
    loading = LoadTimes(4, started_at, fetch_s, collate_s, 0.0, cpu_s, cpu_wait_s)
    delivery = DeliveryTimes(0.0, 0.0, 0.0, 0.0, started_at + fetch_s, math.nan, worker, 10**9 + worker, 0)
    return SimpleNamespace(index=0, timings=Timings(loading, delivery))


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(_batch, min_size=1, max_size=40), cut=st.integers(0, 40), num_workers=st.integers(1, 4))
def test_any_batch_figures_through_the_recorder_give_shares_that_hold(batches, cut, num_workers):
    """Whatever the workers report (CPU beyond the batch, NaN, loading that
    began before the pass or the snapshot), the stats keep every share in
    range: the recorder cuts each figure to what it can be a part of."""
    recorder = StatsRecorder(num_workers)
    origin = time.perf_counter()
    pass_id = recorder.begin_pass(origin, None, num_workers)
    clock = time.perf_counter()
    earlier = None
    for k, (started, fetch_s, collate_s, cpu_s, wait_s, worker) in enumerate(batches):
        if k == cut:
            earlier = recorder.snapshot()
        delivered = _delivered(origin + started, fetch_s, collate_s, cpu_s, wait_s, worker)
        recorder.batch(pass_id, delivered, clock, clock + 0.001)
        clock += 0.002
    before_end = recorder.mark()
    stats = recorder.snapshot(since=earlier)
    for each in (stats, stats.interval):
        if each is None:
            continue
        for name, value in each.to_dict().items():
            if name.endswith("_fraction") and value is not None:
                assert 0.0 <= value <= 1.0, (name, value)
        loading = each.loading_cpu_fraction, each.loading_cpu_wait_fraction, each.loading_off_cpu_fraction
        if None not in loading:
            assert math.isclose(sum(loading), 1.0, abs_tol=1e-9)
        assert_printed_shares_hold(each.text(cores=2))
    if earlier is not None:
        assert_printed_shares_hold(live._postfix(recorder.interval(before_end, earlier._mark), num_workers))
    json.dumps(stats.to_dict())


def test_loading_done_before_a_snapshot_is_not_the_intervals():
    """Two workers each loaded a batch for 1 s before the snapshot and
    delivered it 0.1 s after: the interval's 0.1 s are not 2 s of busy workers."""
    recorder = StatsRecorder(2)
    origin = time.perf_counter() - 10.0
    pass_id = recorder.begin_pass(origin, None, 2)
    recorder.batch(pass_id, _delivered(origin + 1.0, 1.0, 0.0, 1.0, 0.0, 0), origin + 2.0, origin + 2.0)
    start = recorder.snapshot()
    for worker in (0, 1):
        delivered = _delivered(origin + 1.1, 1.0, 0.0, 1.0, 0.0, worker)  # loading until origin + 2.1
        recorder.batch(pass_id, delivered, origin + 2.1, origin + 2.1)
    interval = recorder.snapshot(since=start).interval
    assert interval.wall_s == pytest.approx(0.1)
    assert interval.workers_busy_fraction == pytest.approx(1.0)  # 2 × 0.1 s of 2 × 0.1 s, not 2 s of 0.2 s
    assert interval.to_dict()["raw"]["loading_busy_s"] == pytest.approx(0.2)


def test_a_system_without_the_kernel_figures_says_not_measured(monkeypatch):
    """As on macOS or Windows: no /proc/thread-self/schedstat, no /proc/stat.
    The CPU share is still there (thread_time); the rest is None, and the
    summary says it is not measured rather than print a guess."""
    from conveyor._engine import cpu
    from conveyor.stats import machine

    monkeypatch.setattr(cpu, "_SCHEDSTAT", "/nonexistent/schedstat")
    monkeypatch.setattr(machine, "_PROC_STAT", "/nonexistent/stat")
    stats = _run(Spinning(40, 0.002), num_workers=0)
    assert 0.0 <= stats.loading_cpu_fraction <= 1.0 and stats.cpu_measured_batches == stats.batches
    assert stats.loading_cpu_wait_fraction is None and stats.loading_off_cpu_fraction is None
    assert stats.cores is None and stats.cores_job_fraction is None and stats.cores_others_fraction is None
    assert "cores_capacity_s" not in stats.to_dict()["raw"]
    text = stats.text(cores=2)
    assert "waiting for a free core: not measured on this system" in text
    assert "who used the cores: not measured on this system" in text
    assert_shares_hold(stats)
