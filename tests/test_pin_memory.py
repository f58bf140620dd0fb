"""pin_memory=True: with an accelerator, batches are pinned in a background
thread (inline without workers); without one, one warning and no pinning.

This machine has no GPU, so the accelerator is simulated: torch.accelerator
(and torch.cuda) report one, and Tensor.pin_memory records where it ran and
returns a copy.
"""

import threading
import warnings

import pytest
import torch
import torch.utils.data as tud

import conveyor.torch as ct

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake_accelerator(monkeypatch):
    calls = []

    def pin_memory(self, *args, **kwargs):
        calls.append(threading.current_thread().name)
        return self.clone()

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return calls


class Pairs:
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"x": torch.full((3,), float(i)), "y": i}


def test_workers_batches_are_pinned_in_a_background_thread(fake_accelerator):
    loader = ct.DataLoader(Pairs(), batch_size=4, num_workers=2, pin_memory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accelerator is there: no warning
        batches = list(loader)
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert len(fake_accelerator) == 2 * len(batches)  # every tensor of every batch
    assert set(fake_accelerator) == {"conveyor-pin-memory"}
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"], "the thread ends with the epoch"


def test_without_workers_batches_are_pinned_inline(fake_accelerator):
    batches = list(ct.DataLoader(Pairs(), batch_size=6, pin_memory=True))
    assert len(batches) == 2 and set(fake_accelerator) == {threading.current_thread().name}


def test_errors_cross_the_pin_thread_with_their_context(fake_accelerator):
    class Broken(Pairs):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("no sample 5")
            return super().__getitem__(i)

    it = iter(ct.DataLoader(Broken(), batch_size=4, num_workers=2, pin_memory=True))
    assert next(it)["y"].tolist() == [0, 1, 2, 3]
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process"):
        next(it)
    assert next(it)["y"].tolist() == [8, 9, 10, 11]  # iteration goes on, as in torch


def test_abandoned_iterator_stops_the_pin_thread(fake_accelerator):
    loader = ct.DataLoader(Pairs(), batch_size=2, num_workers=2, pin_memory=True)
    for _ in loader:
        break
    assert not [t for t in threading.enumerate() if t.name == "conveyor-pin-memory"]


def _warnings_of_first_batch(module):
    loader = module.DataLoader(Pairs(), batch_size=4, pin_memory=True, pin_memory_device="cuda:1")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        next(iter(loader))
    return [str(w.message) for w in seen if issubclass(w.category, UserWarning)]


def test_pin_memory_device_is_deprecated_as_in_torch():
    """torch ignores pin_memory_device (the current accelerator is used) and
    says so; without an accelerator it also says nothing will be pinned."""
    ours, theirs = _warnings_of_first_batch(ct), _warnings_of_first_batch(tud)
    assert ours == theirs
    assert any("pin_memory_device is deprecated" in w for w in ours)
