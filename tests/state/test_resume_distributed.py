"""Resume under DistributedSampler (issue 5): each rank saves and restores
its own state (through a torch checkpoint), a state saved on one world size
resumes on another (the rest of the epoch once, but for padding), and a
state with batches delivered ahead loads only on the number of ranks that
saved it.
"""

import json
import time
import types

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
from resume_helpers import Augmented, N, plain, run_epochs, torch_saved

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.mark.timeout(60)
def test_each_distributed_rank_saves_and_restores_its_own_state():
    def rank_loader(rank, workers=0):
        ds = Augmented(N)
        sampler = ct.DistributedSampler(ds, num_replicas=2, rank=rank, seed=4)
        return ct.DataLoader(ds, batch_size=3, sampler=sampler, seed=1, num_workers=workers)

    expected = {}
    for rank in (0, 1):
        loader = rank_loader(rank)
        expected[rank] = run_epochs(loader, 0, 2)
    checkpoint = {}
    heads = {}
    for rank, stop in ((0, 2), (1, 5)):  # ranks save at their own positions
        loader = rank_loader(rank, workers=1)
        loader.set_epoch(0)
        it = iter(loader)
        heads[rank] = [plain(next(it)) for _ in range(stop)]
        checkpoint[rank] = loader.state_dict()
    checkpoint = torch.load(torch_saved(checkpoint), weights_only=True)
    for rank in (0, 1):
        resumed = rank_loader(rank, workers=2)
        resumed.load_state_dict(checkpoint[rank])
        resumed.set_epoch(0)
        assert [heads[rank] + [plain(b) for b in resumed]] + run_epochs(resumed, 1, 2) == expected[rank]


def _distributed_loader(n, replicas, rank, num_workers=0, module=None, order="auto"):
    module = module or conveyor
    dataset = list(range(n))
    sampler = module.DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=5, order=order)
    return module.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers)


def _items(batches):
    return [int(i) for batch in batches for i in np.asarray(batch).ravel()]


@pytest.mark.parametrize("order", ["stored", "computed"])
@pytest.mark.parametrize(
    "n, batches, saved_on, loaded_on", [(40, 3, 2, 3), (40, 3, 2, 1), (41, 2, 3, 2), (40, 4, 2, 4), (40, 5, 2, 3)]
)
def test_a_state_saved_on_one_world_size_resumes_on_another(n, batches, saved_on, loaded_on, order):
    consumed, states = [], []
    for rank in range(saved_on):  # a synchronous job: every rank at the same batch
        loader = _distributed_loader(n, saved_on, rank, order=order)
        it = iter(loader)
        consumed += _items(next(it) for _ in range(batches))
        states.append(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for rank in range(loaded_on):  # each new rank loads rank 0's state
        loader = _distributed_loader(n, loaded_on, rank, num_workers=2 if rank == 0 else 0, order=order)
        loader.load_state_dict(states[0])
        rest.append(_items(loader))
    assert len({len(part) for part in rest}) == 1  # every new rank as many samples
    seen = consumed + [i for part in rest for i in part]
    assert set(seen) == set(range(n))  # the rest of the epoch covered...
    padding = len(seen) - n
    assert 0 <= padding < loaded_on  # ...once, but for the padding that evens the new ranks out
    read_again = set(consumed) & {i for part in rest for i in part}
    assert len(read_again) <= padding  # nothing consumed is read again, but for that padding
    later = _distributed_loader(n, loaded_on, 0, order=order)
    later.load_state_dict(states[0])
    _items(later)
    later.sampler.set_epoch(1)
    assert len(_items(later)) == len(later.sampler) == -(-n // loaded_on)  # the next epoch is whole


def test_the_resumed_epoch_of_another_size_saves_and_resumes_again():
    n = 40
    states = []
    for rank in range(2):
        loader = _distributed_loader(n, 2, rank)
        it = iter(loader)
        for _ in range(3):
            next(it)
        states.append(loader.state_dict())
    on_three = _distributed_loader(n, 3, 0)
    on_three.load_state_dict(states[0])
    it = iter(on_three)
    next(it)
    mid = json.loads(json.dumps(on_three.state_dict()))
    rest = _items(it)
    again = _distributed_loader(n, 3, 0)
    again.load_state_dict(mid)
    assert _items(again) == rest  # the same size: exactly where it stood
    back_on_two = [_distributed_loader(n, 2, rank) for rank in range(2)]
    for loader in back_on_two:
        loader.load_state_dict(mid)
    assert len({len(_items(loader)) for loader in back_on_two}) == 1  # and yet another size


class _FirstBatchSlow:
    """Map-style ``list(range(n))`` whose sample ``slow`` takes half a second."""

    def __init__(self, n: int, slow: int):
        self.n, self.slow = n, slow

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.slow:
            time.sleep(0.5)
        return i


@pytest.mark.timeout(60)
def test_a_state_with_batches_delivered_ahead_does_not_load_on_another_number_of_ranks():
    def loader(replicas):
        sampler = conveyor.DistributedSampler(range(40), num_replicas=replicas, rank=0, shuffle=False)
        return conveyor.DataLoader(_FirstBatchSlow(40, 0), batch_size=4, sampler=sampler, num_workers=2, in_order=False)

    saving = loader(2)
    it = iter(saving)
    first = next(it)  # batch 1: batch 0 is still loading
    assert first.tolist() != [0, 2, 4, 6]
    state = saving.state_dict()
    assert state["delivered_ahead"]
    del it
    with pytest.raises(ValueError, match="delivered ahead"):
        loader(3).load_state_dict(state)
    same = loader(2)
    same.load_state_dict(state)  # on the number of ranks that saved it, it loads


def _state_of_two_ranks_mid_epoch(make):
    sampler = make(2)
    it = iter(sampler)
    for _ in range(5):
        next(it)
    return sampler.state_dict()


SAMPLERS_OF_ANOTHER_SIZE = {
    "DistributedSampler": lambda replicas: conveyor.DistributedSampler(range(40), replicas, 0, seed=1),
    "DistributedSampler computed": lambda replicas: conveyor.DistributedSampler(
        range(40), replicas, 0, seed=1, order="computed"
    ),
    "ShardBlockSampler": lambda replicas: conveyor.ShardBlockSampler(
        types.SimpleNamespace(firsts=[0, 10, 20, 30, 40]), 2, seed=1, num_replicas=replicas
    ),
}


@pytest.mark.parametrize("make", list(SAMPLERS_OF_ANOTHER_SIZE.values()), ids=list(SAMPLERS_OF_ANOTHER_SIZE))
def test_set_epoch_that_drops_a_resume_of_another_size_gives_the_whole_epochs_length(make):
    state = _state_of_two_ranks_mid_epoch(make)
    on_three = make(3)
    on_three.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the resume point"):
        on_three.set_epoch(state["epoch"] + 1)
    assert len(on_three) == len(list(on_three)) == 14  # the whole epoch on 3 ranks, not the resumed span's 15


@pytest.mark.parametrize("make", list(SAMPLERS_OF_ANOTHER_SIZE.values()), ids=list(SAMPLERS_OF_ANOTHER_SIZE))
def test_a_refused_state_of_another_size_changes_nothing(make):
    state = _state_of_two_ranks_mid_epoch(make)
    on_three = make(3)
    with pytest.raises(ValueError, match="seed"):
        on_three.load_state_dict({**state, "seed": 2})
    assert not on_three.loaded_from_another_size
    assert len(on_three) == len(list(on_three)) == 14  # its own whole epoch, as before the refused load


@pytest.mark.parametrize("make", list(SAMPLERS_OF_ANOTHER_SIZE.values()), ids=list(SAMPLERS_OF_ANOTHER_SIZE))
def test_a_state_of_another_size_with_a_position_past_its_epoch_is_refused(make):
    state = _state_of_two_ranks_mid_epoch(make)
    make(3).load_state_dict({**state, "position": 20})  # the end of the epoch on 2 ranks: it loads
    with pytest.raises(ValueError, match="past the end"):
        make(3).load_state_dict({**state, "position": 21})  # 2 ranks had 20 places each


@pytest.mark.parametrize("saved_replicas", [0, -1])
@pytest.mark.parametrize("make", list(SAMPLERS_OF_ANOTHER_SIZE.values()), ids=list(SAMPLERS_OF_ANOTHER_SIZE))
def test_a_state_of_another_size_with_a_malformed_number_of_ranks_is_refused(make, saved_replicas):
    state = _state_of_two_ranks_mid_epoch(make)
    with pytest.raises(ValueError, match="malformed"):
        make(3).load_state_dict({**state, "num_replicas": saved_replicas})
