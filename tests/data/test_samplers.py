"""Samplers: same orders, lengths and errors as torch.utils.data; resumable at any item."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conveyor
from conveyor.rng import derive_seed, global_generator_states, restore_global_generators
from conveyor.sampler import (
    BatchSampler,
    DistributedSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    TokenBudgetBatchSampler,
    WeightedRandomSampler,
)

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def torch_flavour(cls):
    """The subclass conveyor.torch builds: same name, torch's global generator."""
    return type(cls.__name__, (cls,), {"_flavor": "torch"})


def torch_gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def np_gen(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def epochs(sampler, count: int) -> list[list]:
    return [list(sampler) for _ in range(count)]


def json_round_trip(state: dict) -> dict:
    return json.loads(json.dumps(state))


# ---------------------------------------------------------------------------
# differential: same order and length as torch.utils.data


RANDOM_CASES = [
    # (n, replacement, num_samples)
    (10, False, None),
    (10, False, 4),
    (10, False, 10),
    (10, False, 20),
    (10, False, 25),
    (1, False, None),
    (10, True, None),
    (10, True, 32),
    (10, True, 70),
    (100, True, 5),
]


@pytest.mark.parametrize("n, replacement, num_samples", RANDOM_CASES)
def test_random_sampler_matches_torch_with_torch_generator(n, replacement, num_samples):
    ours = RandomSampler(range(n), replacement, num_samples, generator=torch_gen(7))
    theirs = tud.RandomSampler(range(n), replacement, num_samples, generator=torch_gen(7))
    assert epochs(ours, 3) == epochs(theirs, 3)
    assert len(ours) == len(theirs)


@pytest.mark.parametrize("n, replacement, num_samples", RANDOM_CASES)
def test_random_sampler_torch_flavour_follows_torch_manual_seed(n, replacement, num_samples):
    ours = torch_flavour(RandomSampler)(range(n), replacement, num_samples)
    theirs = tud.RandomSampler(range(n), replacement, num_samples)
    torch.manual_seed(3)
    expected = epochs(theirs, 2) + [torch.rand(2).tolist()]  # the global generator ends in step too
    torch.manual_seed(3)
    assert epochs(ours, 2) + [torch.rand(2).tolist()] == expected


def test_random_sampler_draws_when_torch_draws():
    """torch draws the seed at the first next(), not at iter(); so do we."""
    ours = iter(torch_flavour(RandomSampler)(range(8)))
    theirs = iter(tud.RandomSampler(range(8)))
    torch.manual_seed(0)
    torch.rand(1)
    expected = [next(theirs) for _ in range(8)]
    torch.manual_seed(0)
    torch.rand(1)
    assert [next(ours) for _ in range(8)] == expected


def test_subset_random_sampler_matches_torch():
    indices = [3, 9, 4, 11, 20, 7]
    ours = SubsetRandomSampler(indices, generator=torch_gen(1))
    theirs = tud.SubsetRandomSampler(indices, generator=torch_gen(1))
    assert epochs(ours, 3) == epochs(theirs, 3)
    assert len(ours) == len(theirs)
    torch.manual_seed(5)
    expected = epochs(tud.SubsetRandomSampler(indices), 2)
    torch.manual_seed(5)
    assert epochs(torch_flavour(SubsetRandomSampler)(indices), 2) == expected


@pytest.mark.parametrize("replacement, num_samples", [(True, 7), (True, 40), (False, 4), (False, 6)])
def test_weighted_random_sampler_matches_torch(replacement, num_samples):
    weights = [0.1, 0.9, 0.4, 0.7, 3.0, 0.6]
    ours = WeightedRandomSampler(weights, num_samples, replacement, generator=torch_gen(2))
    theirs = tud.WeightedRandomSampler(weights, num_samples, replacement, generator=torch_gen(2))
    assert epochs(ours, 3) == epochs(theirs, 3)
    assert len(ours) == len(theirs)
    torch.manual_seed(9)
    expected = epochs(tud.WeightedRandomSampler(weights, num_samples, replacement), 2)
    torch.manual_seed(9)
    assert epochs(torch_flavour(WeightedRandomSampler)(weights, num_samples, replacement), 2) == expected


def test_sequential_sampler_matches_torch():
    assert list(SequentialSampler(range(5))) == list(tud.SequentialSampler(range(5)))
    assert len(SequentialSampler(range(5))) == 5
    assert list(SequentialSampler([])) == []


BATCH_CASES = [(10, 3, False), (10, 3, True), (9, 3, True), (2, 5, False), (2, 5, True), (0, 2, False)]


@pytest.mark.parametrize("n, batch_size, drop_last", BATCH_CASES)
def test_batch_sampler_matches_torch(n, batch_size, drop_last):
    if n:
        ours = BatchSampler(RandomSampler(range(n), generator=torch_gen(4)), batch_size, drop_last)
        theirs = tud.BatchSampler(tud.RandomSampler(range(n), generator=torch_gen(4)), batch_size, drop_last)
        assert epochs(ours, 2) == epochs(theirs, 2)
        assert len(ours) == len(theirs)
    over_torch = BatchSampler(tud.SequentialSampler(range(n)), batch_size, drop_last)
    assert list(over_torch) == list(tud.BatchSampler(range(n), batch_size, drop_last))


DIST_CASES = [
    # (n, num_replicas, drop_last)
    (10, 3, False),
    (10, 3, True),
    (10, 5, False),
    (10, 5, True),
    (2, 5, False),
    (2, 5, True),
    (7, 1, False),
    (11, 4, False),
    (0, 2, False),
]


@pytest.mark.parametrize("n, num_replicas, drop_last", DIST_CASES)
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_sampler_matches_torch(n, num_replicas, drop_last, shuffle):
    for rank in range(num_replicas):
        ours = torch_flavour(DistributedSampler)(range(n), num_replicas, rank, shuffle, seed=3, drop_last=drop_last)
        theirs = tud.DistributedSampler(range(n), num_replicas, rank, shuffle, seed=3, drop_last=drop_last)
        for epoch in (0, 1, 5):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)
        assert ours.total_size == theirs.total_size
        if not shuffle:  # the numpy flavour pads and splits the same way
            numpy_flavour = DistributedSampler(range(n), num_replicas, rank, False, drop_last=drop_last)
            assert list(numpy_flavour) == list(theirs)


def test_distributed_sampler_numpy_flavour_shuffles_from_derive_seed():
    sampler = DistributedSampler(range(10), num_replicas=1, rank=0, seed=4)
    sampler.set_epoch(2)
    assert list(sampler) == np.random.Generator(np.random.PCG64(derive_seed(4, 2))).permutation(10).tolist()


# ---------------------------------------------------------------------------
# differential: the same argument errors as torch


def raises_like_torch(ours, theirs):
    with pytest.raises(Exception) as expected:
        theirs()
    with pytest.raises(type(expected.value)) as got:
        ours()
    assert str(got.value).startswith(str(expected.value)), (str(got.value), str(expected.value))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"replacement": 1},
        {"replacement": "yes"},
        {"num_samples": 0},
        {"num_samples": -3},
        {"num_samples": 1.5},
        {"num_samples": "a"},
    ],
)
def test_random_sampler_errors_match_torch(kwargs):
    raises_like_torch(lambda: RandomSampler(range(4), **kwargs), lambda: tud.RandomSampler(range(4), **kwargs))


def test_random_sampler_empty_dataset_error_matches_torch():
    raises_like_torch(lambda: RandomSampler([]), lambda: tud.RandomSampler([]))


@pytest.mark.parametrize(
    "args",
    [
        ([1.0, 2.0], 0, True),
        ([1.0, 2.0], -1, True),
        ([1.0, 2.0], True, True),
        ([1.0, 2.0], 2.0, True),
        ([1.0, 2.0], 2, 1),
        ([1.0, 2.0], 2, "no"),
        ([[1.0, 2.0], [3.0, 4.0]], 2, True),
        (3.0, 2, True),
    ],
)
def test_weighted_random_sampler_errors_match_torch(args):
    raises_like_torch(lambda: WeightedRandomSampler(*args), lambda: tud.WeightedRandomSampler(*args))


@pytest.mark.parametrize(
    "batch_size, drop_last", [(0, False), (-2, False), (True, False), (2.0, False), ("3", False), (2, 1), (2, None)]
)
def test_batch_sampler_errors_match_torch(batch_size, drop_last):
    raises_like_torch(
        lambda: BatchSampler(range(5), batch_size, drop_last), lambda: tud.BatchSampler(range(5), batch_size, drop_last)
    )


@pytest.mark.parametrize("num_replicas, rank", [(2, 2), (2, -1), (3, 7)])
def test_distributed_sampler_rank_errors_match_torch(num_replicas, rank):
    raises_like_torch(
        lambda: DistributedSampler(range(5), num_replicas, rank),
        lambda: tud.DistributedSampler(range(5), num_replicas, rank),
    )


def test_distributed_sampler_without_world_asks_for_it():
    assert not torch.distributed.is_initialized()
    with pytest.raises(ValueError):
        tud.DistributedSampler(range(5))
    with pytest.raises(ValueError, match="pass num_replicas=.* and rank="):
        DistributedSampler(range(5))
    with pytest.raises(ValueError, match="rank was not given"):
        DistributedSampler(range(5), num_replicas=2)


def test_conveyor_checks_early_what_torch_finds_late():
    with pytest.raises(ValueError, match="non-negative"):
        WeightedRandomSampler([1.0, -1.0], 2)
    with pytest.raises(ValueError, match="finite"):
        WeightedRandomSampler([1.0, float("nan")], 2)
    with pytest.raises(ValueError, match="all be zero"):
        WeightedRandomSampler([0.0, 0.0], 2)
    with pytest.raises(ValueError, match="replacement=True"):
        WeightedRandomSampler([1.0, 0.0, 1.0], 3, replacement=False)
    with pytest.raises(ValueError, match="empty data_source"):
        RandomSampler([], num_samples=3)
    with pytest.raises(ValueError, match="not both"):
        RandomSampler(range(3), generator=np_gen(0), seed=1)
    with pytest.raises(TypeError, match="generator must be"):
        RandomSampler(range(3), generator="g")
    with pytest.raises(TypeError, match="__len__"):
        SequentialSampler(iter(range(3)))
    with pytest.raises(ValueError, match="num_replicas should be a positive integer"):
        DistributedSampler(range(3), num_replicas=0, rank=0)


def test_sampler_base_class():
    with pytest.raises(NotImplementedError):
        iter(Sampler())
    with pytest.raises(TypeError):
        len(Sampler())


# ---------------------------------------------------------------------------
# properties


@SETTINGS
@given(n=st.integers(1, 60), seed=st.integers(0, 2**40), count=st.integers(1, 4))
def test_each_epoch_of_random_sampler_is_a_permutation(n, seed, count):
    for sampler in (RandomSampler(range(n), seed=seed), RandomSampler(range(n), generator=np_gen(seed))):
        for order in epochs(sampler, count):
            assert sorted(order) == list(range(n))


def test_random_sampler_seed_depends_on_epoch_only():
    a = RandomSampler(range(50), seed=11)
    orders = epochs(a, 4)
    assert len({tuple(o) for o in orders}) == 4
    b = RandomSampler(range(50), seed=11)
    b.set_epoch(2)
    assert list(b) == orders[2]
    assert list(b) == orders[3]  # epochs move on by one per iteration after set_epoch
    b.set_epoch(2)
    assert list(b) == orders[2]


@SETTINGS
@given(
    n=st.integers(0, 60),
    num_replicas=st.integers(1, 8),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    epoch=st.integers(0, 5),
)
def test_distributed_ranks_cover_dataset_once_up_to_padding(n, num_replicas, drop_last, shuffle, epoch):
    shares = []
    for rank in range(num_replicas):
        sampler = DistributedSampler(range(n), num_replicas, rank, shuffle, seed=1, drop_last=drop_last)
        sampler.set_epoch(epoch)
        shares.append(list(sampler))
        assert len(shares[-1]) == len(sampler)
    everything = [i for share in shares for i in share]
    assert len({len(share) for share in shares}) <= 1
    if drop_last:
        assert len(set(everything)) == len(everything) == n - n % num_replicas
    else:
        assert set(everything) == set(range(n))
        assert len(everything) - n < num_replicas


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 50), max_size=80),
    extra=st.integers(0, 60),
    max_batch_size=st.none() | st.integers(1, 6),
    pool_size=st.none() | st.integers(1, 30),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**32),
    epoch=st.integers(0, 3),
)
def test_token_budget_holds_and_each_sample_appears_once(
    lengths, extra, max_batch_size, pool_size, shuffle, seed, epoch
):
    max_tokens = max(lengths, default=0) + extra + 1
    sampler = TokenBudgetBatchSampler(
        lengths, max_tokens, max_batch_size=max_batch_size, pool_size=pool_size, shuffle=shuffle, seed=seed
    )
    sampler.set_epoch(epoch)
    expected_len = len(sampler)
    batches = list(sampler)
    assert len(batches) == expected_len
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        assert batch
        assert max(max(lengths[i], 1) for i in batch) * len(batch) <= max_tokens
        assert max_batch_size is None or len(batch) <= max_batch_size


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 20), max_size=60),
    num_replicas=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 100),
)
def test_token_budget_shards_batches_across_ranks(lengths, num_replicas, drop_last, seed):
    shares = [
        list(TokenBudgetBatchSampler(lengths, 40, seed=seed, num_replicas=num_replicas, rank=r, drop_last=drop_last))
        for r in range(num_replicas)
    ]
    assert len({len(share) for share in shares}) == 1
    everything = [i for share in shares for batch in share for i in batch]
    if drop_last:
        assert len(set(everything)) == len(everything)
    else:
        assert set(everything) == set(range(len(lengths)))


def test_token_budget_orders_and_errors():
    lengths = [5, 3, 9, 2, 8, 4]
    assert list(TokenBudgetBatchSampler(lengths, 16, shuffle=False)) == [[3, 1, 5], [0, 4], [2]]
    assert list(TokenBudgetBatchSampler(lengths, 16, shuffle=False, max_batch_size=2)) == [[3, 1], [5, 0], [4], [2]]
    a = TokenBudgetBatchSampler([1 + i % 50 for i in range(200)], 256, seed=3, pool_size=40)
    b = TokenBudgetBatchSampler([1 + i % 50 for i in range(200)], 256, seed=3, pool_size=40)
    first, second = epochs(a, 2)
    assert first == list(b) and first != second
    with pytest.raises(ValueError, match=r"longer than max_tokens=8 .*index 2 with 9 tokens.*at least 9"):
        TokenBudgetBatchSampler(lengths, 8)
    with pytest.raises(ValueError, match="max_tokens should be a positive integer value"):
        TokenBudgetBatchSampler(lengths, 0)
    with pytest.raises(TypeError, match="integers"):
        TokenBudgetBatchSampler([1.5, 2.0], 8)
    with pytest.raises(ValueError, match="non-negative"):
        TokenBudgetBatchSampler([1, -2], 8)
    with pytest.raises(ValueError, match="Invalid rank 2"):
        TokenBudgetBatchSampler(lengths, 16, num_replicas=2, rank=2)
    assert list(TokenBudgetBatchSampler([], 4)) == []


def test_token_budget_batches_can_be_changed_by_the_caller():
    sampler = TokenBudgetBatchSampler([1, 2, 3, 4], 8, seed=0)
    sampler.set_epoch(0)
    first = list(sampler)
    for batch in first:
        batch.clear()
    sampler.set_epoch(0)
    assert all(list(sampler))


# ---------------------------------------------------------------------------
# resuming


def make_factories():
    """name → (factory(generator_seed) → sampler, before_run()) for each way of drawing."""

    def global_numpy():
        np.random.seed(123)

    def global_torch():
        torch.manual_seed(123)

    nothing = lambda: None  # noqa: E731
    return {
        "sequential": (lambda g: SequentialSampler(range(13)), nothing),
        "random-numpy-gen": (lambda g: RandomSampler(range(13), generator=np_gen(g)), nothing),
        "random-torch-gen": (lambda g: RandomSampler(range(13), generator=torch_gen(g)), nothing),
        "random-mt19937-gen": (
            lambda g: RandomSampler(range(13), generator=np.random.Generator(np.random.MT19937(g))),
            nothing,
        ),
        "random-seed": (lambda g: RandomSampler(range(13), seed=5), nothing),
        "random-none": (lambda g: RandomSampler(range(13)), global_numpy),
        "random-none-torch": (lambda g: torch_flavour(RandomSampler)(range(13)), global_torch),
        "random-replacement": (lambda g: RandomSampler(range(13), True, 70, generator=torch_gen(g)), nothing),
        "random-more-than-n": (lambda g: RandomSampler(range(13), num_samples=30, generator=np_gen(g)), nothing),
        "subset-torch-gen": (lambda g: SubsetRandomSampler(list(range(0, 26, 2)), generator=torch_gen(g)), nothing),
        "subset-none-torch": (lambda g: torch_flavour(SubsetRandomSampler)(list(range(13))), global_torch),
        "subset-none": (lambda g: SubsetRandomSampler(list(range(13))), global_numpy),
        "weighted-numpy-gen": (lambda g: WeightedRandomSampler(np.arange(1.0, 14.0), 13, generator=np_gen(g)), nothing),
        "weighted-none-torch": (
            lambda g: torch_flavour(WeightedRandomSampler)(np.arange(1.0, 14.0), 9, replacement=False),
            global_torch,
        ),
        "distributed": (lambda g: DistributedSampler(range(13), 3, 1, seed=2), nothing),
        "batch-random": (lambda g: BatchSampler(RandomSampler(range(13), generator=torch_gen(g)), 4, False), nothing),
        "batch-drop-last": (lambda g: BatchSampler(RandomSampler(range(13), seed=1), 4, True), nothing),
        "batch-none": (lambda g: BatchSampler(RandomSampler(range(13)), 5, False), global_numpy),
        "batch-plain-list": (lambda g: BatchSampler(list(range(13)), 4, False), nothing),
        "token-budget": (lambda g: TokenBudgetBatchSampler(list(range(1, 14)), 20, seed=4, pool_size=5), nothing),
    }


FACTORIES = make_factories()
EPOCHS = 3


def run_uninterrupted(name):
    factory, before = FACTORIES[name]
    before()
    return epochs(factory(1), EPOCHS)


def run_interrupted(name, epoch, position, reload_into_same):
    """Stop ``epoch`` after ``position`` items, save as JSON, load into a sampler
    whose generator is in another state, then go on to the end."""
    factory, before = FACTORIES[name]
    before()
    sampler = factory(1)
    seen = epochs(sampler, epoch)
    it = iter(sampler)
    head = [next(it) for _ in range(position)]
    state = json_round_trip(sampler.state_dict())
    if reload_into_same:
        # Run on, then rewind. With generator=None later epochs draw from the
        # global generators, which belong to the caller: put them back too.
        global_states = global_generator_states()
        list(sampler)
        restore_global_generators(global_states)
    else:
        sampler = factory(999)
    sampler.load_state_dict(state)
    seen.append(head + list(sampler))
    return seen + epochs(sampler, EPOCHS - epoch - 1)


@pytest.mark.parametrize("name", sorted(FACTORIES))
@SETTINGS
@given(data=st.data())
def test_resume_at_any_position_continues_the_uninterrupted_run(name, data):
    expected = run_uninterrupted(name)
    epoch = data.draw(st.integers(0, EPOCHS - 1), label="epoch")
    position = data.draw(st.integers(0, len(expected[epoch])), label="position")
    same = data.draw(st.booleans(), label="reload_into_same")
    assert run_interrupted(name, epoch, position, same) == expected


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_resume_between_iterations(name):
    factory, before = FACTORIES[name]
    expected = run_uninterrupted(name)
    before()
    sampler = factory(1)
    first = list(sampler)
    state = json_round_trip(sampler.state_dict())
    assert state["in_iteration"] is False and state["position"] == 0
    resumed = factory(999)
    resumed.load_state_dict(state)
    assert [first] + epochs(resumed, EPOCHS - 1) == expected


def test_state_is_small_json_with_version_and_kind():
    for name, (factory, before) in FACTORIES.items():
        before()
        sampler = factory(1)
        it = iter(sampler)
        next(it)
        state = sampler.state_dict()
        assert json_round_trip(state) == state, name
        assert state["version"] == 1 and state["kind"] == type(sampler).__name__
        assert len(json.dumps(state)) < 16_000, name


def test_state_dict_after_load_reports_the_loaded_point():
    sampler = RandomSampler(range(10), generator=np_gen(0))
    it = iter(sampler)
    [next(it) for _ in range(4)]
    state = sampler.state_dict()
    fresh = RandomSampler(range(10), generator=np_gen(1))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state


def test_random_sampler_resume_skips_without_per_item_work():
    """Skipped items are sliced off drawn chunks: a resume near the end of a
    long epoch draws one permutation, the same as the uninterrupted run."""
    n = 200_000
    sampler = RandomSampler(range(n), seed=0)
    expected_tail = list(sampler)[-3:]
    sampler.load_state_dict({**sampler.state_dict(), "epoch": 0, "position": n - 3, "in_iteration": True})
    assert list(sampler) == expected_tail


def test_batch_sampler_position_can_be_lowered():
    """A loader that prefetched rewinds to the batches it delivered."""
    sampler = BatchSampler(RandomSampler(range(20), generator=torch_gen(0)), 3, False)
    expected = list(sampler)
    sampler = BatchSampler(RandomSampler(range(20), generator=torch_gen(0)), 3, False)
    it = iter(sampler)
    [next(it) for _ in range(6)]
    state = json_round_trip(sampler.state_dict())
    for delivered in (6, 4, 0):
        rewound = BatchSampler(RandomSampler(range(20), generator=torch_gen(5)), 3, False)
        rewound.load_state_dict({**state, "position": delivered})
        assert list(rewound) == expected[delivered:]
    # after the last (short) batch the inner sampler has finished; rewinding still works
    sampler = BatchSampler(RandomSampler(range(20), generator=torch_gen(0)), 3, False)
    it = iter(sampler)
    [next(it) for _ in range(7)]
    state = json_round_trip(sampler.state_dict())
    rewound = BatchSampler(RandomSampler(range(20), generator=torch_gen(5)), 3, False)
    rewound.load_state_dict({**state, "position": 5})
    assert list(rewound) == expected[5:]


def test_distributed_state_loads_on_any_rank():
    samplers = [DistributedSampler(range(20), 4, rank, seed=1) for rank in range(4)]
    for sampler in samplers:
        sampler.set_epoch(3)
    expected = [list(s)[2:] for s in samplers]
    it = iter(samplers[0])
    next(it), next(it)
    state = json_round_trip(samplers[0].state_dict())
    for rank in range(4):
        resumed = DistributedSampler(range(20), 4, rank, seed=1)
        resumed.load_state_dict(state)
        assert list(resumed) == expected[rank]
        assert resumed.epoch == 3


def test_set_epoch_keeps_or_drops_a_loaded_resume_point():
    sampler = RandomSampler(range(10), seed=0)
    sampler.set_epoch(4)
    order = list(sampler)
    sampler.load_state_dict({**sampler.state_dict(), "epoch": 4, "position": 6, "in_iteration": True})
    sampler.set_epoch(4)  # the usual loop: set_epoch(epoch) right after loading
    assert list(sampler) == order[6:]
    sampler.load_state_dict({**sampler.state_dict(), "epoch": 4, "position": 6, "in_iteration": True})
    with pytest.warns(UserWarning, match="drops the resume point"):
        sampler.set_epoch(5)
    assert len(list(sampler)) == 10


def test_batch_sampler_forwards_set_epoch():
    inner = RandomSampler(range(10), seed=0)
    batches = BatchSampler(inner, 4, False)
    batches.set_epoch(7)
    assert inner.epoch == 7
    expected = RandomSampler(range(10), seed=0)
    expected.set_epoch(7)
    assert [i for b in batches for i in b] == list(expected)
    BatchSampler(range(3), 2, False).set_epoch(1)  # an inner sampler without set_epoch is fine


def test_batch_sampler_drops_its_resume_with_the_inner_one():
    batches = BatchSampler(RandomSampler(range(10), seed=0), 3, False)
    it = iter(batches)
    next(it)
    state = batches.state_dict()
    resumed = BatchSampler(RandomSampler(range(10), seed=0), 3, False)
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed.set_epoch(4)
    assert len(list(resumed)) == 4


@pytest.mark.parametrize("stop", ["in a resumed epoch", "in an epoch of one batch"])
def test_a_batch_sampler_saved_after_the_batch_that_ended_its_inner_sampler_resumes_the_later_epochs(stop):
    """The first batch of an iteration can be its last (the one batch a
    resumed epoch had left, or an epoch of one batch): the state saved after
    it names the epoch that batch ended, so later epochs follow as uninterrupted.
    (It named the next epoch: a resumed run then skipped one epoch's order.)"""
    n = 10 if stop == "in a resumed epoch" else 3

    def make():
        return BatchSampler(RandomSampler(range(n), seed=3), 4, False)

    expected = epochs(make(), 3)
    sampler = make()
    it = iter(sampler)
    head = []
    if n == 10:  # 3 batches: save after 2, resume; the resumed epoch's first batch is its last
        head = [next(it), next(it)]
        state = json_round_trip(sampler.state_dict())
        sampler = make()
        sampler.load_state_dict(state)
        it = iter(sampler)
    head.append(next(it))  # the batch that ends the inner sampler's iteration
    resumed = make()
    resumed.load_state_dict(json_round_trip(sampler.state_dict()))
    assert [head + list(resumed)] + epochs(resumed, 2) == expected


@pytest.mark.parametrize(
    "saved, loaded, fragment",
    [
        (lambda: RandomSampler(range(10), seed=0), lambda: SequentialSampler(range(10)), "kind='RandomSampler'"),
        (lambda: RandomSampler(range(10), seed=0), lambda: RandomSampler(range(11), seed=0), "dataset_length=10"),
        (lambda: RandomSampler(range(10), seed=0), lambda: RandomSampler(range(10), seed=1), "seed=0"),
        (
            lambda: RandomSampler(range(10), seed=0),
            lambda: RandomSampler(range(10), num_samples=5, seed=0),
            "num_samples",
        ),
        (lambda: RandomSampler(range(10), generator=np_gen(0)), lambda: RandomSampler(range(10)), "generator='numpy'"),
        (
            lambda: RandomSampler(range(10)),
            lambda: RandomSampler(range(10), generator=torch_gen(0)),
            "generator='global'",
        ),
        (lambda: RandomSampler(range(10)), lambda: torch_flavour(RandomSampler)(range(10)), "flavor='numpy'"),
        (lambda: BatchSampler(range(10), 3, False), lambda: BatchSampler(range(10), 4, False), "batch_size=3"),
        (lambda: DistributedSampler(range(10), 2, 0), lambda: DistributedSampler(range(10), 3, 0), "num_replicas=2"),
        (lambda: TokenBudgetBatchSampler([1, 2, 3], 4), lambda: TokenBudgetBatchSampler([1, 2, 4], 4), "lengths_crc32"),
    ],
)
def test_mismatched_state_says_both_sides_and_the_fix(saved, loaded, fragment):
    state = saved().state_dict()
    with pytest.raises(ValueError) as error:
        loaded().load_state_dict(state)
    message = str(error.value)
    assert fragment in message and "this sampler:" in message and "Fix:" in message


def test_other_bad_states():
    sampler = SequentialSampler(range(5))
    with pytest.raises(ValueError, match="version"):
        sampler.load_state_dict({**sampler.state_dict(), "version": 2})
    with pytest.raises(ValueError, match="lacks"):
        sampler.load_state_dict({k: v for k, v in sampler.state_dict().items() if k != "position"})
    with pytest.raises(ValueError, match="past the end"):
        sampler.load_state_dict({**sampler.state_dict(), "position": 6, "in_iteration": True})
    with pytest.raises(TypeError, match="state_dict"):
        sampler.load_state_dict([1, 2])


def test_numpy_generator_states_are_json():
    """Bit generators that keep arrays in their state (MT19937, SFC64, Philox)."""
    for bit_generator in (np.random.MT19937, np.random.SFC64, np.random.Philox):
        sampler = RandomSampler(range(30), generator=np.random.Generator(bit_generator(3)))
        list(sampler)
        state = json_round_trip(sampler.state_dict())
        expected = list(sampler)
        resumed = RandomSampler(range(30), generator=np.random.Generator(bit_generator(4)))
        resumed.load_state_dict(state)
        assert list(resumed) == expected


def test_two_live_iterators_do_not_corrupt_each_other():
    sampler = RandomSampler(range(8), seed=0)
    first, second = iter(sampler), iter(sampler)
    a = [next(first) for _ in range(3)]
    b = list(second)
    assert sorted(a + list(first)) == list(range(8)) and sorted(b) == list(range(8))


# ---------------------------------------------------------------------------
# numpy-only use


def test_importing_samplers_does_not_import_torch():
    code = (
        "import sys; import conveyor.sampler as s; "
        "list(s.RandomSampler(range(5))); list(s.TokenBudgetBatchSampler([1, 2], 4)); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_samplers_copy_and_pickle_with_their_generators():
    import copy
    import pickle

    for sampler in (
        RandomSampler(range(9), generator=torch_gen(0)),
        RandomSampler(range(9), generator=np_gen(0)),
        BatchSampler(SubsetRandomSampler(list(range(9)), generator=torch_gen(1)), 2, False),
        TokenBudgetBatchSampler([1, 2, 3, 4], 5, seed=1),
    ):
        iter_first = iter(sampler)
        next(iter_first)
        for duplicate in (copy.deepcopy(sampler), pickle.loads(pickle.dumps(sampler))):
            assert duplicate.state_dict() == sampler.state_dict()
            assert epochs(duplicate, 2) == epochs(copy.deepcopy(sampler), 2)


@pytest.mark.parametrize("n, replicas", [(10, 3), (9, 3), (2, 3), (0, 2)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_distributed_even_false_sees_every_sample_once_for_evaluation(n, replicas, shuffle):
    import conveyor.torch as ct

    for module in (conveyor, ct):
        shares = [
            list(
                module.DistributedSampler(range(n), num_replicas=replicas, rank=r, shuffle=shuffle, seed=3, even=False)
            )
            for r in range(replicas)
        ]
        assert sorted(i for share in shares for i in share) == list(range(n))  # no padded duplicates
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert [
            len(module.DistributedSampler(range(n), num_replicas=replicas, rank=r, even=False)) for r in range(replicas)
        ] == [len(share) for share in shares]


def test_distributed_even_false_rejects_drop_last_and_non_bools():
    with pytest.raises(ValueError, match="even=False"):
        conveyor.DistributedSampler(range(10), num_replicas=2, rank=0, drop_last=True, even=False)
    with pytest.raises(TypeError, match="even"):
        conveyor.DistributedSampler(range(10), num_replicas=2, rank=0, even=0)


def test_distributed_even_false_resumes_mid_epoch():
    sampler = conveyor.DistributedSampler(range(11), num_replicas=2, rank=0, shuffle=True, seed=5, even=False)
    it = iter(sampler)
    head = [next(it) for _ in range(2)]
    state = sampler.state_dict()
    rest = list(it)
    resumed = conveyor.DistributedSampler(range(11), num_replicas=2, rank=0, shuffle=True, seed=5, even=False)
    resumed.load_state_dict(state)
    assert list(resumed) == rest and len(head + rest) == 6
    padded = conveyor.DistributedSampler(range(11), num_replicas=2, rank=0, shuffle=True, seed=5)
    with pytest.raises(ValueError):
        padded.load_state_dict(state)  # the state names even=False; the other sampler pads


def _shares(make_sampler, replicas, even):
    return [
        list(conveyor.ShardedSampler(make_sampler(), num_replicas=replicas, rank=r, even=even)) for r in range(replicas)
    ]


@pytest.mark.parametrize("even", ["pad", "drop", None])
def test_sharded_sampler_shares_out_a_weighted_sampler(even):
    make = lambda: conveyor.WeightedRandomSampler([1.0, 2.0, 3.0, 4.0, 5.0], 11, generator=np.random.default_rng(4))  # noqa: E731
    drawn = list(make())
    shares = _shares(make, 3, even)
    lengths = [len(conveyor.ShardedSampler(make(), num_replicas=3, rank=r, even=even)) for r in range(3)]
    assert lengths == [len(share) for share in shares]
    if even is None:
        assert sorted(x for s in shares for x in s) == sorted(drawn) and max(lengths) - min(lengths) <= 1
    else:
        assert len(set(lengths)) == 1
        assert lengths[0] == (4 if even == "pad" else 3)
        assert [shares[r][k] for k in range(3) for r in range(3)] == drawn[:9]  # dealt round robin


def test_sharded_sampler_shares_out_whole_batches_of_a_batch_sampler():
    lengths = [3, 9, 1, 4, 4, 7, 2, 8, 5, 6]
    make = lambda: conveyor.TokenBudgetBatchSampler(lengths, max_tokens=12, shuffle=True, seed=1)  # noqa: E731
    batches = list(make())
    shares = _shares(make, 2, None)
    assert sorted(map(tuple, shares[0] + shares[1])) == sorted(map(tuple, batches))
    loader = conveyor.DataLoader(
        list(range(10)), batch_sampler=conveyor.ShardedSampler(make(), num_replicas=2, rank=1, even=None)
    )
    assert [b.tolist() for b in loader] == shares[1]


def test_sharded_sampler_resumes_mid_epoch_and_moves_on_by_epoch():
    make = lambda: conveyor.ShardedSampler(conveyor.RandomSampler(range(20), seed=9), num_replicas=2, rank=1)  # noqa: E731
    sampler = make()
    first = list(sampler)
    it = iter(sampler)
    head = [next(it) for _ in range(4)]
    state = sampler.state_dict()
    rest = list(it)
    assert head + rest != first  # the second iteration is the next epoch
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert list(resumed) == rest


@pytest.mark.parametrize("inner", ["a generator", "its epoch"])
def test_a_sharded_sampler_saved_between_epochs_carries_the_wrapped_samplers_state(inner):
    """Between epochs the wrapped sampler has moved on (its generator, or
    the epoch it draws from): the state holds where it stands, so the next
    epoch is the uninterrupted run's. (It held nothing: a resumed run drew
    the first epoch's order again.)"""

    def make():
        if inner == "a generator":
            wrapped = conveyor.WeightedRandomSampler([1.0, 2.0, 3.0, 4.0, 5.0], 9, generator=np.random.default_rng(4))
        else:
            wrapped = conveyor.TokenBudgetBatchSampler([3, 9, 1, 4, 4, 7, 2, 8, 5, 6], max_tokens=12, seed=1)
        return conveyor.ShardedSampler(wrapped, num_replicas=2, rank=1)

    expected = epochs(make(), 3)
    sampler = make()
    first = list(sampler)
    resumed = make()
    resumed.load_state_dict(json_round_trip(sampler.state_dict()))
    assert [first] + epochs(resumed, 2) == expected


def test_sharded_sampler_checks_its_arguments():
    with pytest.raises(TypeError, match="needs a sampler"):
        conveyor.ShardedSampler(3, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="even"):
        conveyor.ShardedSampler(range(3), num_replicas=2, rank=0, even="evenly")
    with pytest.raises(ValueError, match="rank"):
        conveyor.ShardedSampler(range(3), num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="state_dict"):
        conveyor.ShardedSampler(range(3), num_replicas=2, rank=0).load_state_dict({})
