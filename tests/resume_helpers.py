"""What the resume tests share: map-style datasets with random augmentations,
loaders by name, and runs interrupted and not.

A plain module, as toy_datasets.py: the test_resume_*.py files import it, and
workers (forked here) inherit its classes. It imports torch, which the
augmentations draw from.
"""

import io
import json
import os
import random
import time

import numpy as np
import torch

import conveyor.torch as ct
from conveyor import DataLoader, DistributedSampler, SubsetRandomSampler, TokenBudgetBatchSampler, WeightedRandomSampler

#: How long a gated sample waits for the test to open its gate; never asserted.
PATIENCE_S = 20.0


# ---------------------------------------------------------------- datasets
class CountingIterator:
    """An iterator over ``items`` whose state is how many it has given (``at``)."""

    def __init__(self, items):
        self.items, self.at = items, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at >= len(self.items):
            raise StopIteration
        self.at += 1
        return self.items[self.at - 1]

    def state_dict(self):
        return {"at": self.at}

    def load_state_dict(self, state):
        self.at = state["at"]


class Augmented:
    """Map-style samples with random augmentations drawn from random, numpy and torch."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        noise = [random.random(), float(np.random.rand()), float(torch.rand(()))]
        return {"index": i, "x": np.array([i, *noise], dtype=np.float64)}


class Counting(Augmented):
    """Remembers which samples were fetched (num_workers=0)."""

    def __init__(self, n):
        super().__init__(n)
        self.fetched = []

    def __getitem__(self, i):
        self.fetched.append(i)
        return super().__getitem__(i)


class Logged(Augmented):
    """Appends each fetched index to a file: counts fetches inside workers too."""

    def __init__(self, n, path):
        super().__init__(n)
        self.path = str(path)

    def __getitem__(self, i):
        with open(self.path, "a") as f:
            f.write(f"{i}\n")
        return super().__getitem__(i)

    def fetched(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [int(line) for line in f]


class Gated(Augmented):
    """Samples in ``slow`` wait until the file ``gate`` exists: makes a batch late on purpose."""

    def __init__(self, n, slow, gate):
        super().__init__(n)
        self.slow, self.gate = set(slow), str(gate)

    def __getitem__(self, i):
        deadline = time.monotonic() + PATIENCE_S
        while i in self.slow and not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.01)
        return super().__getitem__(i)


# ----------------------------------------------------------------- helpers
def plain(batch):
    """A batch as comparable plain values, bit for bit (dtype, shape, bytes)."""
    if isinstance(batch, torch.Tensor):
        batch = batch.numpy()
    if isinstance(batch, np.ndarray):
        return (batch.dtype.str, batch.shape, batch.tobytes())
    if isinstance(batch, dict):
        return {key: plain(value) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [plain(value) for value in batch]
    return batch


def indices_of(batch):
    """The sample indices in a collated batch of Augmented samples."""
    index = batch["index"]
    return [int(i) for i in (index.tolist() if hasattr(index, "tolist") else [index])]


def json_round_trip(state):
    return json.loads(json.dumps(state))


N = 37
LENGTHS = [1 + (i * 7) % 11 for i in range(N)]


def make(name, num_workers=0, other=False, **options):
    """A loader by name; ``other=True`` gives its generators another seed, as a
    restarted job would (the state must put them back)."""
    g = 999 if other else 5
    ds = Augmented(N)
    kw = {"num_workers": num_workers, **options}
    if name == "shuffle-seed":
        return DataLoader(ds, batch_size=4, shuffle=True, seed=7, **kw)
    if name == "shuffle-torch-generator":
        return ct.DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(g), **kw)
    if name == "shuffle-numpy-generator":
        return DataLoader(ds, batch_size=3, shuffle=True, generator=np.random.default_rng(g), **kw)
    if name == "weighted":
        weights = np.linspace(0.1, 1.0, N)
        sampler = WeightedRandomSampler(weights, 30, generator=np.random.default_rng(g))
        return DataLoader(ds, batch_size=4, sampler=sampler, seed=7, **kw)
    if name == "subset":
        sampler = SubsetRandomSampler(list(range(0, N, 2)), generator=torch.Generator().manual_seed(g))
        return DataLoader(ds, batch_size=3, sampler=sampler, seed=7, **kw)
    if name == "distributed":
        sampler = DistributedSampler(ds, num_replicas=2, rank=1, seed=3)
        return DataLoader(ds, batch_size=4, sampler=sampler, seed=7, **kw)
    if name == "token-budget":
        batches = TokenBudgetBatchSampler(LENGTHS, max_tokens=24, seed=2, pool_size=8)
        return DataLoader(ds, batch_sampler=batches, seed=7, **kw)
    if name == "sequential-drop-last":
        return DataLoader(ds, batch_size=5, drop_last=True, seed=7, **kw)
    if name == "unbatched":
        return DataLoader(ds, batch_size=None, shuffle=True, seed=7, **kw)
    raise KeyError(name)


NAMES = [
    "shuffle-seed",
    "shuffle-torch-generator",
    "shuffle-numpy-generator",
    "weighted",
    "subset",
    "distributed",
    "token-budget",
    "sequential-drop-last",
    "unbatched",
]
EPOCHS = 3


def run_epochs(loader, first, last):
    """Epochs ``first`` .. ``last - 1`` as a training loop runs them (set_epoch each epoch)."""
    out = []
    for epoch in range(first, last):
        loader.set_epoch(epoch)
        out.append([plain(b) for b in loader])
    return out


_EXPECTED = {}


def uninterrupted(name):
    if name not in _EXPECTED:
        _EXPECTED[name] = run_epochs(make(name), 0, EPOCHS)
    return _EXPECTED[name]


def interrupted(name, epoch, position, save_workers=0, load_workers=0, **options):
    """Run to batch ``position`` of ``epoch``, save (through JSON), rebuild, load, run to the end."""
    loader = make(name, save_workers, **options)
    seen = run_epochs(loader, 0, epoch)
    loader.set_epoch(epoch)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(position)]
    state = json_round_trip(loader.state_dict())
    del it, loader
    resumed = make(name, load_workers, other=True, **options)
    resumed.load_state_dict(state)
    resumed.set_epoch(epoch)  # what the loop does on restart: keeps the resume point
    seen.append(head + [plain(b) for b in resumed])
    return seen + run_epochs(resumed, epoch + 1, EPOCHS)


def saved_state(name="shuffle-seed", position=2):
    """The state of loader ``name`` after ``position`` batches of its first epoch."""
    loader = make(name)
    it = iter(loader)
    for _ in range(position):
        next(it)
    return loader.state_dict()


def torch_saved(obj):
    """``obj`` written by torch.save into a buffer, rewound for torch.load."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer
