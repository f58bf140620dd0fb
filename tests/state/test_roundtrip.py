"""Every stateful component goes through one round trip (tests/roundtrip.py):
saved at every point of its epochs, loaded into a fresh one, what follows is
what the uninterrupted run gave, the later epochs included.

The components are those with ``state_dict``/``load_state_dict`` in
src/conveyor: each sampler (with every kind of randomness it takes), a
BatchSampler over each index sampler, TokenBudgetBatchSampler and
ShardedSampler, the DataLoader (map-style and iterable, in this process and
with thread workers; over a ShardStream), a ShardStream's ShardReader (shard by shard and by windows), and
Accelerate's prepared loader. (accelerate's RankShare, the one other, needs
2 ranks and has no position of its own: its loaders' resume is tested on 2
ranks under torchrun in test_accelerate.py.)

Process workers are left to the resume tests (test_resume_*.py): here every
point starts a pass, and thread workers keep the file quick.
"""

from __future__ import annotations

import io
import tarfile
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
from conveyor import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    ShardBlockSampler,
    ShardedSampler,
    SubsetRandomSampler,
    TokenBudgetBatchSampler,
    WeightedRandomSampler,
)
from conveyor.shards import ShardDataset, ShardStream
from resume_helpers import Augmented
from roundtrip import check_round_trip

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

DATA = range(7)
WEIGHTS = [0.5, 0.0, 2.0, 1.0, 1.0, 3.0, 0.25]
LENGTHS = [1 + (i * 7) % 11 for i in range(13)]
#: Shards of 3, 0, 2 and 4 samples, as a ShardBlockSampler reads them (a ShardDataset's firsts).
SHARDS = SimpleNamespace(firsts=[0, 3, 3, 5, 9])


def global_numpy(make):
    """``make``, with numpy's global generator seeded first (each build alike)."""

    def build():
        np.random.seed(0)
        return make()

    return build


def global_torch(make):
    """``make``, with torch's global generator seeded first."""

    def build():
        torch.manual_seed(0)
        return make()

    return build


#: name -> (build, options for check_round_trip). A generator is made anew by each build.
INDEX_SAMPLERS = {
    "SequentialSampler": (lambda: SequentialSampler(DATA), {}),
    "RandomSampler, seed=": (lambda: RandomSampler(DATA, seed=3), {}),
    "RandomSampler, seed= and set_epoch": (lambda: RandomSampler(DATA, seed=3), {"set_epoch": True}),
    "RandomSampler, numpy generator": (lambda: RandomSampler(DATA, generator=np.random.default_rng(4)), {}),
    "RandomSampler, torch generator": (lambda: RandomSampler(DATA, generator=torch.Generator().manual_seed(4)), {}),
    # The global generator belongs to the caller: only the saved epoch is replayed (documented).
    "RandomSampler, numpy's global generator": (global_numpy(lambda: RandomSampler(DATA)), {"epochs": 1}),
    "RandomSampler, torch's global generator": (global_torch(lambda: ct.RandomSampler(DATA)), {"epochs": 1}),
    "RandomSampler, replacement": (lambda: RandomSampler(DATA, replacement=True, num_samples=40, seed=3), {}),
    "RandomSampler, num_samples past the data": (
        lambda: RandomSampler(DATA, num_samples=16, generator=np.random.default_rng(4)),
        {},
    ),
    "RandomSampler, computed order, seed= and set_epoch": (
        lambda: RandomSampler(DATA, seed=3, order="computed"),
        {"set_epoch": True},
    ),
    "RandomSampler, computed order, numpy generator, num_samples past the data": (
        lambda: RandomSampler(DATA, num_samples=16, generator=np.random.default_rng(4), order="computed"),
        {},
    ),
    "RandomSampler, computed order, torch generator": (
        lambda: RandomSampler(DATA, generator=torch.Generator().manual_seed(4), order="computed"),
        {},
    ),
    "RandomSampler, computed order, numpy's global generator": (
        global_numpy(lambda: RandomSampler(DATA, order="computed")),
        {"epochs": 1},
    ),
    "RandomSampler, computed order, replacement": (
        lambda: RandomSampler(DATA, replacement=True, num_samples=40, seed=3, order="computed"),
        {},
    ),
    "SubsetRandomSampler, numpy generator": (
        lambda: SubsetRandomSampler([1, 3, 4, 6, 9], generator=np.random.default_rng(4)),
        {},
    ),
    "SubsetRandomSampler, torch generator": (
        lambda: SubsetRandomSampler([1, 3, 4, 6, 9], generator=torch.Generator().manual_seed(4)),
        {},
    ),
    "WeightedRandomSampler, with replacement": (
        lambda: WeightedRandomSampler(WEIGHTS, 9, generator=np.random.default_rng(4)),
        {},
    ),
    "WeightedRandomSampler, without replacement": (
        lambda: WeightedRandomSampler(WEIGHTS, 5, replacement=False, generator=torch.Generator().manual_seed(4)),
        {},
    ),
    "DistributedSampler": (lambda: DistributedSampler(DATA, num_replicas=2, rank=1, seed=3), {"set_epoch": True}),
    "DistributedSampler, drop_last, no set_epoch": (
        lambda: DistributedSampler(DATA, num_replicas=3, rank=0, seed=3, drop_last=True),
        {},
    ),
    "DistributedSampler, computed order": (
        lambda: DistributedSampler(DATA, num_replicas=2, rank=1, seed=3, order="computed"),
        {"set_epoch": True},
    ),
    "DistributedSampler, computed order, drop_last": (
        lambda: DistributedSampler(DATA, num_replicas=3, rank=2, seed=3, drop_last=True, order="computed"),
        {"set_epoch": True},
    ),
    "DistributedSampler, even=False": (
        lambda: DistributedSampler(DATA, num_replicas=2, rank=1, seed=3, even=False),
        {"set_epoch": True},
    ),
    "ShardBlockSampler": (lambda: ShardBlockSampler(SHARDS, 2, seed=3), {}),
    "ShardBlockSampler, 2 ranks, drop_last, set_epoch": (
        lambda: ShardBlockSampler(SHARDS, 2, seed=3, num_replicas=2, rank=1, drop_last=True),
        {"set_epoch": True},
    ),
    "ShardedSampler over WeightedRandomSampler": (
        lambda: ShardedSampler(WeightedRandomSampler(WEIGHTS, 9, generator=np.random.default_rng(4)), 2, 1),
        {},
    ),
}

BATCH_SAMPLERS = {
    "TokenBudgetBatchSampler": (lambda: TokenBudgetBatchSampler(LENGTHS, max_tokens=20, seed=2, pool_size=5), {}),
    "TokenBudgetBatchSampler, 2 ranks, set_epoch": (
        lambda: TokenBudgetBatchSampler(LENGTHS, max_tokens=20, seed=2, num_replicas=2, rank=1),
        {"set_epoch": True},
    ),
    "ShardedSampler over TokenBudgetBatchSampler, even=None": (
        lambda: ShardedSampler(TokenBudgetBatchSampler(LENGTHS, max_tokens=20, seed=2), 2, 0, even=None),
        {},
    ),
    "BatchSampler(SequentialSampler), drop_last": (lambda: BatchSampler(SequentialSampler(DATA), 3, True), {}),
    **{
        f"BatchSampler({name})": ((lambda build=build: BatchSampler(build(), 3, False)), options)
        for name, (build, options) in INDEX_SAMPLERS.items()
    },
}


@pytest.mark.parametrize("name", list(INDEX_SAMPLERS) + list(BATCH_SAMPLERS))
def test_every_sampler_round_trips(name):
    build, options = {**INDEX_SAMPLERS, **BATCH_SAMPLERS}[name]
    assert check_round_trip(build, **{"epochs": 3, **options}) > 3


# ------------------------------------------------------------------ loaders


class Drawn:
    """Map-style: sample ``i`` is ``[i, a draw]`` from conveyor.sample_rng(),
    the same whoever loads it (thread workers share the global generators,
    so Augmented's draws would not repeat under them; docs/threads.md)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.array([i, conveyor.sample_rng().numpy_generator.random()])


class Numbered(conveyor.IterableDataset):
    """Worker ``w`` of ``W`` yields ``w, w + W, ...`` below ``n``, each with a
    draw from conveyor.sample_rng(); its iterator saves its place. With 2
    workers the copies run out at different batches."""

    def __init__(self, n: int = 13):
        self.n = n

    def __iter__(self):
        return NumberedIterator(self.n)


class NumberedIterator:
    def __init__(self, n: int):
        info = conveyor.get_worker_info()
        self.at, self.step = (info.id, info.num_workers) if info is not None else (0, 1)
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if self.at >= self.n:
            raise StopIteration
        self.at += self.step
        return np.array([self.at - self.step, conveyor.sample_rng().numpy_generator.random()])

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


THREADS = {"num_workers": 2, "worker_method": "thread"}

#: name -> build. 0 workers: Augmented draws from the global generators,
#: which the loader seeds per batch; threads: Drawn.
LOADERS = {
    "map-style, seed=": lambda: DataLoader(Augmented(10), batch_size=3, shuffle=True, seed=7),
    "map-style, seed=, threads": lambda: DataLoader(Drawn(10), batch_size=3, shuffle=True, seed=7, **THREADS),
    "map-style, torch generator": lambda: ct.DataLoader(
        Augmented(10), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(5)
    ),
    "map-style, numpy generator, threads": lambda: DataLoader(
        Drawn(10), batch_size=4, shuffle=True, generator=np.random.default_rng(5), **THREADS
    ),
    "map-style, batch_size=None": lambda: DataLoader(Augmented(5), batch_size=None, shuffle=True, seed=7),
    "map-style, TokenBudgetBatchSampler, threads": lambda: DataLoader(
        Drawn(13), batch_sampler=TokenBudgetBatchSampler(LENGTHS, max_tokens=20, seed=2), seed=7, **THREADS
    ),
    "iterable": lambda: DataLoader(Numbered(), batch_size=2, seed=3),
    "iterable, threads": lambda: DataLoader(Numbered(), batch_size=2, seed=3, **THREADS),
}

#: A loader of an iterable dataset, loaded between epochs, saves its
#: placeholder index sampler's state as new (the loaded one is not loaded
#: into it: it repeats one batch of nothing); the rest of the state is as loaded.
PLACEHOLDER_SAMPLER = {"resaves": False}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("set_epoch", [False, True], ids=["epochs counted", "set_epoch"])
@pytest.mark.parametrize("name", list(LOADERS))
def test_the_data_loader_round_trips(name, set_epoch):
    options = PLACEHOLDER_SAMPLER if name.startswith("iterable") else {}
    check_round_trip(LOADERS[name], set_epoch=set_epoch, **options)


# ------------------------------------------------------------------ shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """A folder of 4 tar shards of 3, 1, 4 and 2 samples; sample ``k`` is its text ``str(k)``."""
    folder = tmp_path_factory.mktemp("shards")
    k = 0
    for number, count in enumerate([3, 1, 4, 2]):
        with tarfile.open(folder / f"shard-{number}.tar", "w") as tar:
            for _ in range(count):
                data = str(k).encode()
                member = tarfile.TarInfo(f"{k:06d}.txt")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                k += 1
    return folder


def shard_stream(folder):
    return ShardStream(ShardDataset(folder, transform=lambda sample: sample["txt"]), shuffle_shards=True, seed=3)


def windowed_stream(folder):
    dataset = ShardDataset(folder, transform=lambda sample: sample["txt"])
    return ShardStream(dataset, shuffle_shards=True, seed=3, shards_per_window=2)


@pytest.mark.parametrize("make", [shard_stream, windowed_stream], ids=["shard by shard", "windows of 2 shards"])
def test_a_shard_reader_round_trips(shards, make):
    check_round_trip(lambda: iter(make(shards)), epochs=1, begin=lambda reader: reader)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [shard_stream, windowed_stream], ids=["shard by shard", "windows of 2 shards"])
@pytest.mark.parametrize("workers", [{}, THREADS], ids=["in this process", "threads"])
def test_a_data_loader_over_a_shard_stream_round_trips(shards, workers, make):
    # (the stream's set_epoch reshuffles the shards; the loader passes it on)
    build = lambda: DataLoader(make(shards), batch_size=2, collate_fn=list, **workers)  # noqa: E731
    check_round_trip(build, set_epoch=True, **PLACEHOLDER_SAMPLER)


# --------------------------------------------------------------- accelerate


@pytest.mark.timeout(120)
@pytest.mark.parametrize("iterable", [False, True], ids=["map-style", "iterable"])
def test_accelerates_prepared_loader_round_trips(iterable):
    """On one process: the prepared loader's state is the loop's (an
    iterable's holds the next batch to see the end coming)."""
    pytest.importorskip("accelerate")
    from conveyor.integrations.accelerate import Accelerator

    accelerator = Accelerator(cpu=True)

    def build():
        if iterable:
            return accelerator.prepare(ct.DataLoader(Numbered(), batch_size=2, seed=3))
        return accelerator.prepare(ct.DataLoader(Augmented(10), batch_size=3, shuffle=True, seed=7))

    check_round_trip(build, **(PLACEHOLDER_SAMPLER if iterable else {}))
