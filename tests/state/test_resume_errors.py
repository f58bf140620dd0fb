"""A state that does not fit the loader is refused (issue 5): another loader's
state shows both sides and the fix, another version or kind, a truncated or
edited state, a sampler refusing its part; a failed load changes nothing.
"""

import json

import pytest

import conveyor
import conveyor.torch as ct
from conveyor import DataLoader
from resume_helpers import Augmented, N, make, plain, saved_state, uninterrupted

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


# ------------------------------------------------------------- bad input


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
    for edit in (
        {"position": 3},
        {"epoch": 1},
        {"base_seed": state["base_seed"] + 1},
        {"delivered_ahead": [5]},
        {"sampler": {**state["sampler"], "position": 9}},
    ):
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


def test_a_sampler_refusing_its_state_leaves_everything_as_it_was():
    loader = make("shuffle-seed")
    before = loader.state_dict()
    bad = {**saved_state(), "sampler": {"version": 1, "kind": "SomethingElse"}}
    bad["checksum"] = conveyor.state._encoding.checksum(bad)
    with pytest.raises(ValueError):
        loader.load_state_dict(bad)
    assert loader.state_dict() == before
    assert [plain(b) for b in loader] == uninterrupted("shuffle-seed")[0]
