"""Exact mid-epoch resume of map-style datasets (issue 5).

A loader rebuilt with the same arguments and loaded with a saved state yields,
bitwise, the batches the uninterrupted run would have yielded next (random
augmentations from random, numpy and torch included), for any num_workers at
save and at load, for every sampler, across epochs and with persistent
workers, without fetching the samples it skips; with in_order=False every
remaining sample is delivered once; a batch that raised counts as delivered,
and with pin_memory the state counts only what reached the loop.

Under fork (the default here) workers inherit the datasets of
resume_helpers.py.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conveyor.torch as ct
from conveyor import DataLoader
from resume_helpers import (
    EPOCHS,
    NAMES,
    Augmented,
    Counting,
    Gated,
    Logged,
    N,
    indices_of,
    interrupted,
    json_round_trip,
    make,
    plain,
    uninterrupted,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


# -------------------------------------------------- bitwise equal resumes
@pytest.mark.timeout(60)
@pytest.mark.parametrize("save_workers", [0, 1, 2])
@pytest.mark.parametrize("load_workers", [0, 1, 2])
@pytest.mark.parametrize("name", ["shuffle-seed", "token-budget"])
def test_resume_is_bitwise_equal_for_any_worker_counts(name, save_workers, load_workers):
    assert interrupted(name, 1, 3, save_workers, load_workers) == uninterrupted(name)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [(0, 2), (2, 0)])
@pytest.mark.parametrize("name", NAMES)
def test_resume_is_bitwise_equal_for_every_sampler(name, workers):
    expected = uninterrupted(name)
    assert interrupted(name, 1, len(expected[1]) // 2, *workers) == expected


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_resume_at_any_point_in_process(name, data):
    expected = uninterrupted(name)
    epoch = data.draw(st.integers(0, EPOCHS - 1), label="epoch")
    position = data.draw(st.integers(0, len(expected[epoch])), label="position")
    assert interrupted(name, epoch, position) == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("load_workers", [0, 1])
def test_resume_with_persistent_workers(load_workers):
    def make_persistent(workers):
        extra = {"persistent_workers": True} if workers else {}
        return DataLoader(Augmented(N), batch_size=4, shuffle=True, seed=3, num_workers=workers, **extra)

    reference = make_persistent(0)
    expected = [[plain(b) for b in reference] for _ in range(EPOCHS)]
    loader = make_persistent(2)
    seen = [[plain(b) for b in loader]]
    it = iter(loader)
    head = [plain(next(it)) for _ in range(4)]
    state = loader.state_dict()
    del it, loader
    resumed = make_persistent(load_workers)
    resumed.load_state_dict(state)
    seen.append(head + [plain(b) for b in resumed])
    seen.append([plain(b) for b in resumed])
    assert seen == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mid_epoch", [False, True])
def test_resume_with_persistent_workers_and_a_generator(mid_epoch):
    """With persistent workers and no seed=, later epochs draw no base seed
    (as torch); the state carries what the next epoch's derives from, so the
    resumed run goes on exactly, augmentations included."""

    def make_persistent():
        return ct.DataLoader(
            Augmented(N),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            persistent_workers=True,
            generator=torch.Generator().manual_seed(5),
        )

    reference = make_persistent()
    expected = [[plain(b) for b in reference] for _ in range(EPOCHS)]
    loader = make_persistent()
    seen = [[plain(b) for b in loader]]
    it = iter(loader)
    head = [plain(next(it)) for _ in range(4)] if mid_epoch else [plain(b) for b in it]
    state = loader.state_dict()
    del it, loader
    resumed = make_persistent()
    resumed.load_state_dict(json_round_trip(state))
    seen.append(head + ([plain(b) for b in resumed] if mid_epoch else []))
    while len(seen) < EPOCHS:
        seen.append([plain(b) for b in resumed])
    assert seen == expected


def test_epochs_count_on_without_set_epoch():
    """Without set_epoch the loader counts epochs itself; the state carries the count."""

    def loader():
        return DataLoader(Augmented(N), batch_size=4, shuffle=True, seed=11)

    reference = loader()
    expected = [[plain(b) for b in reference] for _ in range(3)]
    first = loader()
    seen = [[plain(b) for b in first]]
    it = iter(first)
    head = [plain(next(it)) for _ in range(2)]
    resumed = loader()
    resumed.load_state_dict(first.state_dict())
    seen += [head + [plain(b) for b in resumed], [plain(b) for b in resumed]]
    assert seen == expected


def test_global_generator_current_epoch_is_exact():
    """generator=None, seed=None: the interrupted epoch is replayed exactly,
    whatever the global generator's state when resuming (later epochs draw
    from it, as documented)."""
    np.random.seed(0)
    expected = [plain(b) for b in DataLoader(Augmented(N), batch_size=4, shuffle=True)]
    np.random.seed(0)
    loader = DataLoader(Augmented(N), batch_size=4, shuffle=True)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = loader.state_dict()
    np.random.seed(12345)
    resumed = DataLoader(Augmented(N), batch_size=4, shuffle=True)
    resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected


# --------------------------------------------------- nothing is re-read
def test_skipped_samples_are_never_fetched_in_process():
    n = 1000
    loader = DataLoader(Counting(n), batch_size=10, shuffle=True, seed=1)
    it = iter(loader)
    delivered = [i for _ in range(90) for i in indices_of(next(it))]
    resumed_data = Counting(n)
    resumed = DataLoader(resumed_data, batch_size=10, shuffle=True, seed=1)
    resumed.load_state_dict(loader.state_dict())
    rest = [i for b in resumed for i in indices_of(b)]
    assert sorted(delivered + rest) == list(range(n))
    assert resumed_data.fetched == rest  # only the 100 samples it delivered, once each


@pytest.mark.timeout(60)
def test_skipped_samples_are_never_fetched_by_workers(tmp_path):
    n = 400
    saving = DataLoader(Logged(n, tmp_path / "saving"), batch_size=8, shuffle=True, seed=2, num_workers=2)
    it = iter(saving)
    delivered = [i for _ in range(40) for i in indices_of(next(it))]
    state = saving.state_dict()
    del it
    data = Logged(n, tmp_path / "resumed")
    resumed = DataLoader(data, batch_size=8, shuffle=True, seed=2, num_workers=2)
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in indices_of(b)]
    assert sorted(delivered + rest) == list(range(n))
    assert sorted(data.fetched()) == sorted(rest)


# ------------------------------------------------------------ in_order=False
@pytest.mark.timeout(60)
@pytest.mark.parametrize("load_workers, load_in_order", [(2, False), (2, True), (0, True)])
def test_out_of_order_resume_delivers_every_remaining_sample_once(tmp_path, load_workers, load_in_order):
    """Batch 1 is held back until the state is saved, so batches after it were
    delivered first: the state lists them, and the resumed run loads batch 1
    and the rest, not them."""
    gate = tmp_path / "gate"
    reference = {tuple(indices_of(b)): plain(b) for b in DataLoader(Augmented(40), batch_size=4, seed=9)}
    loader = DataLoader(Gated(40, slow={4, 5, 6, 7}, gate=gate), batch_size=4, seed=9, num_workers=2, in_order=False)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    state = json_round_trip(loader.state_dict())
    gate.touch()
    del it, loader
    assert state["position"] == 1 and len(state["delivered_ahead"]) == 2, state
    resumed = DataLoader(Augmented(40), batch_size=4, seed=9, num_workers=load_workers, in_order=load_in_order)
    resumed.load_state_dict(state)
    tail = list(resumed)
    samples = [i for b in head + tail for i in indices_of(b)]
    assert sorted(samples) == list(range(40))  # every sample of the epoch exactly once
    for batch in head + tail:  # and each batch is the batch of that index, bit for bit
        assert plain(batch) == reference[tuple(indices_of(batch))]


# ------------------------------------------------------- delivery details
class FailsAt(Augmented):
    def __getitem__(self, i):
        if i == 9:
            raise KeyError(f"sample {i} is broken")
        return super().__getitem__(i)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_that_raised_counts_as_delivered(workers):
    """As torch moves past a batch whose loading raised, the resumed run does too."""
    loader = DataLoader(FailsAt(20), batch_size=4, seed=0, num_workers=workers)
    it = iter(loader)
    head = [indices_of(next(it)) for _ in range(2)]
    with pytest.raises(KeyError, match="sample 9"):
        next(it)
    state = loader.state_dict()
    del it
    assert state["position"] == 3
    resumed = DataLoader(FailsAt(20), batch_size=4, seed=0, num_workers=workers)
    resumed.load_state_dict(state)
    assert head + [indices_of(b) for b in resumed] == [[0, 1, 2, 3], [4, 5, 6, 7], [12, 13, 14, 15], [16, 17, 18, 19]]


@pytest.mark.timeout(60)
def test_the_state_counts_what_the_pin_thread_handed_out(monkeypatch):
    """With pin_memory the batches come through a thread that runs ahead; the
    state still counts only what reached the loop. (Numpy batches: pinning
    leaves them as they are, so this runs without an accelerator.)"""
    monkeypatch.setattr(DataLoader, "_warn_pin_memory", lambda self: True)
    expected = uninterrupted("shuffle-seed")[0]
    loader = make("shuffle-seed", 2, pin_memory=True)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    assert loader.state_dict()["position"] == 3 and it._pin_thread is not None
    state = loader.state_dict()
    resumed = make("shuffle-seed", 1, pin_memory=True)
    resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected
    assert head + [plain(b) for b in it] == expected  # finished, not dropped: its pin thread ends at once
