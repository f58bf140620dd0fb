"""Locality for shards: the block order (shards shuffled per epoch, samples
shuffled only within a window of K shards) of ShardBlockSampler and of
ShardDataset.stream(shards_per_window=K).

Every sample once per epoch; a window's samples fill one span of positions,
and each shard's lie within its window's; a new order each epoch; the same
batches for 0 and 2 workers, processes and threads (the sampler), the same
samples and the same order within each window (the stream); each shard read
by one worker per epoch (the stream) and downloaded once per epoch from a
store with a small cache (the sampler, two worker processes sharing the
cache); exact resume mid-epoch; bad arguments refused at construction.
bench/locality.py measures the bytes downloaded per epoch."""

from __future__ import annotations

import io
import json
import os
import tarfile
import types
from collections import defaultdict

import numpy as np
import pytest

import conveyor
from conveyor import ShardBlockSampler
from conveyor.shards import ShardDataset, ShardIndex

pytestmark = [pytest.mark.timeout(120), pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")]

#: Samples per shard (one empty); sample k's text is str(k), numbered across the shards.
SIZES = [5, 3, 7, 0, 4, 6, 2, 5, 3, 4, 6, 1]
K = 3


def write_shards(folder, sizes=SIZES) -> None:
    k = 0
    for number, count in enumerate(sizes):
        with tarfile.open(folder / f"shard-{number:03d}.tar", "w") as tar:
            for _ in range(count):
                data = str(k).encode() * 50
                member = tarfile.TarInfo(f"{k:06d}.txt")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                k += 1


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    write_shards(folder)
    return folder


def number(sample: dict) -> int:
    return int(sample["txt"][: len(sample["txt"]) // 50])


def number_and_worker(sample: dict) -> tuple[int, int]:
    info = conveyor.get_worker_info()
    return number(sample), info.id if info is not None else -1


def shard_of(dataset: ShardDataset, index: int) -> int:
    return dataset.locate(index)[0]


# ------------------------------------------------------------------ the sampler's order


def test_every_sample_once_per_epoch_in_a_new_order_each_epoch(folder):
    dataset = ShardDataset(folder)
    sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=5)
    epochs = [list(sampler) for _ in range(3)]
    for order in epochs:
        assert sorted(order) == list(range(len(dataset)))
    assert epochs[0] != epochs[1] != epochs[2]
    assert [sampler.epoch_order(e).shard_order.tolist() for e in range(2)] != [list(range(len(SIZES)))] * 2
    assert list(ShardBlockSampler(dataset, shards_per_window=K, seed=6)) != epochs[0]  # (another seed)


@pytest.mark.parametrize("shards_per_window", [1, 2, K, 5, len(SIZES), 100])
def test_each_shards_samples_lie_within_its_windows_span(folder, shards_per_window):
    dataset = ShardDataset(folder)
    sampler = ShardBlockSampler(dataset, shards_per_window=shards_per_window, seed=2)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        order = list(sampler)
        blocks = sampler.epoch_order(epoch)
        assert blocks.num_windows == -(-len(SIZES) // shards_per_window)
        for window in range(blocks.num_windows):
            span = blocks.window_span(window)
            shards = set(blocks.window_shards(window).tolist())
            assert len(span) == sum(SIZES[s] for s in shards)
            assert {shard_of(dataset, order[p]) for p in span} <= shards  # (the window's samples fill its span)
        positions = defaultdict(list)
        for p, index in enumerate(order):
            positions[shard_of(dataset, index)].append(p)
        for shard, where in positions.items():
            window = int(blocks.window_of(np.array([where[0]]))[0])
            assert shard in blocks.window_shards(window).tolist()
            assert blocks.window_span(window).start <= min(where) and max(where) < blocks.window_span(window).stop


def test_ranks_take_their_share_of_one_order_and_cover_it(folder):
    dataset = ShardDataset(folder)
    whole = list(ShardBlockSampler(dataset, K, seed=1))
    ranks = [list(ShardBlockSampler(dataset, K, seed=1, num_replicas=3, rank=r)) for r in range(3)]
    padded = whole + whole[: (-len(whole)) % 3]
    assert ranks == [padded[r::3] for r in range(3)]
    cut = [list(ShardBlockSampler(dataset, K, seed=1, num_replicas=4, rank=r, drop_last=True)) for r in range(4)]
    assert sorted(i for share in cut for i in share) == sorted(whole[: len(whole) // 4 * 4])


@pytest.mark.parametrize(
    "kind", [dict(num_workers=2), dict(num_workers=2, worker_method="thread")], ids=["processes", "threads"]
)
def test_the_same_batches_for_any_number_of_workers(folder, kind):
    def batches(**options):
        dataset = ShardDataset(folder, transform=number)
        sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=3)
        loader = conveyor.DataLoader(dataset, 4, sampler=sampler, collate_fn=list, **options)
        return [batch for _ in range(2) for batch in loader]

    base = batches()
    assert batches(**kind) == base
    dataset = ShardDataset(folder)
    sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=3)
    assert [i for b in base for i in b] == list(sampler) + list(sampler)  # (the samples the sampler names)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_the_sampler_resumes_exactly_mid_epoch(folder, num_workers):
    def loader():
        dataset = ShardDataset(folder, transform=number)
        sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=4)
        return conveyor.DataLoader(dataset, 3, sampler=sampler, num_workers=num_workers, collate_fn=list)

    full = list(loader())
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    inner = state["sampler"]["sampler"]  # (the BatchSampler's, over the ShardBlockSampler's)
    assert inner["kind"] == "ShardBlockSampler" and inner["rng"] is None  # (nothing of the order is stored)
    assert all(isinstance(value, (int, bool, str)) for key, value in inner.items() if key != "rng")


def test_a_sampler_resumes_anywhere_without_computing_the_positions_before(folder):
    dataset = ShardDataset(folder)
    whole = list(ShardBlockSampler(dataset, K, seed=8))
    for at in (0, 1, 17, len(whole) - 1, len(whole)):
        sampler = ShardBlockSampler(dataset, K, seed=8)
        it = iter(sampler)
        for _ in range(at):
            next(it)
        state = sampler.state_dict()
        again = ShardBlockSampler(dataset, K, seed=8)
        again.load_state_dict(state)
        assert list(again) == whole[at:]


def rank_loader(dataset, replicas, rank, num_workers=0):
    sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=9, num_replicas=replicas, rank=rank)
    return conveyor.DataLoader(dataset, 4, sampler=sampler, num_workers=num_workers, collate_fn=list)


@pytest.mark.parametrize("batches, saved_on, loaded_on", [(3, 2, 3), (2, 3, 2), (4, 2, 1), (1, 1, 4)])
def test_a_state_saved_on_one_number_of_ranks_resumes_on_another(folder, batches, saved_on, loaded_on):
    dataset = ShardDataset(folder, transform=number)
    n = len(dataset)
    consumed, states = [], []
    for rank in range(saved_on):  # a synchronous job: every rank at the same batch
        loader = rank_loader(dataset, saved_on, rank)
        it = iter(loader)
        consumed += [i for _ in range(batches) for i in next(it)]
        states.append(json.loads(json.dumps(loader.state_dict())))
    rest = []
    for rank in range(loaded_on):  # each new rank loads rank 0's state
        loader = rank_loader(dataset, loaded_on, rank, num_workers=2 if rank == 0 else 0)
        loader.load_state_dict(states[0])
        rest.append([i for batch in loader for i in batch])
    assert len({len(part) for part in rest}) == 1  # every new rank as many samples
    seen = consumed + [i for part in rest for i in part]
    assert set(seen) == set(range(n))  # the rest of the epoch covered...
    assert 0 <= len(seen) - n < loaded_on  # ...once, but for the padding that evens the new ranks out
    later = rank_loader(dataset, loaded_on, 0)
    later.load_state_dict(states[0])
    list(later)
    assert len([i for batch in later for i in batch]) == len(later.sampler) == -(-n // loaded_on)  # then whole


def test_the_epoch_resumed_on_another_number_of_ranks_saves_and_resumes_again(folder):
    dataset = ShardDataset(folder, transform=number)
    states = []
    for rank in range(2):
        it = iter(loader := rank_loader(dataset, 2, rank))
        for _ in range(3):
            next(it)
        states.append(loader.state_dict())
    on_three = rank_loader(dataset, 3, 0)
    on_three.load_state_dict(states[0])
    it = iter(on_three)
    next(it)
    mid = json.loads(json.dumps(on_three.state_dict()))
    rest = list(it)
    again = rank_loader(dataset, 3, 0)
    again.load_state_dict(mid)
    assert list(again) == rest  # the same size: exactly where it stood


# ------------------------------------------------------------------ the stream


def stream_epochs(folder, epochs=2, **options):
    """Each epoch's (sample, worker) pairs from a windowed stream, in delivered order."""
    stream = ShardDataset(folder, transform=number_and_worker).stream(shuffle_shards=True, seed=7, shards_per_window=K)
    loader = conveyor.DataLoader(stream, batch_size=None, **options)
    got = []
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        got.append(list(loader))
    return stream, got


@pytest.mark.parametrize(
    "kind", [dict(), dict(num_workers=2), dict(num_workers=2, worker_method="thread")], ids=["0", "2", "threads"]
)
def test_a_windowed_stream_reads_each_shard_in_one_worker_and_each_window_in_the_samplers_order(folder, kind):
    dataset = ShardDataset(folder)
    stream, epochs = stream_epochs(folder, **kind)
    sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=7)
    for epoch, got in enumerate(epochs):
        samples = [s for s, _ in got]
        assert sorted(samples) == list(range(len(dataset)))
        readers = defaultdict(set)
        for sample, worker in got:
            readers[shard_of(dataset, sample)].add(worker)
        assert all(len(workers) == 1 for workers in readers.values())  # each shard read by one worker
        order, blocks = list(sampler), sampler.epoch_order(epoch)
        for window in range(blocks.num_windows):  # each window's samples in the sampler's order
            span = blocks.window_span(window)
            shards = set(blocks.window_shards(window).tolist())
            assert [s for s in samples if shard_of(dataset, s) in shards] == [order[p] for p in span]
        if not kind:
            assert samples == order  # (one reader: the sampler's order itself)
    assert [s for s, _ in epochs[0]] != [s for s, _ in epochs[1]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_windowed_stream_resumes_where_it_stood(folder, num_workers):
    def loader():
        stream = ShardDataset(folder, transform=number).stream(shuffle_shards=True, seed=5, shards_per_window=K)
        return conveyor.DataLoader(stream, batch_size=3, num_workers=num_workers, collate_fn=list)

    full = list(loader())
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + list(resumed) == full
    reader_states = [copy["iterator_state"] for copy in state["copies"]["states"] if copy["iterator_state"]]
    assert reader_states and all(s["shards_per_window"] == K for s in reader_states)
    assert all(isinstance(value, int) for s in reader_states for value in s.values())  # (a few integers)


def test_a_windowed_streams_state_is_refused_by_a_stream_with_other_windows(folder):
    stream = ShardDataset(folder).stream(shuffle_shards=True, seed=5, shards_per_window=K)
    reader = iter(stream)
    next(reader)
    state = reader.state_dict()
    for other in (
        ShardDataset(folder).stream(shuffle_shards=True, seed=5, shards_per_window=K + 1),
        ShardDataset(folder).stream(shuffle_shards=True, seed=5),
        ShardDataset(folder).stream(shuffle_shards=True, seed=6, shards_per_window=K),
    ):
        with pytest.raises(ValueError, match="resume with the settings that saved it"):
            iter(other).load_state_dict(state)


def test_a_windowed_streams_state_of_another_epoch_is_refused_even_with_the_same_shards(folder):
    def reader(epoch):
        stream = ShardDataset(folder, transform=number).stream(seed=5, shards_per_window=K)  # (shards unshuffled)
        stream.set_epoch(epoch)
        return iter(stream)

    saving = reader(0)
    head = [next(saving) for _ in range(4)]
    state = saving.state_dict()
    with pytest.raises(ValueError, match="epoch"):  # (another epoch: the same windows, their samples in another order)
        reader(1).load_state_dict(state)
    resumed = reader(0)
    resumed.load_state_dict(state)
    assert head + list(resumed) == list(reader(0))


@pytest.mark.parametrize(
    "where", [{"sample": -3}, {"sample": 10**6}, {"position": -1}, {"position": 10**6}, {"sample": 1.5}]
)
def test_a_windowed_streams_state_outside_its_windows_is_refused(folder, where):
    stream = ShardDataset(folder, transform=number).stream(shuffle_shards=True, seed=5, shards_per_window=K)
    reader = iter(stream)
    next(reader)
    # (a sample before the window's would read another window's: another worker's shards)
    with pytest.raises(ValueError, match="outside"):
        iter(stream).load_state_dict({**reader.state_dict(), **where})


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "value, error, words",
    [
        (0, ValueError, "must be at least 1"),
        (-2, ValueError, "must be at least 1"),
        (1.5, TypeError, "must be an int"),
        ("8", TypeError, "must be an int"),
        (True, TypeError, "must be an int"),
        (None, TypeError, "must be an int"),
    ],
)
def test_a_bad_number_of_shards_per_window_is_a_clear_error(folder, value, error, words):
    dataset = ShardDataset(folder)
    with pytest.raises(error, match=f"ShardBlockSampler: shards_per_window {words}"):
        ShardBlockSampler(dataset, shards_per_window=value)
    if value is not None:
        with pytest.raises(error, match=f"ShardStream: shards_per_window {words}"):
            dataset.stream(shards_per_window=value)


def test_other_bad_arguments_are_clear_errors(folder):
    dataset = ShardDataset(folder)
    with pytest.raises(TypeError, match="needs a ShardDataset"):
        ShardBlockSampler(list(range(10)), shards_per_window=2)
    with pytest.raises(TypeError, match="seed should be an integer"):
        ShardBlockSampler(dataset, 2, seed="1")
    with pytest.raises(ValueError, match="Invalid rank 2"):
        ShardBlockSampler(dataset, 2, num_replicas=2, rank=2)
    with pytest.raises(TypeError, match="whole_shards must be True or False"):
        ShardDataset(folder, whole_shards="yes")
    for seed in (1.5, True, "1"):  # (a windowed stream's order is keyed by an int: 1.5 read as 1 was seed 1's order)
        with pytest.raises(TypeError, match="seed should be an integer"):
            dataset.stream(seed=seed, shards_per_window=2)


@pytest.mark.parametrize("firsts", [[5, 8, 10], [0, 4, 2], [0]])
def test_firsts_that_are_not_shard_boundaries_from_zero_are_refused(firsts):
    # (starting at 5, the sampler's indices 0.. would name samples before the shards')
    with pytest.raises(ValueError, match="not shard boundaries"):
        ShardBlockSampler(types.SimpleNamespace(firsts=firsts), shards_per_window=2)


# ------------------------------------------------------------------ from a store


@pytest.mark.leaks_known("fsspec/s3fs keep an IO thread and pooled connections for the life of the process")
@pytest.mark.parametrize("read", ["sampler", "stream"])
def test_from_a_store_each_shard_is_downloaded_once_per_epoch_by_two_workers(server, tmp_path, read):
    pytest.importorskip("s3fs")
    from conveyor.store import Store
    from object_store import BUCKET

    local = tmp_path / "local"
    local.mkdir()
    sizes = SIZES * 2  # (24 shards)
    write_shards(local, sizes)
    for name in os.listdir(local):  # (indexes beside the shards: opening the dataset downloads no shard)
        ShardIndex.scan(str(local / name)).save(str(local / name) + ".idx")
    server.latency_s, server.fail, server.drop = 0.0, None, None
    store = Store(f"s3://{BUCKET}", storage_options=server.options(), cache_dir=str(tmp_path / "cache"))
    for name in os.listdir(local):
        store.fs.pipe(store.url(f"locality/{name}"), (local / name).read_bytes())
    tar_bytes = {name: os.path.getsize(local / name) for name in os.listdir(local)}
    # Room for the windows that batches in flight reach into: 3 of the largest shards' windows (4 batches
    # of 4 in flight, windows of about 12 samples), 9 of the 24 shards; a stream's 2 workers: a window
    # and the shard ahead each, and a window to spare, under half.
    store.cache_bytes = (3 * K if read == "sampler" else 3 * K + 2) * max(tar_bytes.values())
    dataset = ShardDataset("locality", store=store, transform=number, whole_shards=True)
    if read == "sampler":
        sampler = ShardBlockSampler(dataset, shards_per_window=K, seed=1)
        loader = conveyor.DataLoader(dataset, 4, sampler=sampler, num_workers=2, collate_fn=list)
    else:
        stream = dataset.stream(shuffle_shards=True, seed=1, prefetch=1, shards_per_window=K)
        loader = conveyor.DataLoader(stream, 4, num_workers=2, collate_fn=list)
    # (the empty shard has nothing to read: never downloaded)
    shards = {f"shard-{k:03d}.tar": tar_bytes[f"shard-{k:03d}.tar"] for k, size in enumerate(sizes) if size}
    for epoch in range(2):
        loader.set_epoch(epoch)
        server.sent_bytes.clear()
        assert sorted(i for b in loader for i in b) == list(range(sum(sizes)))
        sent = {path.rsplit("/", 1)[-1]: n for path, n in server.sent_bytes.items() if path.endswith(".tar")}
        if epoch == 0:  # (an empty cache: each shard downloaded once, whole)
            assert sent == shards
        else:  # (the shards the last epoch left in the cache are not downloaded again)
            assert all(sent.get(name, 0) in (0, n) for name, n in shards.items()) and sum(sent.values()) > 0


def test_conveyor_torch_has_the_sampler_as_a_torch_sampler_with_the_same_order(folder):
    torch_data = pytest.importorskip("conveyor.torch")
    import torch.utils.data as tud

    dataset = ShardDataset(folder)
    sampler = torch_data.ShardBlockSampler(dataset, shards_per_window=K, seed=3)
    assert isinstance(sampler, tud.Sampler)
    assert list(sampler) == list(ShardBlockSampler(dataset, shards_per_window=K, seed=3))


def test_a_stream_without_shuffled_shards_reads_the_windows_in_shard_order(folder):
    dataset = ShardDataset(folder, transform=number)
    samples = list(dataset.stream(shards_per_window=K))
    assert sorted(samples) == list(range(len(dataset)))
    firsts = dataset.firsts
    for window in range(-(-len(SIZES) // K)):  # window w: shards wK .. wK + K - 1, their samples shuffled
        span = range(firsts[window * K], firsts[min(len(SIZES), (window + 1) * K)])
        assert sorted(samples[span.start : span.stop]) == list(span)
    assert samples != list(range(len(dataset)))
