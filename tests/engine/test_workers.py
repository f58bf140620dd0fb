"""num_workers > 0 (issue 3, items 1-6, 8, 9): every start method gives the same
batches, prefetch bounds the work in flight, in_order / as-ready delivery,
persistent workers, worker_init_fn and get_worker_info, seeding that makes
batches independent of the worker count, iterable datasets interleaved as torch
does, pin_memory without CUDA, and parity with torch.utils.data.

Failures of workers (item 7) are tested in test_worker_failures.py.

Datasets sent to spawn or forkserver workers are built by ``make_*`` factories:
a class defined inside a function travels by value (cloudpickle), so those
workers never import this module, which imports torch (about 1.7 s a worker).
Under fork, module-level classes are simply inherited.
"""

import functools
import json
import multiprocessing
import os
import pickle
import random
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct

pytestmark = [
    pytest.mark.timeout(60),
    # Some tests run more workers than a small CI machine has cores, on purpose.
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

LOADERS = {"numpy": conveyor.DataLoader, "torch": ct.DataLoader}

#: How long a test waits for something that must happen soon (a worker to
#: fetch, a gate to open) before it gives up; generous, never asserted.
PATIENCE_S = 10.0


@pytest.fixture(params=sorted(LOADERS))
def Loader(request):
    """conveyor.DataLoader (numpy batches) and conveyor.torch.DataLoader (tensors)."""
    return LOADERS[request.param]


# ----------------------------------------------------------------- helpers
def plain(batch):
    """A batch as nested plain values that keep every container type and every
    leaf's kind, dtype, shape and bytes, so ``==`` means bitwise identical."""
    if isinstance(batch, torch.Tensor):
        return ("Tensor", str(batch.dtype), tuple(batch.shape), batch.numpy().tobytes())
    if isinstance(batch, np.ndarray):
        return ("ndarray", str(batch.dtype), batch.shape, batch.tobytes())
    if isinstance(batch, dict):
        return ("dict", {key: plain(value) for key, value in batch.items()})
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, [plain(value) for value in batch])
    return (type(batch).__name__, batch)


def values(batch):
    """A batch's leaves as Python lists and numbers (to compare numpy with torch)."""
    if isinstance(batch, (torch.Tensor, np.ndarray)):
        return batch.tolist()
    if isinstance(batch, dict):
        return {key: values(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [values(value) for value in batch]
    return batch


def leaf_types(batch):
    """The set of types of a batch's leaves."""
    if isinstance(batch, dict):
        return set().union(*(leaf_types(v) for v in batch.values()))
    if isinstance(batch, (list, tuple)):
        return set().union(*(leaf_types(v) for v in batch))
    return {type(batch)}


def append_line(path, text):
    """Append one line to ``path``; O_APPEND makes one small write atomic, so
    several processes can log to one file."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def read_lines(path):
    try:
        with open(path) as f:
            return [line.split() for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def wait_until(predicate, what):
    deadline = time.monotonic() + PATIENCE_S
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def run_python(args, cwd, timeout_s=45):
    """Run ``python args...`` in a fresh interpreter; return its stdout parsed as JSON."""
    done = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"exit code {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- datasets
def make_records(n):
    """Map-style samples with dict, tuple, string and array leaves (travels by value)."""

    class Records:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"x": np.full(3, i, dtype=np.float32), "pair": (i, i / 2), "name": f"s{i}"}

    return Records()


class Logged:
    """Sample ``i`` is ``i``; each fetch appends ``i`` to ``log``. Indices in
    ``slow`` wait until the file ``gate`` exists (at most PATIENCE_S, so a
    wrong engine fails the test instead of hanging it)."""

    def __init__(self, n, log, gate=None, slow=(), delay_s=0.0):
        self.n, self.log, self.gate, self.slow, self.delay_s = n, str(log), gate and str(gate), set(slow), delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        append_line(self.log, str(i))
        if i in self.slow:
            if self.gate is not None:
                deadline = time.monotonic() + PATIENCE_S
                while not os.path.exists(self.gate) and time.monotonic() < deadline:
                    time.sleep(0.005)
            time.sleep(self.delay_s)
        return i


class WithPid:
    """Sample ``i`` is ``{"i": i, "pid": <pid of the process that loaded it>}``."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"i": i, "pid": os.getpid()}


class Draws:
    """Sample ``i`` holds one draw of each global generator (and the loading
    pid unless ``with_pid=False``, for comparing runs)."""

    def __init__(self, n, with_pid=True):
        self.n, self.with_pid = n, with_pid

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "i": i,
            "random": random.random(),
            "numpy": float(np.random.random()),
            "torch": float(torch.rand(()).item()),
            "pid": os.getpid() if self.with_pid else 0,
        }


class Augmented:
    """A pipeline with random augmentations drawn from all three generators."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = np.arange(4, dtype=np.float32) + i
        x = x + np.random.normal(size=4).astype(np.float32)  # noise
        x = x * torch.empty(4).uniform_(0.5, 1.5).numpy()  # per-element scale
        if random.random() < 0.5:  # flip
            x = x[::-1].copy()
        return {"x": x, "crop": random.randint(0, 10), "label": int(np.random.randint(0, 3))}


class Shards(tud.IterableDataset):
    """Worker ``w`` of a loader yields ``sizes[w]`` items ``100*w, 100*w + 1, ...``;
    the main process yields ``sizes[0]`` items. ``get_info`` is the function the
    dataset asks (conveyor's or torch's get_worker_info)."""

    def __init__(self, sizes, get_info):
        self.sizes, self.get_info = sizes, get_info

    def __iter__(self):
        info = self.get_info()
        wid = 0 if info is None else info.id
        return iter(range(100 * wid, 100 * wid + self.sizes[wid]))


class Strided(tud.IterableDataset):
    """The usual sharding: worker ``w`` of ``N`` takes items ``w, w + N, ...``."""

    def __init__(self, n, get_info):
        self.n, self.get_info = n, get_info

    def __iter__(self):
        info = self.get_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class Whole(tud.IterableDataset):
    """Not sharded: every worker's copy yields everything (as in torch)."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


# ========================================================== 1. start methods
START_METHODS = [None, "fork", "spawn", "forkserver", multiprocessing.get_context("spawn")]
START_IDS = ["default", "fork", "spawn", "forkserver", "spawn-context-object"]


@pytest.mark.timeout(40)
@pytest.mark.parametrize("context", START_METHODS, ids=START_IDS)
def test_every_start_method_gives_the_same_batches(Loader, context):
    dataset = make_records(10)
    settings = dict(batch_size=3, shuffle=True, seed=5)
    expected = [plain(b) for b in Loader(dataset, **settings)]
    loader = Loader(dataset, num_workers=2, multiprocessing_context=context, **settings)
    batches = list(loader)
    assert [plain(b) for b in batches] == expected
    leaf = torch.Tensor if Loader is ct.DataLoader else np.ndarray
    assert leaf_types(batches[0]["x"]) == {leaf}


def make_arrays(n, size):
    """Samples with a sizeable array each (travels by value)."""

    class Arrays:
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"x": np.arange(size, dtype=np.float64) + i, "i": i}

    return Arrays()


@pytest.mark.timeout(30)
def test_batches_kept_by_the_loop_stay_intact(Loader):
    """The loop may keep every batch, or only a view into one, for as long as
    it likes: later batches must never overwrite them."""
    dataset = make_arrays(24, 5000)
    kept = list(Loader(dataset, batch_size=2, num_workers=2))
    views = [b["x"][1] for b in Loader(dataset, batch_size=2, num_workers=2)]  # the batch itself is dropped
    expected = [plain(b) for b in Loader(dataset, batch_size=2)]
    assert [plain(b) for b in kept] == expected
    for k, view in enumerate(views):
        assert np.array_equal(np.asarray(view), np.arange(5000) + 2 * k + 1), f"view into batch {k}"


NO_TORCH_SCRIPT = """
import json, os, sys
import conveyor

class WhoLoadedTorch:
    def __len__(self):
        return 4

    def __getitem__(self, i):
        # (and whether the worker imported conveyor's parts it does not run: the loader, stats, mixing, stores)
        parts = ("conveyor.loader", "conveyor.stats", "conveyor.mix", "conveyor.store")
        unused = [m for m in parts if m in sys.modules]
        return {"torch_loaded": "torch" in sys.modules, "pid": os.getpid(), "unused": len(unused)}

if __name__ == "__main__":
    report = {"main_pid": os.getpid()}
    for method in ("spawn", "forkserver"):
        loader = conveyor.DataLoader(WhoLoadedTorch(), batch_size=1, num_workers=2, multiprocessing_context=method)
        batches = list(loader)
        report[method] = {
            "torch_loaded": [bool(b["torch_loaded"][0]) for b in batches],
            "pids": sorted({int(b["pid"][0]) for b in batches}),
            "unused": [int(b["unused"][0]) for b in batches],
        }
    report["main_torch_loaded"] = "torch" in sys.modules
    print(json.dumps(report))
"""


@pytest.mark.timeout(45)
def test_numpy_dataset_under_spawn_imports_torch_in_no_process(tmp_path):
    # (nor, under spawn, the parts of conveyor a worker does not run: `import conveyor` imports its names
    # when first used, so a spawn worker starts in about two thirds of the time)
    script = tmp_path / "no_torch.py"
    script.write_text(NO_TORCH_SCRIPT)
    report = run_python([str(script)], cwd=tmp_path)
    assert report["main_torch_loaded"] is False
    for method in ("spawn", "forkserver"):
        assert report[method]["torch_loaded"] == [False] * 4, method
        assert report["main_pid"] not in report[method]["pids"], "batches must come from workers"
    assert report["spawn"]["unused"] == [0] * 4


USER_CODE = """
import json
import conveyor

class Squares(conveyor.Dataset):
    def __init__(self, n):
        self.n, self.bonus = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * i + self.bonus

def init_worker(worker_id):
    conveyor.get_worker_info().dataset.bonus = 1000

def as_ints(samples):
    return [int(s) for s in samples]

if __name__ == "__main__":
    report = {}
    for method in ("spawn", "forkserver"):
        named = conveyor.DataLoader(
            Squares(6), batch_size=2, num_workers=2, multiprocessing_context=method,
            worker_init_fn=init_worker, collate_fn=as_ints,
        )
        lambdas = conveyor.DataLoader(
            Squares(6), batch_size=2, num_workers=2, multiprocessing_context=method,
            worker_init_fn=lambda worker_id: setattr(conveyor.get_worker_info().dataset, "bonus", 2000),
            collate_fn=lambda samples: [int(s) + 1 for s in samples],
        )
        report[method] = {"named": list(named), "lambdas": list(lambdas)}
    print(json.dumps(report))
"""


@pytest.mark.timeout(50)
@pytest.mark.parametrize("how", ["script", "python -c"])
def test_objects_defined_in_main_work_under_spawn_and_forkserver(tmp_path, how):
    """A dataset class, collate_fn and worker_init_fn from ``__main__`` (a
    script, or ``python -c`` code that has no file), named or lambdas."""
    if how == "script":
        (tmp_path / "train.py").write_text(USER_CODE)
        report = run_python(["train.py"], cwd=tmp_path)
    else:
        report = run_python(["-c", USER_CODE], cwd=tmp_path)
    for method in ("spawn", "forkserver"):
        assert report[method]["named"] == [[1000, 1001], [1004, 1009], [1016, 1025]], method
        assert report[method]["lambdas"] == [[2001, 2002], [2005, 2010], [2017, 2026]], method


class Transformed:
    """A dataset holding a function (here a lambda) applied to each sample."""

    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.transform(i)


def make_transformed(n, transform):
    """Like ``Transformed``, travelling by value (workers need not import this
    module), plus a ``bonus`` that a worker_init_fn may set."""

    class LocalTransformed:
        bonus = 0

        def __len__(self):
            return n

        def __getitem__(self, i):
            return transform(i) + self.bonus

    return LocalTransformed()


@pytest.mark.timeout(40)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_lambdas_work_under_spawn_and_forkserver(method):
    loader = conveyor.DataLoader(
        make_transformed(6, lambda i: i * 10),
        batch_size=2,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=lambda worker_id: setattr(conveyor.get_worker_info().dataset, "bonus", 1000),
        collate_fn=lambda samples: [s + 1 for s in samples],
    )
    assert list(loader) == [[1001, 1011], [1021, 1031], [1041, 1051]]


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_torch_cannot_pickle_the_same_lambda_under_spawn():
    """Why conveyor cloudpickles: torch.utils.data fails on a lambda under spawn
    (before starting any worker), where conveyor works."""
    loader = tud.DataLoader(
        Transformed(6, lambda i: i * 10), batch_size=2, num_workers=1, multiprocessing_context="spawn"
    )
    with pytest.raises((AttributeError, pickle.PicklingError, TypeError), match="[Pp]ickle.*lambda"):
        iter(loader)


# ===================================================== 2. prefetch and order
@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch_factor", [1, 3])
def test_prefetch_factor_bounds_the_batches_in_flight(tmp_path, Loader, prefetch_factor):
    """Holding batch k, the loop never has a sample of a batch past k +
    prefetch_factor × num_workers loaded (torch's bound), and the workers do
    fill that window."""
    log = tmp_path / "fetched"
    num_workers = 2
    limit = prefetch_factor * num_workers
    loader = Loader(Logged(20, log), batch_size=1, num_workers=num_workers, prefetch_factor=prefetch_factor)
    delivered = []
    for k, batch in enumerate(loader):
        delivered.append(int(batch[0]))
        if k == 0:
            # While the loop holds batch 0 the workers fill the window, and no further.
            wait_until(lambda: len(read_lines(log)) >= limit, f"{limit} batches to be prefetched")
            time.sleep(0.2)  # room for an overshoot to show
        fetched = [int(line[0]) for line in read_lines(log)]
        assert max(fetched) <= k + limit, f"holding batch {k}, the workers already loaded {sorted(fetched)}"
    assert delivered == list(range(20))
    assert sorted(int(line[0]) for line in read_lines(log)) == list(range(20)), "each sample loaded once"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("prefetch_factor", [None, 2])
def test_small_batches_run_further_ahead_only_when_prefetch_factor_is_left_to_conveyor(
    tmp_path, Loader, prefetch_factor
):
    """Tiny batches cost their round trip, not memory: with prefetch_factor
    left out, once a few batches showed they are small the workers may run
    up to 16 batches each ahead; a prefetch_factor the user gives is kept
    exactly, as torch's bound."""
    log = tmp_path / "fetched"
    loader = Loader(Logged(200, log), batch_size=1, num_workers=2, prefetch_factor=prefetch_factor)
    ahead = []
    for k, batch in enumerate(loader):
        if k == 20:
            if prefetch_factor is None:
                wait_until(lambda: len(read_lines(log)) > 20 + 2 * 2, "the workers to run past torch's bound")
            time.sleep(0.3)  # room for the window to fill
            ahead.append(max(int(line[0]) for line in read_lines(log)) - k)
    assert int(batch[0]) == 199
    bound = 2 * (16 if prefetch_factor is None else prefetch_factor)
    assert ahead[0] <= bound
    if prefetch_factor is None:
        assert ahead[0] > 2 * 2


@pytest.mark.timeout(30)
def test_in_order_delivers_in_sampler_order_despite_a_slow_sample(tmp_path, Loader):
    settings = dict(batch_size=2, shuffle=True, seed=3)
    dataset = Logged(12, tmp_path / "log", slow={7, 2}, delay_s=0.2)
    expected = [values(b) for b in Loader(dataset, **settings)]
    got = [values(b) for b in Loader(dataset, num_workers=2, in_order=True, **settings)]
    assert got == expected


@pytest.mark.timeout(30)
def test_out_of_order_delivers_other_batches_while_one_is_slow(tmp_path, Loader):
    """Batch 0 blocks until the loop has received three other batches: only a
    loader that delivers as ready and hands work to the free worker gets there."""
    gate = tmp_path / "gate"
    dataset = Logged(12, tmp_path / "log", gate=gate, slow={0})
    loader = Loader(dataset, batch_size=1, num_workers=2, in_order=False)
    order = []
    for batch in loader:
        order.append(int(batch[0]))
        if len(order) == 3:
            gate.touch()
    assert 0 not in order[:3], f"the slow batch held up the others: {order}"
    assert sorted(order) == list(range(12)), f"every batch exactly once: {order}"


class GatedHalves(tud.IterableDataset):
    """Worker w yields (w, i) for its half of 0..9; worker 1's first item
    waits until ``gate`` exists."""

    def __init__(self, gate):
        self.gate = str(gate)

    def __iter__(self):
        info = tud.get_worker_info()
        for i in range(info.id * 5, info.id * 5 + 5):
            while info.id == 1 and i == 5 and not os.path.exists(self.gate):
                time.sleep(0.01)
            yield info.id, i


@pytest.mark.timeout(60)
def test_out_of_order_iterable_hands_batches_to_workers_with_room_as_torch(tmp_path):
    """With in_order=False, torch skips a worker whose share of the window
    is in hand; so does conveyor: worker 0 delivers all its items while
    worker 1 is stuck (strict round robin would fill the window with
    worker 1's tasks and wait)."""
    gate = tmp_path / "gate"
    loader = ct.DataLoader(GatedHalves(gate), num_workers=2, in_order=False, timeout=30)
    it = iter(loader)
    first = [tuple(int(v) for v in next(it)) for _ in range(5)]
    gate.touch()
    rest = [tuple(int(v) for v in b) for b in it]
    assert first == [(0, i) for i in range(5)]
    assert rest == [(1, i) for i in range(5, 10)]


# ================================================== 3. persistent workers
@pytest.mark.timeout(30)
def test_persistent_workers_serve_every_epoch_with_the_same_processes(Loader):
    loader = Loader(WithPid(8), batch_size=2, num_workers=2, persistent_workers=True)
    pids_by_epoch = []
    for _ in range(3):
        batches = list(loader)
        assert [values(b["i"]) for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]
        pids_by_epoch.append({p for b in batches for p in values(b["pid"])})
    assert pids_by_epoch[0] == pids_by_epoch[1] == pids_by_epoch[2]
    assert len(pids_by_epoch[0]) == 2 and os.getpid() not in pids_by_epoch[0]


@pytest.mark.timeout(40)
def test_persistent_workers_honour_epochs_and_the_seed(Loader):
    """Each epoch shuffles (and draws) anew, exactly as a fresh loader with the
    same seed set to that epoch."""
    settings = dict(batch_size=3, shuffle=True, seed=11, num_workers=2)
    persistent = Loader(Draws(12, with_pid=False), persistent_workers=True, **settings)
    epochs = [0, 1, 5]
    runs = [plain(list(persistent)), plain(list(persistent))]
    persistent.set_epoch(5)
    runs.append(plain(list(persistent)))
    for epoch, got in zip(epochs, runs):
        fresh = Loader(Draws(12, with_pid=False), **settings)
        fresh.set_epoch(epoch)
        assert plain(list(fresh)) == got, f"epoch {epoch}"
    orders = [[b[1]["i"] for b in run[1]] for run in runs]
    assert orders[0] != orders[1] and orders[1] != orders[2], "each epoch shuffles anew"


@pytest.mark.timeout(30)
def test_persistent_workers_restart_an_iterable_dataset_each_epoch(Loader):
    """Every epoch iterates each worker's copy afresh, interleaved as torch's
    persistent workers do (the round robin starts again at worker 0)."""
    theirs = tud.DataLoader(Shards([5, 3], tud.get_worker_info), batch_size=2, num_workers=2, persistent_workers=True)
    ours = Loader(Shards([5, 3], conveyor.get_worker_info), batch_size=2, num_workers=2, persistent_workers=True)
    for epoch in range(3):
        assert [values(b) for b in ours] == [values(b) for b in theirs], f"epoch {epoch}"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["map", "iterable"])
def test_persistent_workers_recover_from_an_abandoned_epoch(Loader, kind):
    """A ``break`` leaves batches in flight; the next epoch must not see them."""
    dataset = list(range(10)) if kind == "map" else Strided(10, conveyor.get_worker_info)
    loader = Loader(dataset, batch_size=2, num_workers=2, persistent_workers=True)
    expected = [values(b) for b in Loader(dataset, batch_size=2, num_workers=2)]
    for batch in loader:
        break
    assert [values(b) for b in loader] == expected
    assert [values(b) for b in loader] == expected


# =========================================== 4. worker_init_fn, get_worker_info
def log_worker_init(path, worker_id):
    append_line(path, f"{worker_id} {os.getpid()}")


@pytest.mark.timeout(30)
def test_worker_init_fn_runs_once_in_each_worker_with_its_id(tmp_path, Loader):
    log = tmp_path / "init"
    loader = Loader(
        WithPid(12),
        batch_size=1,
        num_workers=3,
        persistent_workers=True,
        worker_init_fn=functools.partial(log_worker_init, str(log)),
    )
    served = {p for _ in range(2) for b in loader for p in values(b["pid"])}
    calls = read_lines(log)
    assert sorted(int(wid) for wid, _ in calls) == [0, 1, 2]
    init_pids = {int(pid) for _, pid in calls}
    assert len(init_pids) == 3 and os.getpid() not in init_pids
    assert served <= init_pids


class InfoProbe:
    """Each sample reports what get_worker_info() says in the process loading it."""

    def __len__(self):
        return 9

    def __getitem__(self, i):
        info = conveyor.get_worker_info()
        try:
            info.id = 99
            frozen = False
        except AttributeError:  # dataclasses.FrozenInstanceError, as torch 2.13's WorkerInfo
            frozen = True
        return {
            "pid": os.getpid(),
            "id": info.id,
            "num_workers": info.num_workers,
            "seed": info.seed,
            "dataset_is_own_copy": info.dataset is self,
            "type": type(info).__name__,
            "frozen": frozen,
            "repr_has_torch_fields": all(
                f"{k}=" in repr(info) for k in ("id", "num_workers", "seed", "dataset", "rng")
            ),
        }


@pytest.mark.timeout(30)
def test_get_worker_info_describes_the_worker_inside_and_is_none_outside(Loader):
    assert conveyor.get_worker_info() is None
    assert ct.get_worker_info is conveyor.get_worker_info
    samples = [values(b) for b in Loader(InfoProbe(), batch_size=None, num_workers=3, seed=9)]
    assert conveyor.get_worker_info() is None
    id_by_pid = {}
    for s in samples:
        assert id_by_pid.setdefault(s["pid"], s["id"]) == s["id"], "one id per worker"
        assert s["num_workers"] == 3 and s["dataset_is_own_copy"] and s["frozen"]
        assert s["type"] == "WorkerInfo" and s["repr_has_torch_fields"]
        # As torch: each worker's seed is the epoch's base seed plus its id.
        assert s["seed"] == (conveyor.derive_seed(9, 0) + s["id"]) & ((1 << 63) - 1)
    assert sorted(id_by_pid.values()) == [0, 1, 2]


class TorchInfoProbe:
    """A dataset written for torch: it asks torch.utils.data.get_worker_info()."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        info = tud.get_worker_info()
        return {"id": -1 if info is None else info.id, "num_workers": 0 if info is None else info.num_workers}


@pytest.mark.timeout(30)
def test_torch_get_worker_info_is_answered_inside_conveyor_workers(Loader):
    samples = [values(b) for b in Loader(TorchInfoProbe(), batch_size=None, num_workers=2)]
    assert {s["id"] for s in samples} == {0, 1}
    assert {s["num_workers"] for s in samples} == {2}
    assert tud.get_worker_info() is None


def make_lazy_torch_dataset(n):
    """A dataset that imports torch only inside ``__getitem__``, as libraries
    supporting several frameworks do (travels by value: no torch at unpickling)."""

    class LazyTorch:
        def __len__(self):
            return n

        def __getitem__(self, i):
            import torch.utils.data  # binds a local name: nothing refers to a global torch

            info = torch.utils.data.get_worker_info()
            return {
                "i": i,
                "torch_worker_id": -1 if info is None else info.id,
                "draw": torch.rand(()).item(),
                "pid": os.getpid(),
            }

    return LazyTorch()


@pytest.mark.timeout(45)
def test_dataset_importing_torch_lazily_under_spawn_gets_worker_info_and_seeds():
    """When a worker imports torch only while loading its first batch,
    torch.utils.data.get_worker_info() must still answer and torch's generator
    must still be seeded for that batch (else each worker's first batch draws
    from torch's unseeded generator, and sharded datasets load everything twice)."""
    dataset = make_lazy_torch_dataset(4)
    expected = [values(b) for b in conveyor.DataLoader(dataset, batch_size=None, seed=2)]
    got = [
        values(b)
        for b in conveyor.DataLoader(dataset, batch_size=None, seed=2, num_workers=2, multiprocessing_context="spawn")
    ]
    assert len({s["pid"] for s in got}) == 2
    assert [s["torch_worker_id"] for s in got if s["torch_worker_id"] == -1] == [], (
        f"torch.utils.data.get_worker_info() returned None in a conveyor worker: {got}"
    )
    assert [s["draw"] for s in got] == [s["draw"] for s in expected], (
        f"torch draws differ from num_workers=0: {got} vs {expected}"
    )


# ================================================================ 5. randomness
def log_init_draws(path, worker_id):
    append_line(path, f"{worker_id} {random.random()!r} {np.random.random()!r} {torch.rand(()).item()!r}")


@pytest.mark.timeout(30)
def test_workers_draw_different_numbers(tmp_path, Loader):
    log = tmp_path / "init_draws"
    loader = Loader(Draws(8), batch_size=1, num_workers=2, worker_init_fn=functools.partial(log_init_draws, str(log)))
    samples = [values(b) for b in loader]
    assert len({s["pid"][0] for s in samples}) == 2
    for generator in ("random", "numpy", "torch"):
        draws = [s[generator][0] for s in samples]
        assert len(set(draws)) == len(draws), f"{generator}: the same numbers twice: {draws}"
    init_draws = read_lines(log)
    assert len(init_draws) == 2
    for column in (1, 2, 3):  # in worker_init_fn too, each worker draws its own numbers
        assert init_draws[0][column] != init_draws[1][column]


@pytest.mark.timeout(40)
def test_draws_are_reproducible_from_seed(Loader):
    def run(seed):
        return [
            plain(b) for b in Loader(Draws(8, with_pid=False), batch_size=2, shuffle=True, num_workers=2, seed=seed)
        ]

    first = run(3)
    assert run(3) == first
    assert run(4) != first


@pytest.mark.timeout(40)
def test_draws_are_reproducible_from_a_torch_generator():
    def run(seed):
        generator = torch.Generator().manual_seed(seed)
        loader = ct.DataLoader(Draws(8, with_pid=False), batch_size=2, shuffle=True, num_workers=2, generator=generator)
        return [plain(b) for b in loader]

    first = run(3)
    assert run(3) == first
    assert run(4) != first


@pytest.mark.timeout(40)
def test_augmentations_are_bitwise_identical_for_any_number_of_workers(Loader):
    """conveyor reseeds every generator for each batch from (seed, epoch, batch
    index), so the worker that loads a batch does not matter."""

    def two_epochs(num_workers):
        loader = Loader(Augmented(14), batch_size=3, shuffle=True, seed=21, num_workers=num_workers)
        return [[plain(b) for b in loader] for _ in range(2)]

    expected = two_epochs(0)
    assert expected[0] != expected[1], "each epoch draws anew"
    for num_workers in (1, 2, 4):
        assert two_epochs(num_workers) == expected, f"num_workers={num_workers}"


# ======================================================== 6. iterable datasets
ITERABLE_CASES = {
    "each-worker-its-own-copy": (lambda get_info: Whole(7), dict(batch_size=2), 2),
    "strided": (lambda get_info: Strided(20, get_info), dict(batch_size=3), 2),
    "uneven": (lambda get_info: Shards([7, 2], get_info), dict(batch_size=2), 2),
    "uneven-3-workers-one-empty": (lambda get_info: Shards([5, 0, 9], get_info), dict(batch_size=2), 3),
    "uneven-3-workers": (lambda get_info: Shards([1, 6, 3], get_info), dict(batch_size=2), 3),
    # Once a worker retires, the others keep their turns in the round robin.
    "retired-worker-keeps-turns": (lambda get_info: Shards([9, 3, 8], get_info), dict(batch_size=2), 3),
    "first-of-4-workers-empty": (lambda get_info: Shards([0, 9, 7, 5], get_info), dict(batch_size=1), 4),
    "drop-last": (lambda get_info: Shards([7, 4], get_info), dict(batch_size=3, drop_last=True), 2),
    "batch-size-none": (lambda get_info: Shards([3, 5], get_info), dict(batch_size=None), 2),
}


def torch_batches(dataset, num_workers, **settings):
    return list(tud.DataLoader(dataset, num_workers=num_workers, **settings))


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(ITERABLE_CASES))
def test_iterable_dataset_batches_interleave_as_in_torch(case):
    make, settings, num_workers = ITERABLE_CASES[case]
    expected = torch_batches(make(tud.get_worker_info), num_workers, **settings)
    got = list(ct.DataLoader(make(conveyor.get_worker_info), num_workers=num_workers, **settings))
    assert [plain(b) for b in got] == [plain(b) for b in expected]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", ["strided", "uneven-3-workers-one-empty", "drop-last", "batch-size-none"])
def test_iterable_dataset_sharded_with_torch_get_worker_info_under_numpy_loader(case):
    """A dataset written for torch (asking torch's get_worker_info) under the
    numpy loader: the same values as torch.utils.data."""
    make, settings, num_workers = ITERABLE_CASES[case]
    expected = torch_batches(make(tud.get_worker_info), num_workers, **settings)
    got = list(conveyor.DataLoader(make(tud.get_worker_info), num_workers=num_workers, **settings))
    assert [values(b) for b in got] == [values(b) for b in expected]
    if settings["batch_size"] is not None:
        assert all(isinstance(b, np.ndarray) for b in got)


# ============================================================ 8. pin_memory
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
@pytest.mark.timeout(30)
@pytest.mark.parametrize("persistent_workers", [False, True])
def test_pin_memory_without_cuda_warns_once_per_iterator_and_still_loads(Loader, persistent_workers):
    dataset = make_records(6)
    expected = [plain(b) for b in Loader(dataset, batch_size=2)]
    loader = Loader(dataset, batch_size=2, num_workers=2, pin_memory=True, persistent_workers=persistent_workers)
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = [plain(b) for b in loader]
        pin_warnings = [w for w in caught if "pin_memory" in str(w.message)]
        assert len(pin_warnings) == 1, [str(w.message) for w in caught]
        assert batches == expected


# ================================================================ 9. parity
class Mixed:
    """Deterministic map-style samples with dict, tuple, tensor, array, number and string leaves."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return {
            "x": torch.full((2,), float(i)),
            "a": np.arange(3, dtype=np.int16) * i,
            "label": i % 3,
            "weight": i / 4,
            "pair": (np.float32(i) / 3, torch.tensor([i, -i])),
            "name": f"s{i}",
        }


@pytest.mark.timeout(40)
@pytest.mark.parametrize("settings", [dict(batch_size=3), dict(batch_size=4, drop_last=True), dict(batch_size=None)])
def test_parity_with_torch_under_a_seeded_generator(settings):
    torch_generator, our_generator = torch.Generator().manual_seed(1234), torch.Generator().manual_seed(1234)
    theirs = tud.DataLoader(Mixed(), shuffle=True, num_workers=2, generator=torch_generator, **settings)
    ours = ct.DataLoader(Mixed(), shuffle=True, num_workers=2, in_order=True, generator=our_generator, **settings)
    for epoch in range(2):
        assert [plain(b) for b in ours] == [plain(b) for b in theirs], f"epoch {epoch}"
    assert torch.equal(our_generator.get_state(), torch_generator.get_state()), "the generator advanced differently"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("draws_from", ["generator", "torch.manual_seed"])
def test_parity_with_torch_with_persistent_workers_over_epochs(draws_from):
    """torch draws a base seed only for a persistent loader's first
    iteration; so does conveyor, so later epochs' shuffles match too."""

    def epochs(module):
        options = dict(batch_size=5, shuffle=True, num_workers=2, persistent_workers=True)
        if draws_from == "generator":
            options["generator"] = torch.Generator().manual_seed(0)
        else:
            torch.manual_seed(0)
        loader = module.DataLoader(Mixed(), **options)
        return [[plain(b) for b in loader] for _ in range(3)]

    assert epochs(ct) == epochs(tud)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "workers",
    [
        {},
        {"num_workers": 2},
        {"num_workers": 2, "worker_method": "thread"},
        {"num_workers": 2, "persistent_workers": True},
    ],
    ids=["in process", "processes", "threads", "persistent workers"],
)
def test_an_iterator_at_its_end_keeps_raising_stop_iteration_as_torchs(workers):
    """As torch's (and any Python iterator): a second loop over a finished
    iterator gives nothing. (With workers that were stopped at the end, it
    raised RuntimeError "this DataLoader iterator has been shut down".)"""
    torchs = {key: value for key, value in workers.items() if key != "worker_method"}  # (torch has none)
    for module, options in ((ct, workers), (tud, torchs)):
        it = iter(module.DataLoader(list(range(4)), batch_size=2, **options))
        assert len(list(it)) == 2, module.__name__
        assert list(it) == [] and next(it, "end") == "end", module.__name__


@pytest.mark.timeout(30)
def test_parity_with_torch_under_torch_manual_seed():
    """Without a generator both draw from torch's global generator, in the same order."""
    torch.manual_seed(77)
    theirs = [plain(b) for b in tud.DataLoader(Mixed(), batch_size=3, shuffle=True, num_workers=2)]
    after_theirs = torch.get_rng_state()
    torch.manual_seed(77)
    ours = [plain(b) for b in ct.DataLoader(Mixed(), batch_size=3, shuffle=True, num_workers=2)]
    assert ours == theirs
    assert torch.equal(torch.get_rng_state(), after_theirs)


class CountsInShared:
    """Counts the samples loaded in a multiprocessing Value shared with the
    main process, and checks an Event it was given."""

    def __init__(self, context):
        self.count = context.Value("i", 0)
        self.started = context.Event()
        self.started.set()

    def __len__(self):
        return 8

    def __getitem__(self, i):
        assert self.started.is_set()
        with self.count.get_lock():
            self.count.value += 1
        return i


@pytest.fixture(scope="module")
def multiprocessing_heap():
    """multiprocessing keeps one heap per process for its shared Values (an
    open file, for the life of the process): made before the tests that
    use it, so that the leak check does not count it."""
    import multiprocessing

    multiprocessing.Value("i", 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_objects_in_a_dataset_are_shared_with_the_workers_as_in_torch(method, multiprocessing_heap):
    """A Value, a Lock, an Event in a dataset reach spawn and forkserver
    workers as multiprocessing hands them to its own children (torch
    allows it): the workers' updates are seen by the main process."""
    import multiprocessing

    dataset = CountsInShared(multiprocessing.get_context(method))
    batches = [b.tolist() for b in ct.DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context=method)]
    assert batches == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert dataset.count.value == 8
