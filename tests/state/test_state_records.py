"""The loader state as typed records, decoded and checked in one place.

``LoaderState.from_dict(state, view)`` is where a saved state is decoded:
it checks the header, the settings against the loader, then every field,
and refuses a state that does not fit with an error naming
``load_state_dict`` and the key. ``to_dict()`` gives back the dict a state
was decoded from, key for key: every state an earlier conveyor wrote
(data/saved_states.json) and every state this one writes round-trips, and
so does any edit of one that the checks let through. The sub-records
(``Copies``, ``CopyState``, ``ReplayPoint``) round-trip alike.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import numpy as np
import pytest

import conveyor
from conveyor._engine.executor.progress import IterableProgress
from conveyor.skips import SkippedSample
from conveyor.state._encoding import KEYS, checksum
from conveyor.state._progress import EpochProgress
from conveyor.state._records import Copies, CopyState, LoaderState, ReplayPoint

sys.path.insert(0, os.path.dirname(__file__))

from test_saved_states import build, load_fixture  # noqa: E402
from test_state_fuzz import SCENARIOS, _inside_user_part, _paths, saved_state  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Pairs:
    """A batch sampler of the user's, without state: it draws its order from
    its numpy ``generator``, so a state replays it from there (``replay``)."""

    def __init__(self, n=8):
        self.n, self.generator = n, np.random.default_rng(3)

    def __iter__(self):
        order = self.generator.permutation(self.n).tolist()
        return iter([order[i : i + 2] for i in range(0, self.n, 2)])

    def __len__(self):
        return self.n // 2


#: A loader whose state holds a replay point (its batch sampler cannot jump).
REPLAYED = (lambda: conveyor.DataLoader(list(range(8)), batch_sampler=Pairs()), 1, range(8))
SCENARIOS = {**SCENARIOS, "map, replayed batch sampler": REPLAYED}


def plan_of(loader):
    return loader._plan()


def canonical(state):
    """A state as its checksum sees it (NaN equal to itself, tuples as lists)."""
    return json.dumps(state, sort_keys=True, default=repr)


def resealed(state, path, value):
    """``state`` with the field at ``path`` set to ``value`` (removed for
    ``REMOVED``), its checksum made anew, as a careful forger would."""
    state = copy.deepcopy(state)
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if value is REMOVED:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(value)
    state["checksum"] = checksum(state)
    return state


REMOVED = object()


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("key", sorted(load_fixture()["cases"]))
def test_every_state_an_earlier_conveyor_saved_decodes_and_encodes_back_key_for_key(key):
    saved = load_fixture()["cases"][key]
    state = saved["state"]
    decoded = LoaderState.from_dict(state, plan_of(build(saved, other=True)))
    again = decoded.to_dict()
    assert sorted(again) == sorted(state)
    for name in state:
        assert again[name] == state[name], name
    assert decoded.epoch == saved["epoch"] and decoded.position == saved["position"]
    assert decoded.in_epoch is True and decoded.count == saved["position"]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_state_this_conveyor_saves_round_trips(scenario):
    make, take, _ = SCENARIOS[scenario]
    state = saved_state(make, take)
    decoded = LoaderState.from_dict(state, plan_of(make()))
    assert decoded.to_dict() == state
    assert LoaderState.from_dict(decoded.to_dict(), plan_of(make())) == decoded


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_pass_and_a_state_saved_inside_its_epoch_convert_by_one_pair(scenario):
    """EpochProgress.from_state and to_state are inverses: the pass a state
    resumes saves, before it moves, the state it was loaded from."""
    make, take, _ = SCENARIOS[scenario]
    decoded = LoaderState.from_dict(saved_state(make, take), plan_of(make()))
    if not decoded.in_epoch:
        pytest.skip("saved between epochs: no pass to resume")
    progress = EpochProgress.from_state(decoded)
    assert (progress.epoch, progress.position, progress.count) == (decoded.epoch, decoded.position, decoded.count)
    assert progress.to_state(decoded.settings) == decoded


def test_a_state_holds_exactly_the_keys_of_the_format():
    make, take, _ = SCENARIOS["map, seed"]
    state = saved_state(make, take)
    assert set(state) == {"version", "kind", "checksum", *KEYS}
    make, take, _ = SCENARIOS["map, skipped samples"]
    state = saved_state(make, take)
    assert set(state) == {"version", "kind", "checksum", "skipped", *KEYS}
    decoded = LoaderState.from_dict(state, plan_of(make()))
    assert decoded.skipped and all(isinstance(record, SkippedSample) for record in decoded.skipped)


def test_the_parts_decode_into_their_records():
    make, take, _ = SCENARIOS["iterable, threads"]
    decoded = LoaderState.from_dict(saved_state(make, take), plan_of(make()))
    assert isinstance(decoded.copies, Copies) and len(decoded.copies.states) == 2
    assert all(isinstance(state, CopyState) for state in decoded.copies.states)
    assert decoded.copies.next_turn in (0, 1)
    make, take, _ = REPLAYED  # (a sampler that cannot jump: replayed from its generator)
    decoded = LoaderState.from_dict(saved_state(make, take), plan_of(make()))
    assert decoded.replay is not None and decoded.replay.kind == "generator" and decoded.first_batch is not None
    assert decoded.sampler is None


# ------------------------------------------------------------------ refusals


VALUES = [REMOVED, None, -1, 10**18, 2**64, "x", "0123abcd", 1.5, float("nan"), [], {}, True, [0, 1], {"a": 1}]


def _names_the_key(text, path):
    """The error names a key on the edited path, or the field the edited one
    must agree with (an edited 'in_epoch' disagrees with the 'sampler')."""
    return any(isinstance(k, str) and k in text for k in path) or any(f"'{key}'" in text for key in KEYS)


def _fills_in_a_traceback(path, value):
    """A skipped sample's record may come without its traceback (the checks
    let it: it is optional); decoded, it is a SkippedSample with an empty one."""
    return value is REMOVED and path[0] == "skipped" and path[-1] == "traceback"


@pytest.mark.parametrize(
    "scenario",
    [
        "map, seed",
        "map, torch generator",
        "map, replayed batch sampler",
        "map, skipped samples",
        "iterable, threads",
        "iterable, persistent threads, between epochs",
        "map, threads, out of order",
    ],
)
def test_every_field_is_refused_naming_its_key_or_decoded_as_it_is(scenario):
    """Each field of a real state, set to each of many wrong values: either
    refused with an error naming load_state_dict and a key on its path, or
    decoded, and then encoded back to the very same state; the loader is
    never touched."""
    make, take, _ = SCENARIOS[scenario]
    state = saved_state(make, take)
    loader = make()
    view, before = plan_of(loader), loader.state_dict()
    # (what lies inside a dataset's or an iterator's own state is theirs to check, when the copy starts)
    paths = [p for p in _paths(state) if p and p != ("checksum",) and not _inside_user_part(p)]
    failures = []
    for path in paths:
        for value in VALUES:
            edited = resealed(state, path, value)
            try:
                decoded = LoaderState.from_dict(edited, view)
            except (ValueError, TypeError) as exc:
                text = str(exc)
                if "load_state_dict" not in text or not _names_the_key(text, path):
                    failures.append(f"{path} = {value!r}: refused without naming the key: {text}")
                continue
            again = decoded.to_dict()
            if _fills_in_a_traceback(path, value):  # (the one default: encoded, the record has it)
                assert again["skipped"][path[1]]["traceback"] == "" and LoaderState.from_dict(again, view) == decoded
            elif canonical(again) != canonical(edited):
                failures.append(f"{path} = {value!r}: decoded, but encodes to another state")
    assert not failures, f"{len(failures)} edits:\n" + "\n".join(failures[:10])
    assert loader.state_dict() == before


@pytest.mark.parametrize(
    "scenario,path,value,key",
    [
        ("map, seed", ("version",), 1, "version"),
        ("map, seed", ("kind",), "Sampler", "kind"),
        ("map, seed", ("checksum",), "00000000", "checksum"),
        ("map, seed", ("position",), REMOVED, "position"),
        ("map, seed", ("settings",), "x", "settings"),
        ("map, seed", ("settings", "batch_size"), 4, "batch_size"),
        ("map, seed", ("epoch",), -1, "epoch"),
        ("map, seed", ("in_epoch",), "yes", "in_epoch"),
        ("map, seed", ("base_seed",), 12345, "base_seed"),
        ("map, seed", ("position",), "2", "position"),
        ("map, seed", ("delivered_ahead",), [1], "delivered_ahead"),
        ("map, seed", ("sampler",), "x", "sampler"),
        ("map, seed", ("dataset_state",), {"a": 1}, "dataset_state"),
        ("map, seed", ("replay",), {"nothing": 1}, "replay"),
        ("map, seed", ("first_batch",), "not hex", "first_batch"),
        ("map, seed", ("skipped",), "x", "skipped"),
        ("map, numpy generator", ("generator_state",), 7, "generator_state"),
        ("map, replayed batch sampler", ("replay",), {"generator": "x"}, "replay"),
        ("map, replayed batch sampler", ("replay",), {"state": {}}, "replay"),
        ("map, replayed batch sampler", ("first_batch",), 7, "first_batch"),
        ("iterable", ("copies",), "x", "copies"),
        ("iterable, threads", ("copies", "states"), [None], "copies"),
        ("iterable, threads", ("copies", "retired"), [5], "copies"),
        ("iterable, threads", ("copies", "next"), 2, "copies"),
        ("iterable, threads", ("copies", "states", 0), {"served": 1}, "copies.states[0]"),
        ("iterable, threads", ("copies", "states", 0, "served"), "1", "copies.states[0].served"),
        ("iterable, threads", ("copies", "states", 0, "iterator_ended"), 0, "copies.states[0].iterator_ended"),
        ("iterable, threads", ("copies", "states", 0, "dataset_state"), "x", "copies.states[0].dataset_state"),
        ("iterable", ("copies", "states", 0, "served"), 10**6, "copies"),
    ],
)
def test_each_key_is_refused_with_its_name(scenario, path, value, key):
    make, take, _ = SCENARIOS[scenario]
    state = saved_state(make, take)
    if path == ("checksum",):  # (a state changed without its checksum made anew)
        state = {**state, "checksum": value}
    elif path == ("skipped",):  # (a key only a state with skipped samples has)
        state = {**state, "skipped": value}
        state["checksum"] = checksum(state)
    else:
        state = resealed(state, path, value)
    with pytest.raises(ValueError, match=r"DataLoader\.load_state_dict") as refused:
        LoaderState.from_dict(state, plan_of(make()))
    assert key in str(refused.value), str(refused.value)


def test_what_is_not_a_dict_is_refused_with_a_type_error():
    with pytest.raises(TypeError, match="DataLoader.load_state_dict expects the dict"):
        LoaderState.from_dict([1, 2], plan_of(conveyor.DataLoader(list(range(4)))))


# ---------------------------------------------------------------- sub-records


def test_copies_round_trip_the_engines_snapshot():
    progress = IterableProgress(num_workers=3)
    progress.delivered(0, CopyState({"a": 1}, None, False, 2))
    progress.exhausted(1, 2, CopyState(None, None, True, 3))
    progress.passed(1)
    copies = progress.snapshot()
    saved = copies.to_dict()
    assert saved == {
        "states": [
            {"dataset_state": {"a": 1}, "iterator_state": None, "iterator_ended": False, "served": 2},
            None,
            {"dataset_state": None, "iterator_state": None, "iterator_ended": True, "served": 3},
        ],
        "retired": [2],
        "next": 1,
    }
    assert Copies.of(saved) == copies
    assert copies.states[1] is None and copies.retired == (2,) and copies.next_turn == 1
    assert IterableProgress(3, Copies.of(saved)).snapshot() == copies
    assert Copies.of(None) is None


def test_copies_start_the_next_epoch_from_each_datasets_state():
    copies = Copies(
        (CopyState({"a": 1}, {"at": 4}, True, 5), None, CopyState(None, None, False, 2)), retired=(0,), next_turn=2
    )
    assert copies.next_epoch() == Copies(
        (CopyState({"a": 1}, None, False, 0), None, CopyState(None, None, False, 0)), retired=(), next_turn=0
    )
    assert copies.reads_again == 2  # (only the copy with no state that had not ended reads its items again)


def test_a_replay_point_round_trips_however_deep():
    for point in (
        {"state": {"i": 1}},
        {"generator": [1, 2]},
        {"inner": {"inner": {"generator": "g"}}},
        {"inner": None},
    ):
        record = ReplayPoint.of(point)
        assert record is not None and record.to_dict() == point
    nested = ReplayPoint.of({"inner": {"state": {"i": 1}}})
    assert nested == ReplayPoint("inner", ReplayPoint("state", {"i": 1}))
    assert ReplayPoint.of(None) is None


def test_a_replay_point_decodes_against_the_loaders_sampler():
    make, take, _ = REPLAYED
    state = saved_state(make, take)
    decoded = LoaderState.from_dict(state, plan_of(make()))
    assert ReplayPoint.from_dict(state["replay"], plan_of(make())) == decoded.replay
    assert decoded.replay is not None and decoded.replay.to_dict() == state["replay"]
