"""Resume with the user's own samplers and torch's (issue 5): a sampler or
batch sampler with its own state, torch's RandomSampler with a generator,
resume exactly; one that cannot be replayed says so; with neither seed= nor
generator= the global generator decides and the state still names its draws.

Under fork (the default here) workers inherit this module, so module-level
samplers and datasets are fine.
"""

import random

import pytest
import torch
import torch.utils.data as tud

import conveyor.torch as ct
from resume_helpers import json_round_trip

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


# ------------------------------------------------------ the user's own samplers
class CountingSampler:
    """A user's sampler with its own state (torchdata style): the epoch and
    the items yielded so far; its order follows from the epoch."""

    def __init__(self, n):
        self.n, self.epoch, self.yielded, self._resume_at = n, 0, 0, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch)).tolist()
        start, self._resume_at = self._resume_at, 0
        self.yielded = start
        for index in order[start:]:
            self.yielded += 1
            yield index
        self.epoch, self.yielded = self.epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state):
        self.epoch, self._resume_at = state["epoch"], state["yielded"]


class CountingBatchSampler(CountingSampler):
    def __iter__(self):
        items = list(super().__iter__())
        return iter([items[k : k + 3] for k in range(0, len(items), 3)])

    def __len__(self):
        return (self.n + 2) // 3


class ShuffledBatches:
    """A batch sampler without state whose order changes every iteration."""

    def __len__(self):
        return 7

    def __iter__(self):
        order = list(range(20))
        random.shuffle(order)
        return iter([order[k : k + 3] for k in range(0, 20, 3)])


def _user_sampler_loader(kind, num_workers):
    data = list(range(20))
    options = dict(num_workers=num_workers)
    if kind == "stateful sampler":
        return ct.DataLoader(data, batch_size=3, sampler=CountingSampler(20), **options)
    if kind == "stateful batch_sampler":
        return ct.DataLoader(data, batch_sampler=CountingBatchSampler(20), **options)
    if kind == "torch RandomSampler with a generator":
        sampler = tud.RandomSampler(data, generator=torch.Generator().manual_seed(1))
        return ct.DataLoader(data, batch_size=3, sampler=sampler, **options)
    if kind == "torch BatchSampler over it":
        sampler = tud.RandomSampler(data, generator=torch.Generator().manual_seed(1))
        return ct.DataLoader(data, batch_sampler=tud.BatchSampler(sampler, 3, False), **options)
    if kind == "torch RandomSampler, global generator":
        return ct.DataLoader(data, batch_size=3, sampler=tud.RandomSampler(data), **options)
    if kind == "batch sampler without state":
        return ct.DataLoader(data, batch_sampler=ShuffledBatches(), **options)
    raise KeyError(kind)


def _resume_in_second_epoch(kind, num_workers):
    """(the uninterrupted epochs 0-2, those of a run saved after 2 batches of
    epoch 1 and resumed by a new loader)."""
    torch.manual_seed(0)
    random.seed(0)
    reference = _user_sampler_loader(kind, num_workers)
    expected = [[b.tolist() for b in reference] for _ in range(3)]
    loader = _user_sampler_loader(kind, num_workers)
    first = [b.tolist() for b in loader]
    it = iter(loader)
    head = [next(it).tolist() for _ in range(2)]
    state = json_round_trip(loader.state_dict())
    del it, loader
    resumed = _user_sampler_loader(kind, num_workers)
    resumed.load_state_dict(state)
    seen = [first, head + [b.tolist() for b in resumed], [b.tolist() for b in resumed]]
    return expected, seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize(
    "kind",
    [
        "stateful sampler",
        "stateful batch_sampler",
        "torch RandomSampler with a generator",
        "torch BatchSampler over it",
    ],
)
def test_the_users_own_sampler_resumes_exactly(kind, num_workers):
    expected, seen = _resume_in_second_epoch(kind, num_workers)
    assert seen == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["torch RandomSampler, global generator", "batch sampler without state"])
def test_a_sampler_that_cannot_be_replayed_says_so_instead_of_yielding_other_samples(kind):
    with pytest.raises(RuntimeError, match="cannot resume exactly: the (batch_)?sampler .* gave another first batch"):
        _resume_in_second_epoch(kind, 0)


class DrawsTorch:
    """Each sample is a draw from torch's global generator (an augmentation)."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        return i, int(torch.randint(1000, (1,)))


def _epoch(loader):
    return [[x.tolist() for x in b] for b in loader]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("when", ["after iter(), before the first batch", "at an epoch's end", "before any iter()"])
def test_the_global_generator_decides_and_the_state_still_names_the_draws(when, num_workers):
    """No seed= and no generator=: the shuffle and the batch seeds come from
    torch's global generator. A state saved before the draws that a resumed
    run would make (not yet made, or the next epoch's) holds them, as
    torchdata's does, so the resumed run yields the same batches."""

    def make():
        return ct.DataLoader(DrawsTorch(), batch_size=5, shuffle=True, num_workers=num_workers)

    torch.manual_seed(0)
    loader = make()
    if when == "after iter(), before the first batch":
        it = iter(loader)
        state = json_round_trip(loader.state_dict())
        expected = _epoch(it)
    elif when == "at an epoch's end":
        _epoch(loader)
        state = json_round_trip(loader.state_dict())
        expected = _epoch(loader)
    else:
        state = json_round_trip(loader.state_dict())
        expected = _epoch(loader)
    torch.manual_seed(12345)  # a restarted job's global generator is elsewhere
    resumed = make()
    resumed.load_state_dict(state)
    assert _epoch(resumed) == expected
