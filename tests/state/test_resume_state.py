"""What a loader's saved state says (issue 5): where it stands before, during
and after an epoch and after a load, its size and encoding, set_epoch and the
resume point, a state loaded while iterating, pickling, and torch checkpoints.
"""

import json
import warnings

import pytest
import torch

import conveyor
from conveyor import DataLoader
from resume_helpers import EPOCHS, NAMES, json_round_trip, make, plain, run_epochs, uninterrupted

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


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
        assert (
            state["version"] == conveyor.state.STATE_VERSION and state["kind"] == "DataLoader" and "checksum" in state
        )
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


# ------------------------------------------------------------ checkpoints
def test_state_goes_into_a_torch_checkpoint(tmp_path):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = make("shuffle-torch-generator")
    it = iter(loader)
    next(it), next(it)
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()},
        tmp_path / "ckpt.pt",
    )
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
