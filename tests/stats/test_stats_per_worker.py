"""``loader.stats().workers`` and ``.nodes``: each worker's and each node's
batches, samples and busy time, for every kind of worker.

    processes, threads ──▶ a record per worker id on node "local", their batches adding up to the loader's
    num_workers=0      ──▶ one record: worker -1, the main process
    since=earlier      ──▶ the same figures for the interval (now less earlier, busy cut at its start)
    a worker that moves to another node (Ray's restart_lost) ──▶ each batch under the node that loaded it
    Ray actors (a local instance) ──▶ node "local" with its actors' pids, a killed actor's batches kept

Every share lies in [0, 1]; the workers' busy seconds add up to the
loader's (``to_dict()["raw"]["loading_busy_s"]``); ``to_dict()`` is JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time

import numpy as np
import pytest

import conveyor
from conveyor import DataLoader
from conveyor._engine.executor.records import Delivered, Timings
from conveyor._engine.workers import nodes
from conveyor.stats import StatsRecorder
from conveyor.stats.table import MAX_WORKER_LINES
from conveyor.stats.workers import LOCAL


class Slow(conveyor.Dataset):
    """Sample ``i``: ``[i]``, after ``delay_s`` of sleep."""

    def __init__(self, n: int = 64, delay_s: float = 0.001):
        self.n, self.delay_s = n, delay_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        time.sleep(self.delay_s)
        return np.array([i])


def check_books(stats) -> None:
    """What holds of every snapshot and interval: the sums, the shares, JSON."""
    loaded = stats.batches - stats.errors
    assert sum(w.batches for w in stats.workers) == loaded
    assert sum(n.batches for n in stats.nodes) == loaded
    assert sum(w.samples for w in stats.workers) == stats.samples == sum(n.samples for n in stats.nodes)
    for record in stats.workers + stats.nodes:
        assert 0.0 <= record.busy_fraction <= 1.0 and record.busy_s >= 0.0
    for worker in stats.workers:
        assert math.isclose(worker.busy_fraction, min(1.0, worker.busy_s / stats.wall_s), rel_tol=1e-9)
    for node in stats.nodes:
        own = [w for w in stats.workers if w.node == node.node]
        assert node.worker_ids == tuple(w.worker_id for w in own)
        assert math.isclose(node.busy_fraction, sum(w.busy_fraction for w in own) / len(own), rel_tol=1e-9)
    assert math.isclose(sum(w.busy_s for w in stats.workers), stats.to_dict()["raw"]["loading_busy_s"], abs_tol=1e-9)
    out = json.loads(json.dumps(stats.to_dict()))
    assert out["workers"] == [w.to_dict() for w in stats.workers]
    assert out["nodes"] == [{**n.to_dict(), "worker_ids": list(n.worker_ids)} for n in stats.nodes]


@pytest.mark.timeout(120)
def test_two_worker_processes_each_have_a_record_on_this_machine():
    loader = DataLoader(Slow(), batch_size=4, num_workers=2)
    assert len(list(loader)) == 16
    stats = loader.stats()
    check_books(stats)
    assert [w.worker_id for w in stats.workers] == [0, 1]
    assert all(w.node == LOCAL and w.pid not in (None, os.getpid()) for w in stats.workers)
    assert [n.node for n in stats.nodes] == [LOCAL] and stats.nodes[0].worker_ids == (0, 1)
    # The node's busy share is its workers' mean: the loader's workers_busy_fraction.
    assert math.isclose(stats.nodes[0].busy_fraction, stats.workers_busy_fraction, rel_tol=1e-9)
    text = stats.text()
    assert "node local: 2 workers, 16 batches" in text and f"worker 1 (pid {stats.workers[1].pid}, local)" in text


@pytest.mark.timeout(120)
def test_worker_threads_are_workers_of_the_main_process():
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, worker_method="thread")
    list(loader)
    stats = loader.stats()
    check_books(stats)
    assert [(w.worker_id, w.pid, w.node) for w in stats.workers] == [(0, os.getpid(), LOCAL), (1, os.getpid(), LOCAL)]


def test_without_workers_the_main_process_is_the_one_worker():
    loader = DataLoader(Slow(n=16), batch_size=4, num_workers=0)
    list(loader)
    list(loader)
    stats = loader.stats()
    check_books(stats)
    (worker,) = stats.workers
    assert (worker.worker_id, worker.pid, worker.node, worker.batches) == (-1, os.getpid(), LOCAL, 8)
    assert math.isclose(worker.busy_fraction, stats.workers_busy_fraction, rel_tol=1e-9)
    assert "node " not in stats.table()  # (one worker on one node: the stage table says it all)


@pytest.mark.timeout(120)
def test_an_interval_has_the_figures_since_its_start():
    loader = DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    earlier = loader.stats()
    list(loader)
    now = loader.stats(since=earlier)
    interval = now.interval
    check_books(now)
    check_books(interval)
    assert interval.batches == 16 and now.batches == 32
    before = {w.worker_id: w.batches for w in earlier.workers}
    assert {w.worker_id: w.batches - before[w.worker_id] for w in now.workers} == {
        w.worker_id: w.batches for w in interval.workers
    }
    for total, part in zip(now.workers, interval.workers):
        assert part.busy_s <= total.busy_s + 1e-9


def recorded(batches: list[tuple[int, int]], errors: int = 0, gap_s: float = 0.0) -> StatsRecorder:
    """A recorder fed one batch per (worker id, timing pid), ``gap_s`` apart,
    each loaded for 0.5 ms just before it arrived, then ``errors`` batches that raised."""
    recorder = StatsRecorder(num_workers=2)
    pass_id = recorder.begin_pass(time.perf_counter(), None, 2, "ray")
    for worker_id, pid in batches:
        time.sleep(gap_s)
        now = time.perf_counter()
        timings = Timings.make(
            samples=2, started_at=now - 5e-4, fetch_s=4e-4, collate_s=1e-4, worker_id=worker_id, worker_pid=pid
        )
        recorder.batch(pass_id, Delivered(0, timings=timings), now, now + 1e-5)
    for _ in range(errors):
        now = time.perf_counter()
        recorder.batch(pass_id, Delivered(0, error=ValueError("bad")), now, now + 1e-5)
    return recorder


@pytest.fixture
def two_nodes():
    """Two Ray nodes other than this one, as RayActorWorkers names them: timing pid -> node."""
    pids = [
        nodes.remote_timing_pid("aaaaaaaa" * 7, "10.0.0.1", 900),
        nodes.remote_timing_pid("bbbbbbbb" * 7, "10.0.0.2", 900),
    ]
    assert [nodes.node_of(pid) for pid in pids] == ["10.0.0.1 (node aaaaaaaa)", "10.0.0.2 (node bbbbbbbb)"]
    yield pids


def test_a_worker_moved_to_another_node_counts_each_batch_where_it_was_loaded(two_nodes):
    on_a, on_b = two_nodes
    # Worker 0 on node A throughout; worker 1 on node A, then (restarted) on node B.
    # 600 batches: the recorder adds its rows 256 at a time, so the move falls within and across them.
    batches = [(0, on_a), (1, on_a)] * 150 + [(0, on_a), (1, on_b)] * 150
    stats = recorded(batches, errors=3).snapshot()
    assert stats.batches == 603 and stats.errors == 3
    check_books(stats)
    assert [(w.worker_id, w.pid, w.node, w.batches) for w in stats.workers] == [
        (0, None, "10.0.0.1 (node aaaaaaaa)", 300),
        (1, None, "10.0.0.1 (node aaaaaaaa)", 150),
        (1, None, "10.0.0.2 (node bbbbbbbb)", 150),
    ]
    assert [(n.node, n.worker_ids, n.batches) for n in stats.nodes] == [
        ("10.0.0.1 (node aaaaaaaa)", (0, 1), 450),
        ("10.0.0.2 (node bbbbbbbb)", (1,), 150),
    ]
    assert "node 10.0.0.2 (node bbbbbbbb): 1 worker, 150 batches" in stats.table()


def test_an_interval_counts_a_node_that_appeared_within_it(two_nodes):
    on_a, on_b = two_nodes
    recorder = recorded([(0, on_a)] * 10)
    earlier = recorder.snapshot()
    pass_id = recorder.begin_pass(time.perf_counter(), None, 2, "ray")
    for _ in range(5):
        now = time.perf_counter()
        timings = Timings.make(samples=2, started_at=now - 5e-4, fetch_s=5e-4, worker_id=0, worker_pid=on_b)
        recorder.batch(pass_id, Delivered(0, timings=timings), now, now + 1e-5)
    interval = recorder.snapshot(since=earlier).interval
    check_books(interval)
    assert [(n.node, n.batches) for n in interval.nodes] == [
        ("10.0.0.1 (node aaaaaaaa)", 0),
        ("10.0.0.2 (node bbbbbbbb)", 5),
    ]


def test_many_workers_get_a_line_per_node_only():
    workers = MAX_WORKER_LINES + 2
    stats = recorded([(k, 1000 + k) for k in range(workers)] * 3).snapshot()
    check_books(stats)
    assert len(stats.workers) == workers and [n.node for n in stats.nodes] == [LOCAL]
    table = stats.table()
    assert f"node local: {workers} workers, {3 * workers} batches" in table and "worker 0 (" not in table


class KilledOnce(Slow):
    """As Slow; the process that loads sample ``victim`` first is killed there."""

    def __init__(self, victim: int, marker: str):
        super().__init__(n=24)
        self.victim, self.marker = victim, marker

    def __getitem__(self, i: int) -> np.ndarray:
        if i == self.victim and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


# Generous: Ray takes 10-30 s to start actors on a loaded two-core machine; never asserted.
@pytest.mark.timeout(600)
@pytest.mark.usefixtures("local_ray")
def test_ray_actors_on_this_node_count_there_a_restarted_one_included(tmp_path):
    pytest.importorskip("ray")
    options = conveyor.RayWorkers(restart_lost=1)
    loader = DataLoader(KilledOnce(9, str(tmp_path / "killed")), batch_size=4, num_workers=2, worker_method=options)
    assert len(list(loader)) == 6 and os.path.exists(tmp_path / "killed")
    stats = loader.stats()
    check_books(stats)
    assert stats.worker_method == "ray" and [n.node for n in stats.nodes] == [LOCAL]
    # The killed worker's batches stay its own, under its id, with its new actor's pid.
    assert [w.worker_id for w in stats.workers] == [0, 1]
    assert all(w.pid is not None and w.pid != os.getpid() for w in stats.workers)


def test_the_verdict_on_busy_ray_workers_names_the_busiest_node(two_nodes):
    on_a, on_b = two_nodes
    stats = recorded([(0, on_a), (1, on_b), (1, on_b)] * 20, gap_s=0.002).snapshot()
    busiest = max(stats.nodes, key=lambda node: node.busy_fraction)
    assert busiest.node == "10.0.0.2 (node bbbbbbbb)" and busiest.busy_fraction < 1.0  # (two of every three batches)
    saturated = dataclasses.replace(
        stats,
        worker_method="ray",
        wall_s=10.0,
        startup_s=0.0,
        data_wait_fraction=0.5,
        steady_wait_fraction=0.5,
        workers_busy_fraction=0.95,
        loading_cpu_fraction=0.9,
        loading_cpu_wait_fraction=0.02,
    )
    advice = saturated.verdict(cores=2).advice
    assert f"(the busiest node, {busiest.node}, {busiest.busy_fraction:.0%})" in advice, advice
