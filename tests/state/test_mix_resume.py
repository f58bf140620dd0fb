"""A loader over conveyor.Mix resumes exactly (0, 1, 2 and 4 workers,
processes and threads, at every point of two epochs by the round-trip
helper; after a change of weights too, through the torch façade with
torch's generator, and from a job of two ranks on three), and refuses a
state saved over another mix, naming what differs."""

from __future__ import annotations

import pytest

import conveyor
from roundtrip import check_round_trip


def _arguments():
    return dict(
        sources={"web": list(range(40)), "code": list(range(100, 113)), "books": list(range(200, 205))},
        weights=[(0, {"web": 5, "code": 2, "books": 1}), (48, {"web": 1, "code": 2, "books": 1})],
        seed=11,
        num_samples=96,
    )


def _mix(**changes):
    return conveyor.Mix(**{**_arguments(), **changes})


def _loader(mix, num_workers=0):
    return conveyor.DataLoader(mix, batch_size=8, shuffle=True, seed=3, num_workers=num_workers)


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
@pytest.mark.parametrize("stop_after", [1, 6, 9])  # batch 6 and later: past the change of weights at 48
def test_resume_is_exact_at_any_batch(num_workers, stop_after):
    full = [b.tolist() for b in _loader(_mix())]
    loader = _loader(_mix(), num_workers)
    it = iter(loader)
    served = [next(it).tolist() for _ in range(stop_after)]
    state = loader.state_dict()
    del it
    resumed = _loader(_mix(), num_workers)
    resumed.load_state_dict(state)
    assert served + [b.tolist() for b in resumed] == full


#: At every point of two epochs (a loader and its workers each): in this process and threads; processes
#: (1 and 4) at chosen points, by test_resume_is_exact_at_any_batch.
WORKERS = {"in this process": {}, "2 threads": {"num_workers": 2, "worker_method": "thread"}}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", list(WORKERS), ids=list(WORKERS))
def test_a_loader_over_a_scheduled_mix_round_trips_at_every_point_of_two_epochs(workers):
    # 24 positions, the weights changing at 12: a source wraps (books: 5 samples) and the order reshuffles.
    def build():
        mix = _mix(
            weights=[(0, {"web": 3, "code": 2, "books": 1}), (12, {"web": 1, "code": 1, "books": 2})], num_samples=24
        )
        return conveyor.DataLoader(mix, batch_size=4, shuffle=True, seed=5, **WORKERS[workers])

    assert check_round_trip(build, epochs=2) > 12


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"seed": 12}, "mix_seed"),
        ({"num_samples": 97}, "mix_length"),
        ({"shuffle": False}, "mix_shuffle"),
        ({"weights": {"web": 1, "code": 1, "books": 1}}, "mix_weights"),
        (
            {
                "sources": {"web": list(range(40)), "code": list(range(100, 113)), "novels": list(range(200, 205))},
                "weights": [(0, {"web": 5, "code": 2, "novels": 1}), (48, {"web": 1, "code": 2, "novels": 1})],
            },
            "mix_sources",
        ),
    ],
)
def test_a_state_of_another_mix_is_refused_naming_what_differs(changes, key):
    loader = _loader(_mix())
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = _loader(_mix(**changes))
    with pytest.raises(ValueError) as raised:
        other.load_state_dict(state)
    assert key in str(raised.value)


def test_a_job_of_two_ranks_resumes_on_three_serving_each_position_once():
    mix = _mix(num_samples=60)

    def loader(ranks, rank):
        sampler = conveyor.DistributedSampler(mix, num_replicas=ranks, rank=rank, shuffle=True, seed=2)
        return conveyor.DataLoader(mix, batch_size=4, sampler=sampler)

    served, states = [], []
    for rank in range(2):
        first = loader(2, rank)
        it = iter(first)
        served += [x for _ in range(3) for x in next(it).tolist()]
        states.append(first.state_dict())
        del it
    for rank in range(3):
        resumed = loader(3, rank)
        resumed.load_state_dict(states[0])  # (the ranks of a synchronous job stand at the same position)
        served += [x for batch in resumed for x in batch.tolist()]
    assert sorted(served) == sorted(mix[p] for p in range(60))


def test_the_torch_facade_resumes_a_mix_with_torch_s_generator():
    import torch

    import conveyor.torch as ct

    def loader():
        generator = torch.Generator().manual_seed(9)
        return ct.DataLoader(ct.Mix(**_arguments()), batch_size=8, shuffle=True, generator=generator)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    served = [next(it).tolist() for _ in range(7)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert served + [b.tolist() for b in resumed] == full


def test_a_state_saved_over_a_mix_is_refused_by_a_loader_over_another_dataset():
    loader = _loader(_mix())
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    plain = _loader(list(range(96)))  # (as long as the mix, the same settings otherwise)
    with pytest.raises(ValueError, match="mix_sources") as raised:
        plain.load_state_dict(state)
    assert "not recorded by this loader" in str(raised.value)
