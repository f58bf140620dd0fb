"""``loader.stats().mix``: per source, the samples a pass over a ``Mix`` has
delivered against its target, and each source's epoch, for any sampler and
kind of worker; counted as batches are handed out, never as they are loaded."""

from __future__ import annotations

import json

import numpy as np
import pytest

import conveyor
from conveyor import DataLoader, Mix

WORKERS = [
    pytest.param(dict(num_workers=0), id="inline"),
    pytest.param(dict(num_workers=2, multiprocessing_context="fork"), id="fork"),
    pytest.param(dict(num_workers=2, worker_method="thread"), id="threads"),
]


def sources() -> dict:
    # A sample's value names its source: a's are 0..., b's 1000..., c's 2000...
    return {"a": np.arange(50), "b": 1000 + np.arange(30), "c": 2000 + np.arange(7)}


def mix_of(**more) -> Mix:
    return Mix(sources(), weights=more.pop("weights", {"a": 5, "b": 3, "c": 2}), num_samples=200, seed=4, **more)


def source_counts(batches) -> dict:
    values = np.concatenate([np.asarray(batch).reshape(-1) for batch in batches])
    return {name: int(np.sum(values // 1000 == k)) for k, name in enumerate("abc")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", WORKERS)
def test_a_pass_in_order_reports_what_the_mix_reports_for_that_prefix(workers):
    mix = mix_of()
    loader = DataLoader(mix, batch_size=10, **workers)
    it = iter(loader)
    got = [next(it) for _ in range(7)]  # (workers load ahead: only what was handed out counts)
    assert loader.stats().mix == mix.report(70)
    got += list(it)
    report = loader.stats().mix
    assert report == mix.report(200)
    assert {s.name: s.served for s in report.sources} == source_counts(got)
    for s in report.sources:
        assert abs(s.served - s.target) < 1 and 0 <= s.share <= 1  # (every prefix within one sample)
    assert report["c"].epoch == (200 * 2 // 10) // 7 and report["c"].length == 7  # (c wrapped: 40 of 7)


def test_a_shuffled_pass_counts_the_samples_it_delivered_and_their_target():
    mix = mix_of()
    loader = DataLoader(mix, batch_size=8, shuffle=True, seed=3)
    it = iter(loader)
    got = [next(it) for _ in range(5)]
    report = loader.stats().mix
    assert {s.name: s.served for s in report.sources} == source_counts(got)
    assert report.position == 40
    shares = mix.shares
    for s in report.sources:
        assert s.target == pytest.approx(40 * shares[s.name]) and s.target_share == pytest.approx(shares[s.name])
    got += list(it)
    assert {s.name: s.served for s in loader.stats().mix.sources} == mix.counts(200)  # (the whole mix, once)


def test_a_schedule_s_target_follows_the_weights_at_each_position():
    mix = mix_of(weights=[(0, {"a": 1, "b": 1, "c": 0}), (100, {"a": 0, "b": 1, "c": 3})])
    loader = DataLoader(mix, batch_size=25)
    for _ in loader:
        pass
    report = loader.stats().mix
    assert report == mix.report(200)
    assert report["a"].target == pytest.approx(50) and report["c"].target == pytest.approx(75)


def test_ranks_of_a_distributed_sampler_together_deliver_the_mix():
    mix = mix_of()
    served = {"a": 0, "b": 0, "c": 0}
    for rank in range(2):
        sampler = conveyor.DistributedSampler(mix, num_replicas=2, rank=rank, shuffle=True, seed=1)
        loader = DataLoader(mix, batch_size=10, sampler=sampler)
        for _ in loader:
            pass
        assert loader.stats().mix.position == 100
        for s in loader.stats().mix.sources:
            served[s.name] += s.served
    assert served == mix.counts(200)


def test_a_resumed_pass_counts_what_it_delivers_after_the_state():
    mix = mix_of()
    loader = DataLoader(mix, batch_size=10)
    it = iter(loader)
    for _ in range(6):
        next(it)
    state = loader.state_dict()
    resumed = DataLoader(mix_of(), batch_size=10)
    resumed.load_state_dict(state)
    for _ in resumed:
        pass
    report = resumed.stats().mix
    assert {s.name: s.served for s in report.sources} == {
        name: mix.counts(200)[name] - mix.counts(60)[name] for name in mix.names
    }
    assert {s.name: s.epoch for s in report.sources} == {s.name: s.epoch for s in mix.report(200).sources}


def test_each_pass_starts_its_own_count_and_the_figures_reach_json_and_the_table():
    mix = mix_of()
    loader = DataLoader(mix, batch_size=20)
    for _ in range(2):
        for _ in loader:
            pass
    stats = loader.stats()
    assert stats.mix == mix.report(200)  # (the latest pass: the same 200 positions again, not 400)
    out = json.loads(json.dumps(stats.to_dict()))
    assert out["mix"]["position"] == 200 and [s["name"] for s in out["mix"]["sources"]] == ["a", "b", "c"]
    assert "share" in stats.table() and "target" in stats.table()


def test_a_loader_over_anything_else_has_no_mix_figures():
    loader = DataLoader(list(range(10)), batch_size=5)
    for _ in loader:
        pass
    assert loader.stats().mix is None and loader.stats().to_dict()["mix"] is None


class Broken:
    """A source whose samples 3 and 4 cannot be read."""

    def __len__(self) -> int:
        return 30

    def __getitem__(self, i: int) -> int:
        if i in (3, 4):
            raise ValueError(f"sample {i} is corrupt")
        return 1000 + i


def test_samples_skip_bad_samples_left_out_are_not_counted():
    mix = Mix({"a": np.arange(50), "b": Broken()}, weights={"a": 1, "b": 1}, num_samples=60, seed=2, shuffle=False)
    loader = DataLoader(mix, batch_size=6, skip_bad_samples=2)
    got = list(loader)
    report = loader.stats().mix
    assert len(loader.stats().skipped) == 2
    assert report["b"].served == 30 - 2 == source_counts(got)["b"] and report["a"].served == 30
    assert report.position == 58
