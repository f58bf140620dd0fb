"""DataLoader(worker_method="thread"): the worker loop in threads of the main
process, with the guarantees of process workers: the same batches for any
number and kind of workers, errors with their context, timeout, the stall
watchdog, exact resume, nothing left running; randomness through
conveyor.sample_rng(), the same for a sample whoever loads it."""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct
from conveyor import DataLoader

pytestmark = [pytest.mark.timeout(60), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]

#: Every kind of loading a batch can get: in the main process, processes, threads.
KINDS = [(0, "multiprocessing"), (1, "multiprocessing"), (3, "multiprocessing"), (1, "thread"), (3, "thread")]
KIND_IDS = ["in-process", "1-process", "3-processes", "1-thread", "3-threads"]


class Augmented:
    """Sample ``i``: its index, draws from the sample's own generators, and
    which worker (id, method) loaded it."""

    def __init__(self, n: int = 23):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = conveyor.sample_rng()
        draws = [
            g.random_generator.random(),
            float(g.numpy_generator.random()),
            float(torch.rand((), generator=g.torch_generator)),
        ]
        return np.array([i, *draws])


class Failing(Augmented):
    def __getitem__(self, i: int):
        if i == 5:
            raise ValueError(f"sample {i} is broken")
        return super().__getitem__(i)


class Sleepy:
    """Sample ``slow`` waits ``seconds`` (a stuck read, as far as the loader can tell)."""

    def __init__(self, n: int, slow: int, seconds: float):
        self.n, self.slow, self.seconds = n, slow, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.slow:
            time.sleep(self.seconds)
        return np.array([i])


class Shards(tud.IterableDataset):
    """An iterable dataset that shards itself with torch's get_worker_info(),
    as datasets written for torch do."""

    def __init__(self, n: int):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield np.array([i, float(conveyor.sample_rng().numpy_generator.random())])


def rows(loader) -> list:
    return [np.asarray(batch).tolist() for batch in loader]


def test_batches_are_the_same_for_every_kind_and_number_of_workers():
    expected = rows(DataLoader(Augmented(), batch_size=4, shuffle=True, seed=3))
    for num_workers, method in KINDS:
        got = rows(
            DataLoader(Augmented(), batch_size=4, shuffle=True, seed=3, num_workers=num_workers, worker_method=method)
        )
        assert got == expected, (num_workers, method)
    # Each sample drew its own numbers: no two alike.
    draws = [row[1] for batch in expected for row in batch]
    assert len(set(draws)) == len(draws)


def test_reads_in_flight_keep_every_sample_s_draws():
    expected = rows(DataLoader(Augmented(), batch_size=6, seed=4))
    got = rows(DataLoader(Augmented(), batch_size=6, seed=4, num_workers=2, worker_method="thread", reads_in_flight=3))
    assert got == expected


def test_the_loading_runs_in_threads_of_this_process_with_their_own_worker_info():
    seen = []

    class Who(Augmented):
        def __getitem__(self, i):
            info = conveyor.get_worker_info()
            torch_info = torch.utils.data.get_worker_info()
            seen.append((os.getpid(), threading.current_thread().name, info.id, info.worker_method, torch_info.id))
            return np.array([i])

    loader = DataLoader(Who(12), batch_size=2, num_workers=3, worker_method="thread")
    assert rows(loader) == [[[2 * k], [2 * k + 1]] for k in range(6)]
    assert {pid for pid, *_ in seen} == {os.getpid()}
    assert {(name, wid, method, twid) for _, name, wid, method, twid in seen} == {
        (f"conveyor-worker-{w}", w, "thread", w) for w in range(3)
    }
    assert conveyor.get_worker_info() is None and torch.utils.data.get_worker_info() is None  # (the main thread)


@pytest.mark.parametrize("num_workers", [1, 2, 3])
def test_an_iterable_dataset_sharded_by_torch_s_worker_info_gives_what_processes_give(num_workers):
    threads = rows(DataLoader(Shards(17), batch_size=3, num_workers=num_workers, worker_method="thread", seed=5))
    processes = rows(DataLoader(Shards(17), batch_size=3, num_workers=num_workers, seed=5))
    assert threads == processes
    assert sorted(row[0] for batch in threads for row in batch) == list(range(17))


def test_the_global_generators_stay_the_training_loop_s():
    class DrawsGlobally(Augmented):
        def __getitem__(self, i):
            return np.array([i, random.random()])

    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    expected = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(11)
    np.random.seed(11)
    torch.manual_seed(11)
    for _ in DataLoader(Augmented(), batch_size=4, num_workers=2, worker_method="thread", seed=1):
        pass
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == expected
    # A dataset drawing from the global generators still loads (its draws are just not reproducible).
    assert len(rows(DataLoader(DrawsGlobally(8), batch_size=4, num_workers=2, worker_method="thread"))) == 2


def test_an_error_in_getitem_names_the_thread_batch_and_indices_and_iteration_goes_on():
    loader = DataLoader(Failing(12), batch_size=2, num_workers=2, worker_method="thread")
    it = iter(loader)
    got = []
    error = None
    while True:
        try:
            got.append(np.asarray(next(it))[:, 0].tolist())
        except StopIteration:
            break
        except ValueError as exc:
            error = exc
    assert got == [[0, 1], [2, 3], [6, 7], [8, 9], [10, 11]]
    text = str(error)
    assert "sample 5 is broken" in text
    assert re.search(r"Caught ValueError in DataLoader worker thread \d", text)
    assert "worker thread" in text and "batch 2" in text and "sample indices [4, 5]" in text
    assert "in __getitem__" in text  # the original traceback
    assert error.batch_index == 2 and list(error.indices) == [4, 5]


def test_a_failing_worker_init_fn_is_reported_as_itself():
    def init(worker_id):
        if worker_id == 1:
            raise RuntimeError("no credentials for the store")

    loader = DataLoader(Augmented(), batch_size=2, num_workers=2, worker_method="thread", worker_init_fn=init)
    with pytest.raises(RuntimeError, match="no credentials for the store") as caught:
        next(iter(loader))
    assert "while starting worker thread 1" in str(caught.value)


def test_system_exit_in_a_thread_ends_the_loader_with_the_worker_s_story():
    class Exits(Augmented):
        def __getitem__(self, i):
            if i == 3:
                raise SystemExit(4)
            return np.array([i])

    loader = DataLoader(Exits(8), batch_size=2, num_workers=2, worker_method="thread")
    with pytest.raises(conveyor.WorkerDiedError, match="SystemExit was raised in DataLoader worker thread"):
        rows(loader)


def test_timeout_names_the_late_batch_and_the_thread():
    loader = DataLoader(
        Sleepy(8, slow=2, seconds=3.0), batch_size=2, num_workers=2, worker_method="thread", timeout=1.0
    )
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1.0 seconds") as caught:
        rows(loader)
    text = str(caught.value)
    assert "waiting for batch 1 (sample indices [2, 3])" in text
    assert re.search(r"worker thread \d has been loading batch 1", text)


def test_the_stall_watchdog_shows_the_thread_s_stack():
    loader = DataLoader(
        Sleepy(4, slow=0, seconds=1.0), batch_size=2, num_workers=1, worker_method="thread", stall_warning=0.2
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert rows(loader) == [[[0], [1]], [[2], [3]]]
    stalls = [w for w in caught if issubclass(w.category, conveyor.StallWarning)]
    assert stalls, [str(w.message) for w in caught]
    text = str(stalls[0].message)
    assert "worker thread 0" in text and "loading batch 0" in text
    assert "time.sleep(self.seconds)" in text  # where it was, from its live stack


@pytest.mark.parametrize("in_order", [True, False])
def test_resume_mid_epoch_gives_the_rest_of_the_uninterrupted_run(in_order):
    def loader():
        return DataLoader(
            Augmented(30), batch_size=3, shuffle=True, seed=8, num_workers=2, worker_method="thread", in_order=in_order
        )

    full = rows(loader())
    first = loader()
    it = iter(first)
    head = [np.asarray(next(it)).tolist() for _ in range(4)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    tail = rows(resumed)
    if in_order:
        assert head + tail == full
    else:
        key = lambda batch: batch[0][0]  # noqa: E731
        assert sorted(head + tail, key=key) == sorted(full, key=key)


def test_resume_of_an_iterable_dataset_across_thread_and_process_workers():
    class Counter(tud.IterableDataset):
        def __init__(self):
            self.position = 0

        def __iter__(self):
            info = conveyor.get_worker_info()
            wid, count = (0, 1) if info is None else (info.id, info.num_workers)
            for i in range(self.position, 20):
                if i % count == wid:
                    self.position = i + 1
                    yield np.array([i])

        def state_dict(self):
            return {"position": self.position}

        def load_state_dict(self, state):
            self.position = state["position"]

    def loader(method):
        return DataLoader(Counter(), batch_size=2, num_workers=2, worker_method=method)

    full = rows(loader("thread"))
    first = loader("thread")
    it = iter(first)
    head = [np.asarray(next(it)).tolist() for _ in range(3)]
    state = first.state_dict()
    del it
    for method in ("thread", "multiprocessing"):
        resumed = loader(method)
        resumed.load_state_dict(state)
        assert head + rows(resumed) == full, method


def test_persistent_thread_workers_serve_every_epoch():
    names = set()

    class Named(Augmented):
        def __getitem__(self, i):
            names.add(threading.current_thread().name)
            return np.array([i])

    loader = DataLoader(Named(6), batch_size=2, num_workers=2, worker_method="thread", persistent_workers=True)
    first = rows(loader)
    threads_then = {t.ident for t in threading.enumerate() if t.name.startswith("conveyor-worker")}
    assert rows(loader) == first
    assert {t.ident for t in threading.enumerate() if t.name.startswith("conveyor-worker")} == threads_then
    assert names == {"conveyor-worker-0", "conveyor-worker-1"}
    del loader  # (its threads end with it: the leak check looks)


def test_breaking_out_early_stops_the_threads():
    loader = DataLoader(Augmented(40), batch_size=2, num_workers=3, worker_method="thread")
    for k, _ in enumerate(loader):
        if k == 2:
            break
    # leave_nothing_behind checks that no conveyor-worker thread is left


def test_ctrl_c_while_waiting_stops_the_threads(ctrl_c_raises):
    loader = DataLoader(Sleepy(8, slow=4, seconds=1.0), batch_size=2, num_workers=2, worker_method="thread")
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            rows(loader)
    finally:
        timer.join()


def test_the_torch_facade_gives_torch_s_batches():
    dataset = tud.TensorDataset(torch.arange(20.0).reshape(10, 2), torch.arange(10))
    expected = list(tud.DataLoader(dataset, batch_size=3))
    got = list(ct.DataLoader(dataset, batch_size=3, num_workers=2, worker_method="thread"))
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert all(isinstance(t, torch.Tensor) for t in mine)
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_stats_count_the_threads_as_workers():
    loader = DataLoader(Augmented(20), batch_size=2, num_workers=2, worker_method="thread")
    rows(loader)
    stats = loader.stats()
    assert stats.batches == 10
    assert stats.to_dict()["batches"] == 10


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"worker_method": "threads"}, "worker_method must be one of"),
        ({"worker_method": "thread", "multiprocessing_context": "spawn"}, "worker_method='thread' starts none"),
    ],
)
def test_bad_worker_method_arguments_are_refused_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DataLoader(Augmented(), num_workers=2, **kwargs)


def test_sample_rng_outside_a_loader_is_fresh_and_inside_is_the_sample_s():
    a, b = conveyor.sample_rng(), conveyor.sample_rng()
    assert a is not b and a.seed != b.seed
    first = rows(DataLoader(Augmented(4), batch_size=2, seed=1))
    assert conveyor.sample_rng().seed != conveyor.sample_rng().seed  # not left on the last sample
    assert rows(DataLoader(Augmented(4), batch_size=2, seed=1)) == first
