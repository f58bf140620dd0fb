"""An iterable dataset's epoch reaches every worker's copy (issue 32, item 5).

    ds.set_epoch(e) and/or loader.set_epoch(e), three epochs
        persistent workers (fork, spawn, threads) ──▶ three orders, each the one
        non-persistent workers give (their copies are the main process's, made anew each pass)
    for ShardDataset.stream(), ShardedIterable over a source that reorders per
    epoch, a plain IterableDataset with set_epoch (and one whose epoch cannot be
    read: it follows loader.set_epoch)
    a state saved with persistent workers, inside an epoch or between two
        ──▶ the resumed run gives the rest of those same epochs

Ray actors: tests/integrations/test_ray_workers.py.
"""

from __future__ import annotations

from typing import Optional

import pytest

import conveyor
from conveyor import DataLoader, ShardedIterable
from conveyor.cli import main as cli
from conveyor.shards import ShardDataset
from epoch_datasets import EpochShuffled, HiddenEpoch, ResumableEpochs, ShuffledSource
from resume_helpers import json_round_trip

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.xdist_group("stream_epochs"),  # (one worker packs the module's shards once)
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
]

EPOCHS = 3
WORKERS = {
    "fork": dict(multiprocessing_context="fork"),
    "spawn": dict(multiprocessing_context="spawn"),
    "threads": dict(worker_method="thread"),
}


def values(batch) -> list:
    return (batch["cls"] if isinstance(batch, dict) else batch).tolist()


def run(dataset, calls: str, persistent: bool, workers: str = "fork", batch_size: int = 4) -> list:
    """Every epoch's batches, as a training loop that calls ``calls``'s
    set_epoch ("dataset", "loader" or "both") before each epoch."""
    loader = DataLoader(
        dataset, batch_size=batch_size, num_workers=2, persistent_workers=persistent, **WORKERS[workers]
    )
    epochs = []
    for epoch in range(EPOCHS):
        if calls in ("dataset", "both"):
            dataset.set_epoch(epoch)
        if calls in ("loader", "both"):
            loader.set_epoch(epoch)
        epochs.append([values(batch) for batch in loader])
    return epochs


def assert_follows_the_epoch(make, calls: str = "both", workers: str = "fork") -> None:
    """Persistent workers give each epoch the batches fresh workers give, and the epochs differ."""
    fresh = run(make(), calls, persistent=False, workers=workers)
    kept = run(make(), calls, persistent=True, workers=workers)
    assert kept == fresh
    assert len({repr(epoch) for epoch in kept}) == EPOCHS, "each epoch in its own order"


@pytest.mark.parametrize("workers", ["fork", "spawn", "threads"])
def test_persistent_workers_follow_the_epoch_of_a_dataset_with_set_epoch(workers):
    assert_follows_the_epoch(EpochShuffled, "both", workers)


@pytest.mark.parametrize("calls", ["dataset", "loader"])
@pytest.mark.parametrize("workers", ["fork", "threads"])
def test_either_set_epoch_alone_reaches_persistent_workers(calls, workers):
    """The dataset's own set_epoch (read back from its ``epoch``), or the loader's (passed on to the dataset)."""
    assert_follows_the_epoch(EpochShuffled, calls, workers)


@pytest.mark.parametrize("workers", ["fork", "threads"])
def test_a_dataset_whose_epoch_cannot_be_read_follows_loader_set_epoch(workers):
    assert_follows_the_epoch(HiddenEpoch, "loader", workers)


@pytest.mark.parametrize("workers", ["fork", "threads"])
def test_sharded_iterable_passes_the_epoch_on_to_its_source(workers):
    assert_follows_the_epoch(lambda: ShardedIterable(ShuffledSource()), "both", workers)
    assert_follows_the_epoch(lambda: ShardedIterable(ShuffledSource()), "loader", workers)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """8 shards of 4 samples, numbered 0..31 in ``cls``."""
    out = tmp_path_factory.mktemp("shards") / "out"
    assert cli(["pack", "epoch_datasets:numbered", str(out), "--max-samples", "4", "--workers", "1"]) == 0
    return out


@pytest.mark.parametrize("workers", ["fork", "spawn", "threads"])
def test_a_shard_stream_takes_a_new_shard_order_each_epoch_with_persistent_workers(shards, workers):
    assert_follows_the_epoch(lambda: ShardDataset(shards).stream(shuffle_shards=True, seed=0), "both", workers)


@pytest.mark.parametrize("workers", ["fork", "threads"])
def test_a_windowed_shard_stream_takes_a_new_block_order_each_epoch_with_persistent_workers(shards, workers):
    stream = lambda: ShardDataset(shards).stream(shuffle_shards=True, seed=0, shards_per_window=2)  # noqa: E731
    assert_follows_the_epoch(stream, "both", workers)


def test_no_set_epoch_keeps_one_order_as_fresh_workers_do():
    fresh = run(EpochShuffled(), "neither", persistent=False)
    assert run(EpochShuffled(), "neither", persistent=True) == fresh == [fresh[0]] * EPOCHS


# ------------------------------------------------------------------ resume
def rest_after_a_save(epoch: int, position: Optional[int], workers: str) -> list:
    """Epochs 0..EPOCHS-1 of a persistent loader over ResumableEpochs whose
    run was saved after ``position`` batches of ``epoch`` (None: between
    ``epoch - 1`` and ``epoch``) and resumed by a new loader."""

    def make():
        dataset = ResumableEpochs()
        loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=True, **WORKERS[workers])
        return dataset, loader

    dataset, loader = make()
    seen = []
    for e in range(epoch):
        dataset.set_epoch(e)
        loader.set_epoch(e)
        seen.append([values(b) for b in loader])
    head = []
    if position is None:
        state = json_round_trip(loader.state_dict())
    else:
        dataset.set_epoch(epoch)
        loader.set_epoch(epoch)
        it = iter(loader)
        head = [values(next(it)) for _ in range(position)]
        state = json_round_trip(loader.state_dict())
        del it
    del loader
    dataset, resumed = make()
    dataset.set_epoch(epoch)  # (what a training loop does on restart)
    resumed.load_state_dict(state)
    resumed.set_epoch(epoch)
    seen.append(head + [values(b) for b in resumed])
    for e in range(epoch + 1, EPOCHS):
        dataset.set_epoch(e)
        resumed.set_epoch(e)
        seen.append([values(b) for b in resumed])
    return seen


SAVES = {"inside": (1, 3), "at-start": (1, 0), "between-0-1": (1, None), "between-1-2": (2, None)}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "workers, save", [(w, save) for w in ("fork", "threads") for save in SAVES] + [("spawn", "between-0-1")]
)
def test_a_state_saved_with_persistent_workers_resumes_the_same_epochs(workers, save):
    epoch, position = SAVES[save]
    expected = run(ResumableEpochs(), "both", persistent=False, workers=workers, batch_size=2)
    assert len({repr(e) for e in expected}) == EPOCHS
    assert rest_after_a_save(epoch, position, workers) == expected


def test_a_set_epoch_that_raises_in_a_worker_names_the_call():
    """What a user's set_epoch raises in a worker names the call."""

    class Refuses(EpochShuffled):
        def set_epoch(self, epoch: int) -> None:
            if conveyor.get_worker_info() is not None:
                raise RuntimeError("not in a worker")
            super().set_epoch(epoch)

    dataset = Refuses()
    loader = DataLoader(dataset, batch_size=4, num_workers=1, persistent_workers=True)
    assert len(list(loader)) == 4
    loader.set_epoch(1)
    with pytest.raises(RuntimeError, match="not in a worker") as caught:
        list(loader)
    assert "Refuses.set_epoch(1) in worker 0" in str(caught.value)
