"""Pickling or deep-copying a loader that holds live persistent workers
fails with a TypeError that names the workers, why they cannot be pickled
and what to do (torch.utils.data refuses too, with a NotImplementedError
about its iterator); a loader without live workers pickles and copies,
and the refusal leaves the loader working."""

from __future__ import annotations

import copy
import pickle

import pytest

import conveyor


def _loader(**kwargs):
    return conveyor.DataLoader(list(range(12)), batch_size=4, num_workers=2, persistent_workers=True, **kwargs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("worker_method", ["multiprocessing", "thread"])
@pytest.mark.parametrize("how", [pickle.dumps, copy.deepcopy], ids=["pickle", "deepcopy"])
def test_a_loader_with_live_persistent_workers_refuses_clearly(worker_method, how):
    loader = _loader(worker_method=worker_method)
    first = [batch.tolist() for batch in loader]
    with pytest.raises(TypeError) as refused:
        how(loader)
    message = str(refused.value)
    assert "live persistent workers" in message and "persistent_workers=True" in message
    assert "state_dict()" in message and "before its first pass" in message
    if worker_method == "thread":
        assert "2 worker threads (worker thread 0, worker thread 1)" in message
    else:
        assert "2 worker processes (worker 0 (pid " in message
    assert [batch.tolist() for batch in loader] == first  # the loader goes on as before


@pytest.mark.timeout(60)
def test_torch_refuses_the_same_loader():
    tud = pytest.importorskip("torch.utils.data")
    loader = tud.DataLoader(list(range(12)), batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    with pytest.raises(NotImplementedError):
        pickle.dumps(loader)


@pytest.mark.timeout(60)
def test_a_loader_without_live_workers_pickles_and_copies():
    fresh = _loader()
    assert [b.tolist() for b in pickle.loads(pickle.dumps(fresh))] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    passing = conveyor.DataLoader(list(range(12)), batch_size=4, num_workers=2)
    list(passing)  # (its workers ended with the pass)
    assert [b.tolist() for b in copy.deepcopy(passing)] == [b.tolist() for b in passing]
