"""Exact mid-epoch resume (issue 5): DataLoader.state_dict / load_state_dict.

A loader rebuilt with the same arguments and loaded with a saved state yields,
bitwise, the batches the uninterrupted run would have yielded next (random
augmentations from random, numpy and torch included), for any num_workers at
save and at load, across epochs and with persistent workers, without fetching
the samples it skips. Also: in_order=False delivers every remaining sample
once, iterable datasets at num_workers=0, bad states, torch.save checkpoints,
DistributedSampler ranks, and conveyor.torch.StatefulDataLoader for torchdata
users.

Under fork (the default here) workers inherit this module, so module-level
datasets are fine.
"""

import json
import os
import random
import time
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conveyor
import conveyor.torch as ct
from conveyor import (
    DataLoader,
    DistributedSampler,
    SubsetRandomSampler,
    TokenBudgetBatchSampler,
    WeightedRandomSampler,
)

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

#: How long a gated sample waits for the test to open its gate; never asserted.
PATIENCE_S = 20.0


# ---------------------------------------------------------------- datasets
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
            Augmented(N), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True,
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


# ------------------------------------------------------ state semantics
def test_state_before_iterating_is_the_start_of_epoch_zero():
    loader = make("shuffle-torch-generator")
    state = json_round_trip(loader.state_dict())
    assert state["in_epoch"] is False and state["epoch"] == 0
    resumed = make("shuffle-torch-generator", other=True)
    resumed.load_state_dict(state)
    assert run_epochs(resumed, 0, EPOCHS) == uninterrupted("shuffle-torch-generator")


def test_state_after_an_epoch_is_the_start_of_the_next():
    loader = make("shuffle-numpy-generator")
    list(loader)
    state = loader.state_dict()
    assert state["in_epoch"] is False and state["epoch"] == 1
    resumed = make("shuffle-numpy-generator", other=True)
    resumed.load_state_dict(state)
    assert run_epochs(resumed, 1, EPOCHS) == uninterrupted("shuffle-numpy-generator")[1:]


def test_state_after_the_last_batch_resumes_an_empty_rest_of_epoch():
    """As torchdata: until StopIteration the iterator is still inside its epoch."""
    expected = uninterrupted("shuffle-seed")
    loader = make("shuffle-seed")
    it = iter(loader)
    for _ in expected[0]:
        next(it)
    state = loader.state_dict()
    assert state["in_epoch"] is True and state["position"] == len(expected[0])
    resumed = make("shuffle-seed")
    resumed.load_state_dict(state)
    assert list(resumed) == []
    assert [plain(b) for b in resumed] == expected[1]


def test_state_describes_an_abandoned_iteration():
    expected = uninterrupted("shuffle-seed")
    loader = make("shuffle-seed")
    for count, _ in enumerate(loader, 1):
        if count == 4:
            break
    resumed = make("shuffle-seed")
    resumed.load_state_dict(loader.state_dict())
    assert [plain(b) for b in resumed] == expected[0][4:]


def test_state_after_loading_is_the_loaded_state():
    loader = make("subset")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = make("subset", other=True)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


def test_state_is_small_plain_json_with_version_and_checksum():
    for name in NAMES:
        loader = make(name)
        it = iter(loader)
        next(it)
        state = loader.state_dict()
        text = json.dumps(state)
        assert json.loads(text) == state, name
        assert state["version"] == conveyor.state.STATE_VERSION and state["kind"] == "DataLoader" and "checksum" in state
        # torch generator states are 5 kB (base64); the rest is a few hundred bytes
        assert len(text) < (16_000 if "torch" in name or name == "subset" else 2_000), (name, len(text))


def test_set_epoch_keeps_the_resume_point_of_its_epoch_only():
    loader = make("shuffle-seed")
    loader.set_epoch(2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    resumed = make("shuffle-seed")
    resumed.load_state_dict(state)
    with pytest.warns(UserWarning, match="drops the resume point"):
        resumed.set_epoch(3)
    assert run_epochs(resumed, 3, 4) == run_epochs(make("shuffle-seed"), 3, 4)  # all of epoch 3
    resumed = make("shuffle-seed")
    resumed.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resumed.set_epoch(2)
    assert len(list(resumed)) == len(loader) - 1


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


# ------------------------------------------------- checkpoints and ranks
def test_state_goes_into_a_torch_checkpoint(tmp_path):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make("shuffle-torch-generator")
    it = iter(loader)
    next(it), next(it)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()},
               tmp_path / "ckpt.pt")
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    resumed = make("shuffle-torch-generator", other=True)
    resumed.load_state_dict(checkpoint["loader"])
    assert [plain(b) for b in resumed] == uninterrupted("shuffle-torch-generator")[0][2:]


def test_numpy_generator_state_survives_torch_load_weights_only(tmp_path):
    loader = make("shuffle-numpy-generator")
    it = iter(loader)
    next(it)
    torch.save(loader.state_dict(), tmp_path / "s.pt")
    resumed = make("shuffle-numpy-generator", other=True)
    resumed.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert [plain(b) for b in resumed] == uninterrupted("shuffle-numpy-generator")[0][1:]


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
    checkpoint = torch.load(_saved(checkpoint), weights_only=True)
    for rank in (0, 1):
        resumed = rank_loader(rank, workers=2)
        resumed.load_state_dict(checkpoint[rank])
        resumed.set_epoch(0)
        assert [heads[rank] + [plain(b) for b in resumed]] + run_epochs(resumed, 1, 2) == expected[rank]


def _saved(obj):
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return buffer


# ------------------------------------------------------------- bad input
def saved_state(name="shuffle-seed", position=2):
    loader = make(name)
    it = iter(loader)
    for _ in range(position):
        next(it)
    return loader.state_dict()


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: DataLoader(Augmented(N + 1), batch_size=4, shuffle=True, seed=7), "dataset_length=37"),
        (lambda: DataLoader(Augmented(N), batch_size=5, shuffle=True, seed=7), "batch_size=4"),
        (lambda: DataLoader(Augmented(N), batch_size=4, seed=7), "sampler='BatchSampler(RandomSampler)'"),
        (lambda: DataLoader(Augmented(N), batch_size=4, shuffle=True, seed=8), "seed=7"),
        (lambda: DataLoader(Augmented(N), batch_size=4, shuffle=True, drop_last=True, seed=7), "drop_last=False"),
        (lambda: DataLoader(Augmented(N), batch_size=4, shuffle=True), "generator='seed'"),
        (lambda: ct.DataLoader(Augmented(N), batch_size=4, shuffle=True, seed=7), "flavor='numpy'"),
    ],
)
def test_a_state_from_another_loader_is_refused_showing_both_sides(build, fragment):
    with pytest.raises(ValueError) as error:
        build().load_state_dict(saved_state())
    message = str(error.value)
    assert fragment in message and "this loader:" in message and "Fix:" in message


def test_a_state_of_another_version_or_kind_is_refused():
    state = saved_state()
    other = conveyor.state.STATE_VERSION - 1
    with pytest.raises(ValueError, match=rf"version={other}") as error:
        make("shuffle-seed").load_state_dict({**state, "version": other})
    assert f"this loader: version={conveyor.state.STATE_VERSION}" in str(error.value)
    with pytest.raises(ValueError, match="kind='RandomSampler'"):
        make("shuffle-seed").load_state_dict(make("shuffle-seed").sampler.state_dict())
    with pytest.raises(TypeError, match="state_dict"):
        make("shuffle-seed").load_state_dict([1, 2])


def test_a_truncated_or_edited_state_never_loads():
    state = saved_state()
    truncated = {key: value for key, value in state.items() if key != "delivered_ahead"}
    with pytest.raises(ValueError, match="lacks"):
        make("shuffle-seed").load_state_dict(truncated)
    for edit in ({"position": 3}, {"epoch": 1}, {"base_seed": state["base_seed"] + 1},
                 {"delivered_ahead": [5]}, {"sampler": {**state["sampler"], "position": 9}}):
        loader = make("shuffle-seed")
        with pytest.raises(ValueError, match="changed after it was saved"):
            loader.load_state_dict({**state, **edit})
        assert loader.state_dict()["in_epoch"] is False  # nothing was loaded
    text = json.dumps(state)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text[: len(text) // 2])


def test_a_failed_load_changes_nothing():
    loader = make("shuffle-seed")
    before = loader.state_dict()
    with pytest.raises(ValueError):
        loader.load_state_dict({**saved_state(), "checksum": "00000000"})
    assert loader.state_dict() == before
    assert [plain(b) for b in loader] == uninterrupted("shuffle-seed")[0]


def test_loading_while_iterating_applies_to_the_next_iteration():
    """As torchdata's StatefulDataLoader: the state waits for the next
    iter(); an iterator already running goes on with its own batches."""
    loader = make("shuffle-seed")
    epochs = uninterrupted("shuffle-seed")
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = loader.state_dict()
    old = iter(loader)  # epoch 1 begins
    next(old)
    loader.load_state_dict(state)
    assert loader.state_dict() == state
    assert [plain(b) for b in loader] == epochs[0][3:]  # the loaded point of epoch 0
    assert head + [plain(b) for b in it] == epochs[0]  # the first iterator was not disturbed


def test_a_sampler_refusing_its_state_leaves_everything_as_it_was():
    loader = make("shuffle-seed")
    before = loader.state_dict()
    bad = {**saved_state(), "sampler": {"version": 1, "kind": "SomethingElse"}}
    bad["checksum"] = conveyor.state_format.checksum(bad)
    with pytest.raises(ValueError):
        loader.load_state_dict(bad)
    assert loader.state_dict() == before
    assert [plain(b) for b in loader] == uninterrupted("shuffle-seed")[0]


def test_torchdata_states_and_empty_states():
    loader = make("shuffle-seed")
    with pytest.raises(ValueError, match="torchdata"):
        loader.load_state_dict({"_snapshot": {}, "_steps_since_snapshot": 0})
    loader.load_state_dict({})  # torchdata's "nothing to load"
    assert [plain(b) for b in loader] == uninterrupted("shuffle-seed")[0]


# --------------------------------------------------------- iterable datasets
class Position:
    """An iterator over ``range(n)`` with random noise, resumable by position."""

    def __init__(self, n):
        self.n, self.i, self.produced = n, 0, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        self.produced += 1
        return np.array([self.i - 1, np.random.rand()])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class StatefulIteratorStream(conveyor.IterableDataset):
    def __init__(self, n=23):
        self.n = n
        self.iterators = []

    def __iter__(self):
        self.iterators.append(Position(self.n))
        return self.iterators[-1]


class StatefulStream(conveyor.IterableDataset):
    """The dataset itself keeps the position (its __iter__ is a generator)."""

    def __init__(self, n=23):
        self.n, self.start = n, 0

    def __iter__(self):
        for i in range(self.start, self.n):
            self.start = i + 1
            yield np.array([i, np.random.rand()])
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


class PlainStream(conveyor.IterableDataset):
    def __init__(self, n=23):
        self.n = n

    def __iter__(self):
        info = conveyor.get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, self.n, step):
            yield np.array([i, np.random.rand()])


@pytest.mark.parametrize("Stream", [StatefulIteratorStream, StatefulStream])
def test_iterable_dataset_with_state_resumes_exactly_in_process(Stream):
    expected = [plain(b) for b in DataLoader(Stream(), batch_size=4, seed=0)]
    loader = DataLoader(Stream(), batch_size=4, seed=0)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = json_round_trip(loader.state_dict())
    del it
    dataset = Stream()
    resumed = DataLoader(dataset, batch_size=4, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fast-forward warning: nothing is re-read
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected
    if isinstance(dataset, StatefulIteratorStream):
        assert dataset.iterators[0].produced == 23 - 12  # the resumed iterator produced only the rest


def test_iterable_dataset_without_state_is_fast_forwarded_with_a_warning():
    expected = [plain(b) for b in DataLoader(PlainStream(), batch_size=4, seed=0)]
    loader = DataLoader(PlainStream(), batch_size=4, seed=0)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(2)]
    resumed = DataLoader(PlainStream(), batch_size=4, seed=0)
    with pytest.warns(UserWarning, match="reads again, without collating or sending them, the items of the 2 batches"):
        resumed.load_state_dict(loader.state_dict())
    assert head + [plain(b) for b in resumed] == expected


@pytest.mark.timeout(60)
def test_iterable_dataset_without_state_with_workers_needs_the_same_worker_count():
    expected = [plain(b) for b in DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)]
    loader = DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(3)]
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers=2"):
        DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=1).load_state_dict(state)
    resumed = DataLoader(PlainStream(), batch_size=3, seed=0, num_workers=2)
    with pytest.warns(UserWarning, match="reads again"):
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected


class ShardPosition:
    """Worker w's iterator over its shard: w*1000, w*1000+1, ...; the state is the position."""

    def __init__(self, worker, size):
        self.worker, self.size, self.i = worker, size, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.size:
            raise StopIteration
        self.i += 1
        return np.array([self.worker * 1000 + self.i - 1, np.random.rand()])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class ShardedStatefulStream(conveyor.IterableDataset):
    """Shards of uneven sizes (workers run out at different times)."""

    def __init__(self, sizes):
        self.sizes = sizes

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker = info.id if info else 0
        return ShardPosition(worker, self.sizes[worker])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_after", [1, 4, 7, 9])
def test_iterable_dataset_state_inside_workers_resumes_exactly(stop_after):
    """Each worker's iterator state travels with its batches; a resumed loader
    puts every copy back, retires the workers that had run out, and continues
    the round robin where it stood, without re-reading anything."""
    sizes = [9, 3, 14]
    settings = dict(batch_size=2, seed=0, num_workers=3)
    expected = [plain(b) for b in DataLoader(ShardedStatefulStream(sizes), **settings)]
    loader = DataLoader(ShardedStatefulStream(sizes), **settings)
    it = iter(loader)
    head = [plain(next(it)) for _ in range(stop_after)]
    state = json_round_trip(loader.state_dict())
    del it
    resumed = DataLoader(ShardedStatefulStream(sizes), **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exact: no re-reading, no warning
        resumed.load_state_dict(state)
    assert head + [plain(b) for b in resumed] == expected
    uninterrupted = DataLoader(ShardedStatefulStream(sizes), **settings)
    list(uninterrupted)
    assert [plain(b) for b in resumed] == [plain(b) for b in uninterrupted], "the next epoch follows on"


@pytest.mark.timeout(60)
def test_iterable_dataset_state_inside_workers_needs_the_same_worker_count():
    loader = DataLoader(ShardedStatefulStream([5, 5]), batch_size=2, seed=0, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    with pytest.raises(ValueError, match="num_workers"):
        DataLoader(ShardedStatefulStream([5, 5]), batch_size=2, seed=0, num_workers=1).load_state_dict(state)


# ------------------------------------------------------ torchdata users
def test_stateful_dataloader_is_the_same_loader_with_torchdata_arguments():
    loader = ct.StatefulDataLoader(Augmented(N), batch_size=4, shuffle=True, seed=7, snapshot_every_n_steps=10)
    assert isinstance(loader, ct.DataLoader) and isinstance(loader, ct.Stateful)
    assert isinstance(loader.sampler, conveyor.Stateful) and not isinstance([], conveyor.Stateful)
    assert ct.StatefulDataLoader(Augmented(N), snapshot_every_n_steps=None).snapshot_every_n_steps is None
    assert ct.StatefulDataLoader(Augmented(N), snapshot_every_n_steps=0).snapshot_every_n_steps == 0  # as torchdata
    with pytest.raises(ValueError, match="snapshot_every_n_steps"):
        ct.StatefulDataLoader(Augmented(N), snapshot_every_n_steps=-1)


def torchdata_style_run(StatefulDataLoader, shuffle):
    """A training loop written against torchdata's API: two epochs, interrupted
    after batch 5 of the first one, restarted from the saved state."""
    data = ct.TensorDataset(torch.arange(50))

    def build():
        return StatefulDataLoader(data, batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(3),
                                  snapshot_every_n_steps=1)

    loader = build()
    uninterrupted = [[b[0].tolist() for b in loader] for _ in range(2)]
    loader = build()
    loader.load_state_dict({})  # torchdata: nothing to load
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(5)]
    checkpoint = torch.load(_saved({"loader": loader.state_dict()}), weights_only=False)
    resumed = build()
    resumed.load_state_dict(checkpoint["loader"])
    resumed_run = [head + [b[0].tolist() for b in resumed], [b[0].tolist() for b in resumed]]
    return uninterrupted, resumed_run


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")
def test_torchdata_code_runs_unchanged_on_conveyor():
    """Each loader resumes its interrupted epoch as its own uninterrupted run.
    Without shuffling both give the same batches; with it torchdata's own
    RandomSampler draws another order than torch.utils.data, which
    conveyor.torch follows. (torchdata 0.11's epoch after the resumed one
    differs from its uninterrupted run when a generator is passed; conveyor's
    does not.)"""
    torchdata = pytest.importorskip("torchdata.stateful_dataloader")
    for shuffle in (False, True):
        mine, resumed = torchdata_style_run(ct.StatefulDataLoader, shuffle)
        assert resumed == mine
        theirs, theirs_resumed = torchdata_style_run(torchdata.StatefulDataLoader, shuffle)
        assert theirs_resumed[0] == theirs[0]
        if not shuffle:
            assert mine == theirs


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


def test_a_loader_with_a_saved_position_still_pickles():
    import pickle

    loader = make("shuffle-seed")
    it = iter(loader)
    next(it)
    del it
    copy = pickle.loads(pickle.dumps(loader))
    assert copy.state_dict() == loader.state_dict()


def test_set_epoch_after_loading_another_epoch_warns_once():
    loader = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    resumed = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    resumed.load_state_dict(state)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.set_epoch(3)
    assert len([w for w in caught if "drops the resume point" in str(w.message)]) == 1, [str(w.message) for w in caught]
    fresh = DataLoader(list(range(20)), batch_size=4, shuffle=True, seed=1)
    fresh.set_epoch(3)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in fresh]


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
    ["stateful sampler", "stateful batch_sampler", "torch RandomSampler with a generator", "torch BatchSampler over it"],
)
def test_the_users_own_sampler_resumes_exactly(kind, num_workers):
    expected, seen = _resume_in_second_epoch(kind, num_workers)
    assert seen == expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["torch RandomSampler, global generator", "batch sampler without state"])
def test_a_sampler_that_cannot_be_replayed_says_so_instead_of_yielding_other_samples(kind):
    with pytest.raises(RuntimeError, match="cannot resume exactly: the (batch_)?sampler .* gave another first batch"):
        _resume_in_second_epoch(kind, 0)


class OwnIterator(conveyor.IterableDataset):
    """An iterable dataset that is its own iterator: ``__iter__`` sets up its
    position (its worker's share) and returns ``self``."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        share = self.n // workers
        self.at, self.end = share * worker, share * (worker + 1)
        return self

    def __next__(self):
        if self.at >= self.end:
            raise StopIteration
        self.at += 1
        return self.at - 1

    def state_dict(self):
        return {"at": self.at, "end": self.end}

    def load_state_dict(self, state):
        self.at, self.end = state["at"], state["end"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_that_is_its_own_iterator_resumes_where_it_stood(num_workers):
    """Its state is restored after iter() (which sets its position up), as torchdata does."""
    loader = DataLoader(OwnIterator(40), batch_size=None, num_workers=num_workers)
    it = iter(loader)
    seen = [int(next(it)) for _ in range(30)]
    state = json_round_trip(loader.state_dict())
    del it, loader
    resumed = DataLoader(OwnIterator(40), batch_size=None, num_workers=num_workers)
    resumed.load_state_dict(state)
    seen += [int(x) for x in resumed]
    assert sorted(seen) == list(range(40))


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


class CountsItsEpochs(conveyor.IterableDataset):
    """Each worker's copy counts the epochs it has served (persistent workers
    keep it) and tags its items with that count; the copies run out at
    different times."""

    def __init__(self):
        self.epoch = 0

    def __iter__(self):
        info = conveyor.get_worker_info()
        sizes = [2, 6]
        start = sum(sizes[: info.id])
        for i in range(start, start + sizes[info.id]):
            yield i, self.epoch
        self.epoch += 1

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


@pytest.mark.timeout(60)
def test_persistent_workers_copies_carry_their_state_across_a_resume_between_epochs():
    def make():
        return DataLoader(CountsItsEpochs(), batch_size=None, num_workers=2, persistent_workers=True)

    def tagged(loader):
        return sorted((int(i), int(e)) for i, e in loader)

    loader = make()
    tagged(loader)
    state = json_round_trip(loader.state_dict())  # the end of epoch 0
    expected = tagged(loader)
    assert {e for _, e in expected} == {1}
    resumed = make()
    resumed.load_state_dict(state)
    assert tagged(resumed) == expected
    assert {e for _, e in tagged(resumed)} == {2}, "and the epoch after"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("Stream", [PlainStream, lambda: ShardedStatefulStream([14, 9])])
def test_iterable_dataset_resumes_with_in_order_false_too(Stream):
    """Each worker's copy is saved as of its own delivered batches, so the
    order batches arrived in does not matter: every item once across the
    interruption."""
    def items(batches):
        return [int(x) for b in batches for x in np.asarray(b).reshape(len(b), -1)[:, 0]]

    loader = DataLoader(Stream(), batch_size=3, seed=0, num_workers=2, in_order=False)
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (PlainStream: items are read again; said elsewhere)
        state = json_round_trip(loader.state_dict())
        del it
        resumed = DataLoader(Stream(), batch_size=3, seed=0, num_workers=2, in_order=False)
        resumed.load_state_dict(state)
        rest = list(resumed)
    expected = sorted(items(DataLoader(Stream(), batch_size=3, seed=0, num_workers=2)))
    assert sorted(items(head) + items(rest)) == expected


def _distributed_loader(n, replicas, rank, num_workers=0, module=None):
    module = module or conveyor
    dataset = list(range(n))
    sampler = module.DistributedSampler(dataset, num_replicas=replicas, rank=rank, shuffle=True, seed=5)
    return module.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=num_workers)


def _items(batches):
    return [int(i) for batch in batches for i in np.asarray(batch).ravel()]


@pytest.mark.parametrize("n, batches, saved_on, loaded_on", [(40, 3, 2, 3), (40, 3, 2, 1), (41, 2, 3, 2), (40, 4, 2, 4), (40, 5, 2, 3)])
def test_a_state_saved_on_one_world_size_resumes_on_another(n, batches, saved_on, loaded_on):
    consumed, states = [], []
    for rank in range(saved_on):  # a synchronous job: every rank at the same batch
        loader = _distributed_loader(n, saved_on, rank)
        it = iter(loader)
        consumed += _items(next(it) for _ in range(batches))
        states.append(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for rank in range(loaded_on):  # each new rank loads rank 0's state
        loader = _distributed_loader(n, loaded_on, rank, num_workers=2 if rank == 0 else 0)
        loader.load_state_dict(states[0])
        rest.append(_items(loader))
    assert len({len(part) for part in rest}) == 1  # every new rank as many samples
    seen = consumed + [i for part in rest for i in part]
    assert set(seen) == set(range(n))  # the rest of the epoch covered...
    padding = len(seen) - n
    assert 0 <= padding < loaded_on  # ...once, but for the padding that evens the new ranks out
    read_again = set(consumed) & {i for part in rest for i in part}
    assert len(read_again) <= padding  # nothing consumed is read again, but for that padding
    later = _distributed_loader(n, loaded_on, 0)
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
