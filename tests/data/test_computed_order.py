"""order="computed": RandomSampler and DistributedSampler map each position
through a keyed permutation (KeyedPermutation(n, key), key from (seed,
epoch)), hold nothing of the dataset's size, and keep torch's semantics
(num_samples past n, replacement, padding and drop_last of the ranks);
order="auto" computes it above order.COMPUTED_ABOVE items unless torch's
generator drives the order."""

from __future__ import annotations

import json
import tracemalloc
from collections import Counter

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
from conveyor import BatchSampler, DataLoader, DistributedSampler, RandomSampler
from conveyor.rng import derive_seed
from conveyor.sampler.order import COMPUTED_ABOVE
from conveyor.sampler.permutation import KeyedPermutation


class Length:
    """A map-style dataset of ``n`` items, ``i`` itself, that holds nothing of its size."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


# ------------------------------------------------------------------ RandomSampler


def test_an_epoch_is_the_keyed_permutation_of_seed_and_epoch():
    sampler = RandomSampler(range(50), seed=4, order="computed")
    epochs = [list(sampler) for _ in range(3)]
    for epoch, order in enumerate(epochs):
        assert order == KeyedPermutation(50, derive_seed(4, epoch)).block(0, 50).tolist()
        assert sorted(order) == list(range(50))
    assert epochs[0] != epochs[1] != epochs[2]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]  # set_epoch reproduces an epoch


def test_num_samples_past_the_data_chains_permutations():
    order = list(RandomSampler(range(10), num_samples=35, seed=1, order="computed"))
    assert len(order) == 35
    chunks = [order[i : i + 10] for i in range(0, 30, 10)]
    assert all(sorted(chunk) == list(range(10)) for chunk in chunks)  # each n a whole permutation
    assert len({tuple(chunk) for chunk in chunks}) == 3  # each its own
    assert len(set(order[30:])) == 5  # the last cut short, no repeat in it


def test_replacement_draws_num_samples_indices_of_the_dataset():
    order = list(RandomSampler(range(7), replacement=True, num_samples=7000, seed=2, order="computed"))
    assert len(order) == 7000 and set(order) == set(range(7))
    assert max(Counter(order).values()) < 1200  # about 1000 each
    assert order == list(RandomSampler(range(7), replacement=True, num_samples=7000, seed=2, order="computed"))


def test_a_generator_draws_the_key_and_moves_on():
    sampler = RandomSampler(range(20), generator=np.random.default_rng(3), order="computed")
    first, second = list(sampler), list(sampler)
    assert sorted(first) == sorted(second) == list(range(20)) and first != second
    again = RandomSampler(range(20), generator=np.random.default_rng(3), order="computed")
    assert [list(again), list(again)] == [first, second]
    by_torch = RandomSampler(range(20), generator=torch.Generator().manual_seed(3), order="computed")
    assert sorted(list(by_torch)) == list(range(20))


def test_the_global_generator_seeds_each_iteration():
    np.random.seed(0)
    sampler = RandomSampler(range(20), order="computed")
    first = list(sampler)
    np.random.seed(0)
    assert list(RandomSampler(range(20), order="computed")) == first and sorted(first) == list(range(20))


def test_auto_keeps_the_stored_order_for_small_datasets():
    assert RandomSampler(range(100), seed=3).order == "stored"
    assert list(RandomSampler(range(100), seed=3)) == list(RandomSampler(range(100), seed=3, order="stored"))
    assert list(RandomSampler(range(100), seed=3)) != list(RandomSampler(range(100), seed=3, order="computed"))


def test_auto_computes_the_order_above_the_threshold_unless_torch_drives_it():
    big = Length(COMPUTED_ABOVE + 1)
    assert RandomSampler(Length(COMPUTED_ABOVE), seed=0).order == "stored"
    assert RandomSampler(big, seed=0).order == "computed"
    assert RandomSampler(big).order == "computed"
    assert RandomSampler(big, generator=np.random.default_rng(0)).order == "computed"
    assert RandomSampler(big, generator=torch.Generator()).order == "stored"  # torch's exact order
    assert ct.RandomSampler(big).order == "stored"  # torch's global generator
    assert ct.RandomSampler(big, seed=0).order == "computed"  # conveyor's own seed
    assert DistributedSampler(big, num_replicas=2, rank=0).order == "computed"
    assert ct.DistributedSampler(big, num_replicas=2, rank=0).order == "stored"
    assert ct.DistributedSampler(big, num_replicas=2, rank=0, order="computed").order == "computed"


def test_a_shuffled_loader_computes_the_order_of_a_large_dataset_and_keeps_torch_s_when_torch_drives_it():
    big = Length(COMPUTED_ABOVE + 1)
    assert DataLoader(big, batch_size=4, shuffle=True).sampler.order == "computed"
    assert DataLoader(Length(100), batch_size=4, shuffle=True).sampler.order == "stored"
    assert ct.DataLoader(big, batch_size=4, shuffle=True).sampler.order == "stored"
    assert ct.DataLoader(big, batch_size=4, shuffle=True, generator=torch.Generator()).sampler.order == "stored"
    assert ct.DataLoader(big, batch_size=4, shuffle=True, seed=1).sampler.order == "computed"


@pytest.mark.parametrize("make", [RandomSampler, lambda data, order: DistributedSampler(data, 2, 0, order=order)])
def test_an_unknown_order_is_refused_naming_the_choices(make):
    with pytest.raises(ValueError, match="order must be one of 'auto', 'stored', 'computed', got 'random'"):
        make(range(5), order="random")
    with pytest.raises(ValueError, match="order must be one of"):
        make(range(5), order=None)


def test_a_state_of_one_order_is_refused_by_the_other():
    stored, computed = RandomSampler(range(10), seed=1), RandomSampler(range(10), seed=1, order="computed")
    with pytest.raises(ValueError, match="saved with the computed order and this sampler has the stored one"):
        stored.load_state_dict(computed.state_dict())
    with pytest.raises(ValueError, match="saved with the stored order and this sampler has the computed one"):
        computed.load_state_dict(stored.state_dict())
    ranks = DistributedSampler(range(10), 2, 0), DistributedSampler(range(10), 2, 0, order="computed")
    with pytest.raises(ValueError, match="the stored order and this sampler has the computed one"):
        ranks[1].load_state_dict(ranks[0].state_dict())
    with pytest.raises(ValueError, match="the computed order and this sampler has the stored one"):
        ranks[0].load_state_dict(ranks[1].state_dict())


def test_a_stored_state_records_no_order():
    # (so states saved before order= existed load as they did)
    assert "order" not in RandomSampler(range(10), seed=1).state_dict()
    assert RandomSampler(range(10), seed=1, order="computed").state_dict()["order"] == "computed"


def test_a_sampler_resumes_at_a_position_deep_in_the_epoch():
    def build():
        return RandomSampler(range(1000), generator=np.random.default_rng(6), order="computed", num_samples=2500)

    sampler = build()
    start = sampler.state_dict()
    reference = [list(sampler), list(sampler)]  # epochs 0 and 1
    for position in (0, 1, 999, 1000, 1001, 2400, 2500):
        resumed = build()
        resumed.load_state_dict({**start, "position": position, "in_iteration": True, "rng": start["rng"]})
        assert list(resumed) == reference[0][position:], position
        assert list(resumed) == reference[1], position  # the generator goes on as if never interrupted


# ------------------------------------------------------------------ DistributedSampler


def padded_epoch(n, replicas, seed, epoch, drop_last=False, shuffle=True):
    """torch's global order for the ranks: the epoch's permutation, padded from its start or cut."""
    order = KeyedPermutation(n, derive_seed(seed, epoch)).block(0, n).tolist() if shuffle else list(range(n))
    total = (n // replicas if drop_last else -(-n // replicas)) * replicas
    return [order[g % n] for g in range(total)]


@pytest.mark.parametrize("n", [1, 7, 10, 13, 64])
@pytest.mark.parametrize("replicas", [1, 2, 3, 8])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_take_their_share_of_the_padded_or_cut_epoch(n, replicas, drop_last):
    if drop_last and n < replicas:
        return  # (no sample for any rank)
    shares = [
        list(DistributedSampler(range(n), replicas, r, seed=2, drop_last=drop_last, order="computed"))
        for r in range(replicas)
    ]
    expected = padded_epoch(n, replicas, 2, 0, drop_last)
    assert shares == [expected[r::replicas] for r in range(replicas)]
    stored = [len(DistributedSampler(range(n), replicas, r, drop_last=drop_last)) for r in range(replicas)]
    assert [len(share) for share in shares] == stored  # as many as torch's
    seen = Counter(i for share in shares for i in share)
    if drop_last:
        assert all(count == 1 for count in seen.values())  # disjoint
    else:
        assert set(seen) == set(range(n))  # the epoch covered, once but for the padding
        assert sum(seen.values()) - n == len(expected) - n < replicas


def test_even_false_serves_every_sample_once():
    shares = [list(DistributedSampler(range(11), 3, r, seed=1, even=False, order="computed")) for r in range(3)]
    assert sorted(i for share in shares for i in share) == list(range(11))
    assert [len(s) for s in shares] == [4, 4, 3]


def test_without_shuffle_the_computed_order_is_torch_s():
    for r in range(3):
        stored = list(DistributedSampler(range(11), 3, r, shuffle=False))
        assert list(DistributedSampler(range(11), 3, r, shuffle=False, order="computed")) == stored


def test_set_epoch_reshuffles_the_ranks_alike():
    ranks = [DistributedSampler(range(40), 2, r, seed=9, order="computed") for r in range(2)]
    first = [list(rank) for rank in ranks]
    assert [list(rank) for rank in ranks] == first  # no set_epoch: the same order again, as torch
    for rank in ranks:
        rank.set_epoch(1)
    second = [list(rank) for rank in ranks]
    assert second != first and sorted(second[0] + second[1]) == list(range(40))


# ------------------------------------------------------------------ at scale


@pytest.mark.parametrize("n", [10**10, (1 << 63) - 1])
def test_a_shuffle_of_billions_holds_nothing_of_its_size(n):
    tracemalloc.start()
    try:
        sampler = RandomSampler(Length(n), seed=3)
        batches = BatchSampler(sampler, 256, False)
        head = list(zip(range(3), batches))
        state = json.loads(json.dumps(batches.state_dict()))
        state["position"] = (n // 256) * 9 // 10  # 90% into the epoch
        resumed = BatchSampler(RandomSampler(Length(n), seed=3), 256, False)
        resumed.load_state_dict(state)
        late = next(iter(resumed))
        ranks = DistributedSampler(Length(n), num_replicas=4, rank=3, seed=1)
        share = [i for _, i in zip(range(1000), ranks)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sampler.order == ranks.order == "computed"
    indices = [i for _, batch in head for i in batch] + late + share
    assert all(0 <= i < n for i in indices) and len(set(indices[: 3 * 256])) == 3 * 256
    permutation = KeyedPermutation(n, derive_seed(3, 0))
    assert late[:3] == [permutation[state["position"] * 256 + k] for k in range(3)]
    assert peak < 8 << 20  # a few MB: blocks of indices, never the epoch


def test_a_length_past_sys_maxsize_is_a_clear_error():
    sampler = RandomSampler(range(10), num_samples=1 << 63, seed=0, order="computed")
    assert sampler.num_samples == 1 << 63
    with pytest.raises(OverflowError, match="more than len\\(\\) can return.*num_samples"):
        len(sampler)
    with pytest.raises(OverflowError, match="num_samples"):
        len(DataLoader(range(10), batch_size=4, sampler=sampler))
    assert next(iter(sampler)) in range(10)  # iterating is fine
    assert len(RandomSampler(Length(10**10), seed=0)) == 10**10


def test_the_core_and_the_torch_facade_give_the_same_computed_order():
    assert list(ct.RandomSampler(range(30), seed=5, order="computed")) == list(
        conveyor.RandomSampler(range(30), seed=5, order="computed")
    )
    assert list(ct.DistributedSampler(range(30), 2, 1, seed=5, order="computed")) == list(
        conveyor.DistributedSampler(range(30), 2, 1, seed=5, order="computed")
    )
