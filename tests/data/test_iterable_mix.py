"""conveyor.IterableMix: streams mixed by the map-style mix's stateless
choice of source, its stopping rules, new epochs of a source, and an exact
resume through the loader (streams with and without state of their own,
0 and 2 workers)."""

from __future__ import annotations

import io
import itertools
import tarfile

import pytest

import conveyor
from resume_helpers import CountingIterator


class Counted(conveyor.IterableDataset):
    """``start, start + 1, ...`` (``n`` of them), shifted by 1000 per epoch; its
    iterator has a state when ``stateful``."""

    def __init__(self, start, n, stateful=True):
        self.start, self.n, self.stateful, self.epoch = start, n, stateful, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        return CountingIterator(self._items()) if self.stateful else iter(self._items())

    def _items(self):
        return [self.start + 1000 * self.epoch + i for i in range(self.n)]


WEIGHTS = {"web": 5, "code": 2, "books": 1}


def _streams(stateful=True):
    return {"web": Counted(0, 30, stateful), "code": Counted(100, 9, stateful), "books": Counted(200, 4, stateful)}


def test_each_position_reads_the_source_the_map_style_mix_chooses():
    mix = conveyor.IterableMix(_streams(), weights=WEIGHTS, num_samples=120, stop="never")
    mapped = conveyor.Mix({n: list(range(1)) for n in WEIGHTS}, weights=WEIGHTS, num_samples=120)
    samples = list(mix)
    assert len(samples) == 120
    assert [mix.source_of(p) for p in range(120)] == [mapped.locate(p)[0] for p in range(120)]
    books = [x for x in samples if 200 <= x % 1000 < 300]
    assert books[:8] == [200, 201, 202, 203, 1200, 1201, 1202, 1203]  # a new epoch (set_epoch) when it runs out


def test_stopping_rules():
    first = list(conveyor.IterableMix(_streams(), weights=WEIGHTS))
    assert sum(200 <= x < 300 for x in first) == 4 and len(first) < 40  # ends as books runs out
    every = list(conveyor.IterableMix(_streams(), weights=WEIGHTS, stop="all"))
    assert sorted(x for x in every if x < 100) == list(range(30))  # every source ran out once
    with pytest.raises(ValueError, match="needs num_samples"):
        conveyor.IterableMix(_streams(), weights=WEIGHTS, stop="never")
    with pytest.raises(ValueError, match="sources the mix does not have"):
        conveyor.IterableMix(_streams(), weights={**WEIGHTS, "news": 1})
    with pytest.raises(TypeError, match="not iterable"):
        conveyor.IterableMix({"a": 3})


def test_source_of_a_position_outside_the_mix_is_refused():
    mix = conveyor.IterableMix(
        {"a": range(3), "b": range(10, 12)}, weights={"a": 2, "b": 1}, num_samples=6, stop="never"
    )
    assert [mix.source_of(p) for p in range(6)] == ["a", "a", "b", "a", "a", "b"]
    for outside in (-1, 6):
        with pytest.raises(IndexError, match=r"position %d is outside the mix's positions \[0, 6\)" % outside):
            mix.source_of(outside)
    unbounded = conveyor.IterableMix({"a": range(3), "b": range(10, 12)}, weights={"a": 2, "b": 1})
    assert unbounded.source_of(10**6) == mix.source_of(10**6 % 3)
    with pytest.raises(IndexError, match=r"position -1 is outside the mix's positions \[0, \.\.\.\)"):
        unbounded.source_of(-1)


def test_stop_all_does_not_wait_for_a_source_never_read():
    # (at most 20 taken: without a bound, a mix that never ends would hang the test)
    mix = conveyor.IterableMix({"a": range(3), "b": range(10, 12)}, weights={"a": 1, "b": 0}, stop="all")
    assert list(itertools.islice(mix, 20)) == [0, 1, 2]
    steps = [(0, {"a": 1, "b": 1}), (3, {"a": 1, "b": 0})]  # ("b" stops being read before it runs out)
    never = conveyor.IterableMix({"a": range(3), "b": range(10, 15)}, weights=steps, stop="all")
    with pytest.raises(ValueError, match=r"never ends: the sources \['b'\] stop being read"):
        list(itertools.islice(never, 20))


@pytest.mark.parametrize("stateful", [True, False])
@pytest.mark.parametrize("stop_after", [1, 5, 11])
def test_resume_is_exact(stateful, stop_after):
    def loader():
        mix = conveyor.IterableMix(_streams(stateful), weights=WEIGHTS, num_samples=100, stop="never")
        return conveyor.DataLoader(mix, batch_size=4)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    served = [next(it).tolist() for _ in range(stop_after)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert served + [b.tolist() for b in resumed] == full


def test_resume_with_two_workers():
    def loader():
        streams = {
            name: conveyor.ShardedIterable(list(range(start, start + n)))
            for name, start, n in (("web", 0, 40), ("code", 100, 12), ("books", 200, 6))
        }
        mix = conveyor.IterableMix(streams, weights=WEIGHTS, num_samples=30, stop="never")
        return conveyor.DataLoader(mix, batch_size=3, num_workers=2)

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    served = [next(it).tolist() for _ in range(4)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert served + [b.tolist() for b in resumed] == full


def test_a_state_of_another_mix_is_refused():
    def loader(weights):
        return conveyor.DataLoader(
            conveyor.IterableMix(_streams(), weights=weights, num_samples=50, stop="never"), batch_size=4
        )

    saving = loader(WEIGHTS)
    it = iter(saving)
    next(it)
    state = saving.state_dict()
    del it
    with pytest.raises(ValueError, match="mix_weights"):
        loader({"web": 1, "code": 1, "books": 1}).load_state_dict(state)


def test_resume_after_a_change_of_weights():
    def loader():
        steps = [(0, WEIGHTS), (17, {"web": 1, "code": 3, "books": 1})]
        return conveyor.DataLoader(
            conveyor.IterableMix(_streams(), weights=steps, num_samples=60, stop="never"), batch_size=4
        )

    full = [b.tolist() for b in loader()]
    first = loader()
    it = iter(first)
    served = [next(it).tolist() for _ in range(6)]  # past position 17
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert served + [b.tolist() for b in resumed] == full


def test_a_source_that_yields_nothing_is_named():
    mix = conveyor.IterableMix({"a": range(3), "b": range(0)}, weights={"a": 1, "b": 1}, num_samples=10, stop="never")
    with pytest.raises(ValueError, match="the source 'b' yielded nothing in a whole epoch"):
        list(mix)


def _tar_shards(folder, prefix, counts):
    """Tar shards of ``counts`` samples each; sample ``k``'s text is ``f"{prefix}{k}"``."""
    folder.mkdir()
    k = 0
    for number, count in enumerate(counts):
        with tarfile.open(folder / f"shard-{number}.tar", "w") as tar:
            for _ in range(count):
                data = f"{prefix}{k}".encode()
                member = tarfile.TarInfo(f"{k:06d}.txt")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
                k += 1
    return folder


@pytest.mark.parametrize("stop_after", [2, 7])
def test_shard_streams_mix_and_resume_exactly(tmp_path, stop_after):
    from conveyor.shards import ShardDataset

    web = _tar_shards(tmp_path / "web", "w", [3, 4, 2])
    books = _tar_shards(tmp_path / "books", "b", [2, 1])

    def loader():
        streams = {
            "web": ShardDataset(web, transform=lambda s: s["txt"]).stream(shuffle_shards=True, seed=1),
            "books": ShardDataset(books, transform=lambda s: s["txt"]).stream(shuffle_shards=True, seed=2),
        }
        mix = conveyor.IterableMix(streams, weights={"web": 2, "books": 1}, num_samples=40, stop="never")
        return conveyor.DataLoader(mix, batch_size=2, collate_fn=list)

    full = list(loader())
    samples = [x for batch in full for x in batch]
    assert len(samples) == 40 and sum(x.startswith("b") for x in samples) in (13, 14)
    web_read = [x for x in samples if x.startswith("w")]
    for epoch in range(2):  # each of web's epochs reads its 9 samples once (its shards reshuffled per epoch)
        assert sorted(web_read[9 * epoch : 9 * epoch + 9]) == sorted(f"w{k}" for k in range(9))
    first = loader()
    it = iter(first)
    served = [next(it) for _ in range(stop_after)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert served + list(resumed) == full


def test_each_pass_starts_the_streams_at_their_first_epoch():
    mix = conveyor.IterableMix(_streams(), weights=WEIGHTS, num_samples=60, stop="never")
    assert list(mix) == list(mix)  # (books reached epoch 3 in the first pass; the second starts it at 0 again)


def test_two_passes_at_once_each_move_their_own_streams_epochs():
    # (thread workers iterate copy.copy's of the mix, which share its streams)
    mix = conveyor.IterableMix(
        {"a": _Epochs(0), "b": _Epochs(100)}, weights={"a": 3, "b": 1}, num_samples=40, stop="never"
    )
    alone = list(mix)
    one, two = iter(mix), iter(mix)
    ahead = [next(one) for _ in range(7)]  # (one pass a stream's epoch ahead of the other)
    together = [(next(one), next(two)) for _ in range(33)]
    assert ahead + [x for x, _ in together] == alone and [y for _, y in together] == alone[:33]


class _Epochs:
    """Five items, shifted by 1000 per epoch (``set_epoch``), read from the stream as it stands."""

    def __init__(self, start):
        self.start, self.epoch = start, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i in range(5):
            yield self.start + 1000 * self.epoch + i
