"""DataLoader(worker_method="ray"): the loading workers as Ray actors on a
local Ray instance (the shared one: ray_helpers.py, nothing of it left after).

    same seed ──▶ "ray" and "multiprocessing" yield the same batches, bitwise,
                  for 1, 2 and 3 workers, with random augmentations
                  (random, numpy.random, torch.rand) in __getitem__
    state_dict after k batches ──▶ a fresh loader yields the rest, the same
    a user's exception ──▶ its type, its traceback, the batch's indices
    a batch that does not pickle ──▶ its TypeError, as from a process
    an iterable dataset ──▶ the items worker processes yield, in their order; persistent
                  actors' copies follow set_epoch as fresh processes' do
    a worker's process killed, or its actor (ray.kill), mid-epoch ──▶ WorkerDiedError naming the worker,
                  its node and the batch in hand (never a hang); with
                  RayWorkers(restart_lost=1) the epoch completes, the same
    timeout, stats, trace ──▶ as with processes
    mistakes ──▶ ValueError/TypeError at construction, naming the fix
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
from functools import partial

import numpy as np
import pytest

import conveyor
import procutil
from conveyor import DataLoader, RayWorkers, WorkerDiedError

pytest.importorskip("ray")

# Generous: Ray takes 10-30 s to start actors on a loaded two-core machine; never asserted.
pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("local_ray")]


class Augmented(conveyor.Dataset):
    """Sample ``i``: ``i`` and draws from every global generator (seeded
    per batch in a worker process, and so in an actor)."""

    def __init__(self, n: int = 24):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        import torch

        noise = [random.random(), float(np.random.rand()), float(torch.rand(1))]
        return {"index": i, "x": np.array([i, *noise], dtype=np.float64), "t": torch.rand(2).numpy()}


class FailsAt(Augmented):
    """As Augmented; sample ``bad`` raises."""

    def __init__(self, bad: int, n: int = 24):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> dict:
        if i == self.bad:
            raise LookupError(f"sample {i} is missing")
        return super().__getitem__(i)


class KilledOnce(Augmented):
    """As Augmented; the process that loads sample ``victim`` first is
    killed (SIGKILL) there; the marker file says it happened."""

    def __init__(self, victim: int, marker: str, n: int = 24):
        super().__init__(n)
        self.victim, self.marker = victim, marker

    def __getitem__(self, i: int) -> dict:
        if i == self.victim and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Stuck(conveyor.Dataset):
    """Sample ``i`` is ``i``; sample 5 takes ten minutes (its actor is killed when the loader stops)."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        if i == 5:
            import time

            time.sleep(600)
        return i


def touch(path: str, worker_id: int) -> None:
    """A worker_init_fn (with functools.partial): the file ``path`` says the worker has started."""
    open(path, "w").close()


def rows(loader) -> list[tuple]:
    """Every batch as plain bytes, in order (bitwise comparison)."""
    return [tuple((key, np.asarray(value).tobytes()) for key, value in batch.items()) for batch in loader]


def reference(dataset, **kwargs) -> list[tuple]:
    """What local worker processes yield for the same arguments."""
    return rows(DataLoader(dataset, **{**kwargs, "worker_method": "multiprocessing"}))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # (3 processes on 2 cores, for the reference)
@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_ray_batches_are_bitwise_those_of_worker_processes(num_workers):
    kwargs = dict(batch_size=4, shuffle=True, seed=11, num_workers=num_workers)
    expected = reference(Augmented(), **kwargs)
    got = rows(DataLoader(Augmented(), worker_method=RayWorkers(num_cpus=1), **kwargs))
    assert got == expected
    assert len(got) == 6


def test_persistent_actors_give_every_epoch_the_batches_of_worker_processes():
    kwargs = dict(batch_size=4, shuffle=True, seed=2, num_workers=2, persistent_workers=True)
    processes = DataLoader(Augmented(), **{**kwargs, "worker_method": "multiprocessing"})
    actors = DataLoader(Augmented(), worker_method="ray", **kwargs)
    for _ in range(2):  # (a new epoch: a new shuffle and new seeds, the same actors)
        assert rows(actors) == rows(processes)


def test_persistent_actors_follow_the_epoch_of_an_iterable_dataset():
    """set_epoch reaches the actors' copies: each epoch as fresh worker processes give it (issue 32)."""
    from epoch_datasets import EpochShuffled

    def epochs(**kwargs):
        dataset = EpochShuffled()
        loader = DataLoader(dataset, batch_size=4, num_workers=2, **kwargs)
        out = []
        for epoch in range(3):
            dataset.set_epoch(epoch)
            loader.set_epoch(epoch)
            out.append([batch.tolist() for batch in loader])
        return out

    expected = epochs()
    assert epochs(worker_method="ray", persistent_workers=True) == expected
    assert len({repr(epoch) for epoch in expected}) == 3


def test_a_state_saved_mid_epoch_resumes_with_the_same_batches():
    kwargs = dict(batch_size=3, shuffle=True, seed=5, num_workers=2, worker_method="ray")
    expected = reference(Augmented(), **kwargs)
    first = DataLoader(Augmented(), **kwargs)
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    resumed = DataLoader(Augmented(), **kwargs)
    resumed.load_state_dict(state)
    rest = rows(resumed)
    head_rows = [tuple((key, np.asarray(value).tobytes()) for key, value in batch.items()) for batch in head]
    assert head_rows + rest == expected


def test_a_users_exception_arrives_with_its_type_traceback_and_indices():
    loader = DataLoader(FailsAt(5), batch_size=4, num_workers=2, worker_method="ray")
    it = iter(loader)
    assert next(it)["index"].tolist() == [0, 1, 2, 3]
    with pytest.raises(LookupError, match="sample 5 is missing") as failed:
        next(it)
    text = str(failed.value)
    assert "batch 1" in text and "5" in text and "worker" in text
    assert "__getitem__" in text  # (the worker's traceback)
    assert next(it)["index"].tolist() == [8, 9, 10, 11]  # (the pass goes on, as in torch)


def test_a_batch_that_does_not_pickle_fails_alone_as_from_a_process():
    import threading

    def collate(samples):
        return {"x": samples, "lock": threading.Lock()}

    got = []
    for method in ("multiprocessing", "ray"):
        it = iter(DataLoader(list(range(8)), batch_size=4, num_workers=1, collate_fn=collate, worker_method=method))
        for _ in range(2):  # (each batch fails alone; the pass goes on)
            with pytest.raises(TypeError, match="while sending its result to the main process") as failed:
                next(it)
            got.append(str(failed.value).split("(conveyor: ")[1].split(",", 1)[1].split(")")[0])
    assert got[:2] == got[2:]  # (the same batches and indices named)


def test_a_killed_worker_is_reported_with_its_node_and_batch(tmp_path):
    marker = str(tmp_path / "killed")
    loader = DataLoader(KilledOnce(9, marker), batch_size=4, num_workers=2, worker_method="ray")
    it = iter(loader)
    with pytest.raises(WorkerDiedError) as died:
        for _ in it:
            pass
    text = str(died.value)
    assert os.path.exists(marker)
    assert "Ray actor" in text and "on node" in text and "was lost" in text
    # Worker 0 loads batches 0 and 2 (sample 9 is in 2); batch 0's answer may
    # have been lost with its process, and then it is the one in hand.
    assert re.search(
        r"worker 0 .* loading batch (0 \(sample indices \[0, 1, 2, 3\]|2 \(sample indices \[8, 9, 10, 11\])", text
    ), text
    with pytest.raises(WorkerDiedError, match="was lost"):  # (the same error, at once)
        next(it)


def test_an_actor_killed_with_ray_kill_mid_epoch_is_reported_never_a_hang(local_ray):
    loader = DataLoader(Augmented(), batch_size=2, num_workers=2, worker_method="ray", persistent_workers=True)
    it = iter(loader)
    next(it)
    victim = loader._persistent.executor._pool.workers[1]  # (the loader's own workers, kept: persistent_workers)
    local_ray.kill(victim.actor, no_restart=True)
    with pytest.raises(WorkerDiedError, match=r"worker 1 \(Ray actor, pid \d+ on node .*was lost"):
        for _ in it:
            pass


def test_an_iterable_dataset_yields_what_worker_processes_yield():
    stream = conveyor.ShardedIterable(list(range(30)))
    kwargs = dict(batch_size=4, num_workers=2, seed=9)
    expected = [batch.tolist() for batch in DataLoader(stream, **kwargs)]
    assert [batch.tolist() for batch in DataLoader(stream, worker_method="ray", **kwargs)] == expected


def test_timeout_makes_a_late_batch_an_error_naming_it(tmp_path):
    # (timeout counts the actor's start too, as torch's counts a worker's: the first next() waits
    # until the actor has run its worker_init_fn, so that the timeout has only batches to wait for;
    # 10 s leaves room for a busy two-core machine, and the late sample takes far longer)
    started = tmp_path / "started"
    loader = DataLoader(
        Stuck(),
        batch_size=2,
        num_workers=1,
        worker_method="ray",
        timeout=10,
        worker_init_fn=partial(touch, str(started)),
    )
    it = iter(loader)
    procutil.wait_for(started.exists, 120.0, "the actor's worker_init_fn")
    assert [next(it).tolist() for _ in range(2)] == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match=r"timed out after 10 seconds") as late:
        next(it)
    assert "batch 2" in str(late.value) and "[4, 5]" in str(late.value)


def test_batches_are_writable_unless_the_stores_own_arrays_are_asked_for():
    """By default a batch's arrays may be written, as a local worker's;
    RayWorkers(writable=False) hands out the object store's own (no copy),
    read-only, with the same values."""
    kwargs = dict(batch_size=4, shuffle=True, seed=5, num_workers=2)
    copied = [batch["x"] for batch in DataLoader(Augmented(), worker_method="ray", **kwargs)]
    shared = [batch["x"] for batch in DataLoader(Augmented(), worker_method=RayWorkers(writable=False), **kwargs)]
    assert len(copied) == len(shared) == 6
    assert all(x.flags.writeable for x in copied)
    assert not any(x.flags.writeable for x in shared)
    assert all(np.array_equal(a, b) for a, b in zip(copied, shared))


def test_stats_and_trace_count_the_ray_workers_batches(tmp_path):
    loader = DataLoader(Augmented(), batch_size=4, num_workers=2, worker_method="ray")
    with loader.trace(tmp_path / "trace.json"):
        assert len(rows(loader)) == 6
    stats = loader.stats()
    assert stats.batches == 6 and stats.samples == 24 and stats.num_workers == 2 and stats.worker_method == "ray"
    assert 0.0 <= stats.workers_busy_fraction <= 1.0 and 0.0 <= stats.data_wait_fraction <= 1.0
    stats.text()  # (the table and verdict render)
    trace = json.loads((tmp_path / "trace.json").read_text())
    lanes = {
        event["args"]["name"].split(" (")[0] for event in trace["traceEvents"] if event.get("name") == "process_name"
    }
    assert {"worker 0", "worker 1"} <= lanes
    assert sum(event.get("name") == "fetch" for event in trace["traceEvents"]) == 6


def test_with_restart_lost_the_epoch_completes_with_the_same_batches(tmp_path):
    kwargs = dict(batch_size=4, shuffle=True, seed=3, num_workers=2)
    expected = reference(Augmented(), **kwargs)
    loader = DataLoader(KilledOnce(9, str(tmp_path / "killed")), worker_method=RayWorkers(restart_lost=1), **kwargs)
    assert rows(loader) == expected
    assert os.path.exists(tmp_path / "killed")


def test_a_worker_ray_cannot_place_fails_naming_what_it_asked_for():
    options = RayWorkers(resources={"no_such_node": 1}, start_timeout=5)
    loader = DataLoader(Augmented(), batch_size=4, num_workers=1, worker_method=options)
    with pytest.raises(WorkerDiedError, match="no_such_node") as failed:
        rows(loader)
    assert "start_timeout" in str(failed.value)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (
            lambda: DataLoader(Augmented(), num_workers=2, worker_method="Ray"),
            ValueError,
            "worker_method must be one of",
        ),
        (lambda: RayWorkers(num_cpus="two"), ValueError, "num_cpus"),
        (lambda: RayWorkers(resources=["cpu_node"]), TypeError, "resources"),
        (lambda: RayWorkers(scheduling_strategy="PACK"), ValueError, "SPREAD"),
        (lambda: RayWorkers(restart_lost=-1), ValueError, "restart_lost"),
        (lambda: RayWorkers(writable="no"), TypeError, "writable"),
        (
            lambda: DataLoader(Augmented(), num_workers=2, worker_method="ray", multiprocessing_context="spawn"),
            ValueError,
            "drop one of them",
        ),
    ],
)
def test_mistakes_fail_at_construction_naming_the_fix(make, error, words):
    with pytest.raises(error, match=words):
        make()
