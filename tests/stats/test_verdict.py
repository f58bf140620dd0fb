"""The verdict judges only enough evidence, names who takes the cores, and
names torch settings only when torch is in use. (Each rule's remedy:
test_stats.py; the shares it quotes: test_stats_shares.py.)"""

from __future__ import annotations

import dataclasses
import re
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor
from conveyor.stats import STAGES, LoaderStats, StageStats
from conveyor.stats.verdict import MIN_BATCHES, MIN_STEADY_S


def _stats(
    num_workers=2, wait=0.5, busy=0.9, cpu=0.4, cpu_wait=0.5, job=None, others=None, batches=400, wall=10.0, startup=0.0
) -> LoaderStats:
    """LoaderStats of a run whose loading time is all in fetch; ``job`` and
    ``others``: the cores' shares (None: not measured)."""
    stages = {name: StageStats(0.0, 0.0, 0.0, 0.0) for name in STAGES}
    stages["fetch"] = StageStats(0.8 * wall, 0.02, 0.03, 0.05)
    stages["wait"] = StageStats(wall * wait, 0.0, 0.0, 0.0)
    stages["compute"] = StageStats(wall * (1 - wait), 0.0, 0.0, 0.0)
    measured = job is not None and others is not None
    return LoaderStats(
        batches=batches,
        samples=batches * 32,
        errors=0,
        wall_s=wall,
        samples_per_s=batches * 32 / wall,
        batches_per_s=batches / wall,
        first_batch_s=startup,
        worker_start_s=0.1,
        worker_starts=1,
        data_wait_fraction=wait,
        startup_s=startup,
        steady_wait_fraction=wait,
        workers_busy_fraction=busy,
        loading_cpu_fraction=cpu,
        loading_cpu_wait_fraction=cpu_wait,
        num_workers=num_workers,
        slots_in_use=0,
        passes=1,
        stages=stages,
        cpu_measured_batches=batches,
        loading_off_cpu_fraction=None if cpu_wait is None else max(0.0, 1 - cpu - cpu_wait),
        cores=2 if measured else None,
        cores_job_fraction=job,
        cores_others_fraction=others,
        cores_idle_fraction=max(0.0, 1 - job - others) if measured else None,
    )


@pytest.fixture
def no_torch(monkeypatch):
    """This process as if torch had never been imported."""
    for name in [name for name in sys.modules if name == "torch" or name.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.fixture
def with_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch") or types.ModuleType("torch"))


# ----------------------------------------------------------- too little evidence


def test_a_few_milliseconds_over_100_numbers_are_too_little_to_judge():
    loader = conveyor.DataLoader(list(range(100)), batch_size=10)
    for _ in loader:
        pass
    verdict = loader.stats().verdict(cores=2)
    assert verdict.bound == "unknown"
    text = str(verdict)
    assert text.startswith("verdict: too little to judge: 10 batches")
    assert "input-bound" not in text and "num_workers" not in text


@pytest.mark.parametrize(
    "batches, wall, startup",
    [(MIN_BATCHES - 1, 60.0, 0.0), (10_000, MIN_STEADY_S * 0.9, 0.0), (10_000, 5.0, 5.0 - MIN_STEADY_S / 2)],
)
def test_too_few_batches_or_seconds_once_running_are_too_little(batches, wall, startup):
    verdict = _stats(batches=batches, wall=wall, startup=startup).verdict(cores=2)
    assert verdict.bound == "unknown" and "too little to judge" in str(verdict)


def test_enough_batches_and_seconds_get_a_verdict():
    assert _stats(batches=MIN_BATCHES, wall=MIN_STEADY_S * 2).verdict(cores=2).bound == "input"


# ----------------------------------------------------------- who takes the cores


def test_other_processes_taking_the_cores_are_named_and_torch_is_not_blamed(with_torch):
    advice = _stats(job=0.35, others=0.65).verdict(cores=2).advice
    assert advice.startswith("other processes on this machine take the cores")
    assert "65% of the 2 usable cores" in advice
    assert "torch" not in advice and "training process" not in advice


def test_this_job_taking_the_cores_suggests_torch_threads_only_with_torch(no_torch):
    advice = _stats(job=0.95, others=0.05).verdict(cores=2).advice
    assert advice.startswith("this job takes the cores")
    assert "fewer threads" in advice and "torch" not in advice


def test_this_job_taking_the_cores_with_torch_names_torch_set_num_threads(with_torch):
    advice = _stats(job=0.95, others=0.05).verdict(cores=2).advice
    assert "torch.set_num_threads" in advice


def test_idle_cores_while_loading_waits_for_one_point_at_a_quota():
    advice = _stats(job=0.4, others=0.05).verdict(cores=2).advice
    assert "idle 55%" in advice and "quota" in advice


def test_without_core_figures_the_verdict_says_it_does_not_know_who(no_torch):
    advice = _stats().verdict(cores=2).advice
    assert "free core" in advice and "not measured" in advice and "torch" not in advice


def test_without_the_wait_for_a_core_waiting_loading_says_it_may_be_that():
    advice = _stats(cpu=0.1, cpu_wait=None).verdict(cores=2).advice
    assert "more workers than cores" in advice and "not measured" in advice


_shares = st.floats(min_value=0.0, max_value=1.0)


@st.composite
def any_stats(draw) -> LoaderStats:
    """LoaderStats of any consistent run: shares in [0, 1] that add up, any
    stage the slowest, any worker method."""
    cpu = draw(_shares)
    cpu_wait = draw(st.one_of(st.none(), _shares))
    if cpu_wait is not None:
        cpu_wait = min(cpu_wait, 1.0 - cpu)
    job = others = None
    cores = draw(st.one_of(st.none(), st.tuples(_shares, _shares)))
    if cores is not None:
        job, others = cores[0], min(cores[1], 1.0 - cores[0])
    stats = _stats(
        num_workers=draw(st.integers(0, 16)),
        wait=draw(_shares),
        busy=draw(st.one_of(st.none(), _shares)),
        cpu=cpu,
        cpu_wait=cpu_wait,
        job=job,
        others=others,
    )
    slowest = draw(st.sampled_from(["sampler", "fetch", "collate", "transport", "pin"]))
    stages = dict(stats.stages)
    stages[slowest], stages["fetch"] = stages["fetch"], stages[slowest]
    return dataclasses.replace(stats, stages=stages, worker_method=draw(st.sampled_from(["fork", "thread", "ray"])))


@settings(max_examples=300, deadline=None)
@given(stats=any_stats())
def test_no_verdict_names_torch_without_torch_or_prints_a_share_past_100(stats):
    saved = {name: module for name, module in sys.modules.items() if name == "torch" or name.startswith("torch.")}
    for name in saved:
        del sys.modules[name]
    try:
        text = str(stats.verdict(cores=4))
    finally:
        sys.modules.update(saved)
    assert "torch" not in text
    for value in re.findall(r"([\d.]+)%", text):
        assert 0.0 <= float(value) <= 100.0, text


@settings(max_examples=300, deadline=None)
@given(stats=any_stats(), machine_cores=st.integers(1, 64))
def test_the_settings_a_verdict_names_for_tools_are_those_its_words_name(stats, machine_cores):
    """conveyor tune acts on ``advised_workers`` and ``advises_prefetch``, not
    on the words: both must say the same, whichever rule speaks."""
    verdict = stats.verdict(cores=machine_cores)
    named = [int(n) for n in re.findall(r"\bnum_workers=(\d+)", verdict.advice)]
    assert named == ([] if verdict.advised_workers is None else [verdict.advised_workers]), verdict.advice
    assert ("prefetch_factor" in verdict.advice) == verdict.advises_prefetch, verdict.advice


def test_more_workers_are_advised_with_a_caution_when_other_processes_use_the_cores():
    advice = _stats(cpu=0.9, cpu_wait=0.05, busy=0.95, job=0.5, others=0.4).verdict(cores=4).advice
    assert advice.startswith("more workers: num_workers=4") and "other processes" in advice


def test_this_job_with_a_worker_per_core_is_told_to_use_fewer():
    advice = _stats(num_workers=2, job=0.95, others=0.05).verdict(cores=2).advice
    assert "num_workers=1" in advice


# ----------------------------------------------------------------- Ray workers


def test_saturated_ray_workers_are_told_to_add_cpu_nodes_not_local_cores():
    """Ray workers run on the cluster's nodes: busy ones call for CPU nodes,
    whatever this machine's core count (here 64, with 2 workers)."""
    stats = dataclasses.replace(_stats(num_workers=2, busy=0.97, cpu=0.9, cpu_wait=0.05), worker_method="ray")
    advice = str(stats.verdict(cores=64))
    assert "add CPU nodes" in advice and "Ray workers are busy 97%" in advice, advice
    assert "num_workers=64" not in advice and "this machine has" not in advice, advice
    local = str(dataclasses.replace(stats, worker_method="fork").verdict(cores=64))
    assert "num_workers=64" in local and "CPU nodes" not in local, local


def test_ray_workers_short_of_cores_on_their_nodes_are_told_so():
    stats = dataclasses.replace(_stats(num_workers=4, busy=0.9, cpu=0.4, cpu_wait=0.5), worker_method="ray")
    advice = str(stats.verdict(cores=2))
    assert "wait for a free core on their nodes 50%" in advice and "num_cpus=1" in advice, advice
    assert "other processes on this machine" not in advice, advice


def test_the_stats_say_where_the_workers_ran():
    loader = conveyor.DataLoader(list(range(8)), batch_size=2, num_workers=0)
    for _ in loader:
        pass
    assert loader.stats().worker_method == "inline"
    assert loader.stats().to_dict()["worker_method"] == "inline"
