"""ShardedIterable: every item exactly once across workers and ranks, no
get_worker_info() boilerplate; the expensive transform runs only on the shard."""

import numpy as np
import pytest

import conveyor
import conveyor.torch as ct

pytestmark = pytest.mark.timeout(60)


def items(loader):
    return sorted(int(x) for batch in loader for x in np.asarray(batch).ravel())


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
def test_each_item_once_for_any_worker_count(num_workers):
    loader = conveyor.DataLoader(conveyor.ShardedIterable(list(range(23))), batch_size=4, num_workers=num_workers)
    assert items(loader) == list(range(23))


def test_ranks_and_workers_together_cover_everything_once():
    seen = []
    for rank in range(3):
        dataset = conveyor.ShardedIterable(range(50), num_replicas=3, rank=rank)
        seen += items(conveyor.DataLoader(dataset, batch_size=5, num_workers=2))
        assert len(dataset) == len(range(rank, 50, 3))
    assert sorted(seen) == list(range(50))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("replicas", [2, 3])
def test_len_is_what_each_ranks_loader_yields_for_any_worker_count(replicas, num_workers):
    """A rank's items do not depend on its number of workers, so len() holds
    and the loader has nothing to warn about."""
    import warnings

    for rank in range(replicas):
        dataset = conveyor.ShardedIterable(range(10), num_replicas=replicas, rank=rank)
        loader = conveyor.DataLoader(dataset, batch_size=None, num_workers=num_workers)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(loader) == len(dataset) == len(items(loader))


def test_transform_runs_only_on_this_shards_items(tmp_path):
    log = tmp_path / "calls"

    def expensive(i):
        with open(log, "a") as f:
            f.write(f"{i}\n")
        return i * 10

    dataset = conveyor.ShardedIterable(list(range(12)), transform=expensive)
    assert items(conveyor.DataLoader(dataset, batch_size=3, num_workers=2)) == [i * 10 for i in range(12)]
    assert sorted(int(x) for x in log.read_text().split()) == list(range(12))  # once each, no more


def test_flatten_and_callable_sources():
    def shards():
        return iter([[1, 2], [3], [4, 5, 6]])

    dataset = conveyor.ShardedIterable(shards, transform=lambda shard: [x * 2 for x in shard], flatten=True)
    assert items(conveyor.DataLoader(dataset, batch_size=2, num_workers=2)) == [2, 4, 6, 8, 10, 12]
    with pytest.raises(TypeError, match="no length"):
        len(dataset)


def test_torch_facade_version_is_a_torch_iterable_dataset():
    import torch.utils.data as tud

    dataset = ct.ShardedIterable(range(10))
    assert isinstance(dataset, tud.IterableDataset)
    assert items(tud.DataLoader(dataset, batch_size=3, num_workers=2)) == list(range(10))  # torch's workers too


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(source=42), TypeError),
        (dict(source=[1], num_replicas=2), ValueError),
        (dict(source=[1], num_replicas=2, rank=2), ValueError),
        (dict(source=[1], even="even"), ValueError),
        (dict(source=iter([1]), even="pad"), TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        conveyor.ShardedIterable(**kwargs)


def _rank_batches(n, replicas, workers, batch_size, even, drop_last=False):
    """Each rank's batches (as lists), for a job of ``replicas`` ranks."""
    out = []
    for rank in range(replicas):
        dataset = conveyor.ShardedIterable(list(range(n)), num_replicas=replicas, rank=rank, even=even)
        loader = conveyor.DataLoader(dataset, batch_size=batch_size, num_workers=workers, drop_last=drop_last)
        batches = [np.asarray(batch).tolist() for batch in loader]
        if not drop_last:
            assert sum(len(b) for b in batches) == len(dataset)
        out.append(batches)
    return out


@pytest.mark.parametrize(
    "n, replicas, workers, batch_size, drop_last",
    [
        (10, 3, 0, 2, False),
        (10, 3, 2, 2, False),
        (23, 2, 2, 4, False),
        (23, 4, 2, 3, True),
        (5, 3, 2, 4, False),
        (2, 3, 2, 1, False),
    ],
)
@pytest.mark.parametrize("even", ["drop", "pad"])
def test_even_gives_every_rank_as_many_batches(n, replicas, workers, batch_size, drop_last, even):
    per_rank = _rank_batches(n, replicas, workers, batch_size, even, drop_last)
    assert len({len(batches) for batches in per_rank}) == 1, per_rank
    seen = sorted(x for batches in per_rank for batch in batches for x in batch)
    if even == "drop" and not drop_last:
        assert seen == list(range(n // replicas * replicas))  # each once; the last n % R left out
    if even == "pad":
        assert set(range(n)) <= set(seen)  # each at least once; repeats only to fill up
        assert len(seen) == -(-n // replicas) * replicas or drop_last


def test_without_even_ranks_can_differ():
    per_rank = _rank_batches(9, 2, 2, 1, None)
    assert [len(batches) for batches in per_rank] == [5, 4]  # the hang every DDP user meets


def test_the_world_comes_from_torchrun_variables(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    dataset = conveyor.ShardedIterable(list(range(10)))
    assert dataset.world() == (4, 3)
    assert items(conveyor.DataLoader(dataset, batch_size=2)) == [3, 7]
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK=4 is not a rank of WORLD_SIZE=4"):
        len(dataset)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="not integers"):
        dataset.world()


@pytest.mark.filterwarnings("ignore:ShardedIterable")
def test_an_iterable_state_loads_only_on_the_same_rank_of_as_many_ranks():
    def loader(replicas, rank, num_workers=2):
        dataset = conveyor.ShardedIterable(list(range(40)), num_replicas=replicas, rank=rank)
        return conveyor.DataLoader(dataset, batch_size=2, num_workers=num_workers)

    saved_on = loader(2, 1)
    it = iter(saved_on)
    next(it)
    state = saved_on.state_dict()
    rest = [np.asarray(b).tolist() for b in it]
    same = loader(2, 1)
    same.load_state_dict(state)
    assert [np.asarray(b).tolist() for b in same] == rest
    with pytest.raises(ValueError, match=r"(?s)saved state: ranks=2.*this loader: ranks=3"):
        loader(3, 1).load_state_dict(state)
    with pytest.raises(ValueError, match=r"(?s)saved state: rank=1.*this loader: rank=0"):
        loader(2, 0).load_state_dict(state)
    with pytest.raises(ValueError, match=r"(?s)saved state: num_workers=2.*this loader: num_workers=1"):
        loader(2, 1, num_workers=1).load_state_dict(state)
