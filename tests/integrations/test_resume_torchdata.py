"""Resume for torchdata users (issue 5): conveyor.torch.StatefulDataLoader
takes torchdata's arguments, torchdata's own training loop runs unchanged,
and torchdata's states (empty or not) are recognised.
"""

import pytest
import torch

import conveyor
import conveyor.torch as ct
from resume_helpers import Augmented, N, make, plain, torch_saved, uninterrupted

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


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
        return StatefulDataLoader(
            data, batch_size=4, shuffle=shuffle, generator=torch.Generator().manual_seed(3), snapshot_every_n_steps=1
        )

    loader = build()
    uninterrupted = [[b[0].tolist() for b in loader] for _ in range(2)]
    loader = build()
    loader.load_state_dict({})  # torchdata: nothing to load
    it = iter(loader)
    head = [next(it)[0].tolist() for _ in range(5)]
    checkpoint = torch.load(torch_saved({"loader": loader.state_dict()}), weights_only=False)
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


def test_torchdata_states_and_empty_states():
    loader = make("shuffle-seed")
    with pytest.raises(ValueError, match="torchdata"):
        loader.load_state_dict({"_snapshot": {}, "_steps_since_snapshot": 0})
    loader.load_state_dict({})  # torchdata's "nothing to load"
    assert [plain(b) for b in loader] == uninterrupted("shuffle-seed")[0]
