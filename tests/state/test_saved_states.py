"""States saved by an earlier conveyor load and resume exactly in this one.

A user's checkpoint outlives the code that wrote it. ``tests/fixtures/saved_states.json``
holds states written by conveyor before the engine's reshaping (issue 22;
the file says which commit), each with digests of the batches that commit
delivered after the save: the rest of the epoch and the next one. Each case
here loads the old state into a loader built anew (its generators seeded
otherwise, as a restarted job's are) and checks that the batches that follow
are, bit for bit, the ones the old code gave; and the same run here saves
the same state, key for key. (Thread workers leave the
global generators to the training loop, so the samples here, which draw
from them, are not reproducible under threads; their states have the same
format as these.)

To write the file again (only when the state's format changes on purpose,
with a new ``STATE_VERSION``), run this module as a script with the code
that should write it on ``PYTHONPATH``::

    PYTHONPATH=src python tests/state/test_saved_states.py --write COMMIT

``tests/fixtures/saved_states_8361879.json`` holds the same cases as conveyor at
8361879 wrote them, in version 2's first layout, which ``state/_encoding.py``
brings to today's: they resume to the same batches.
"""

import hashlib
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))  # (run as a script: the shared helpers)

import conveyor  # noqa: E402
from conveyor.sampler.fingerprint import is_fingerprint  # noqa: E402
from conveyor.state._encoding import checksum, is_early_v2, upgrade  # noqa: E402
from resume_helpers import NAMES, make, plain  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "saved_states.json")
#: The same cases written by conveyor at 8361879, in version 2's first layout
#: (an iterable's copies in ``worker_progress`` and ``iterator_*``: state/_encoding.py).
EARLY_FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "saved_states_8361879.json")


# The datasets below are this file's own, not shared with the resume tests:
# the fixture's digests hold what they gave, so they must not change.
class Counter:
    """An iterator over ``range(n)`` with numpy noise, resumable by position."""

    def __init__(self, n):
        self.n, self.i = n, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return np.array([self.i - 1, np.random.rand()])

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


class Stream(conveyor.IterableDataset):
    """Each worker's copy reads its own share of ``range(n)``, through a resumable iterator."""

    def __init__(self, n=29):
        self.n = n

    def __iter__(self):
        info = conveyor.get_worker_info()
        counter = Counter(self.n)
        if info is None:
            return counter
        return (x for x in counter if int(x[0]) % info.num_workers == info.id)


class StatefulStream(conveyor.IterableDataset):
    """The dataset's copy keeps its position (its __iter__ is a generator)."""

    def __init__(self, n=29):
        self.n, self.start = n, 0

    def __iter__(self):
        for i in range(self.start, self.n):
            self.start = i + 1
            yield np.array([i, np.random.rand()])
        self.start = 0

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


def build(case, other=False):
    """The loader of ``case``; ``other=True`` seeds its generators otherwise."""
    if case["kind"] == "map":
        return make(case["name"], case["workers"], other=other, **case.get("options", {}))
    dataset = {"stream": Stream, "stateful-stream": StatefulStream}[case["name"]]()
    return conveyor.DataLoader(dataset, batch_size=3, num_workers=case["workers"], seed=11)


def digest(batch):
    return hashlib.sha256(repr(plain(batch)).encode()).hexdigest()[:20]


CASES = {
    **{f"{name}-0-workers": {"kind": "map", "name": name, "workers": 0, "epoch": 1, "position": 2} for name in NAMES},
    "shuffle-seed-2-workers": {"kind": "map", "name": "shuffle-seed", "workers": 2, "epoch": 1, "position": 3},
    "shuffle-seed-before-first-batch": {"kind": "map", "name": "shuffle-seed", "workers": 2, "epoch": 1, "position": 0},
    "distributed-2-workers": {"kind": "map", "name": "distributed", "workers": 2, "epoch": 0, "position": 2},
    "stream-0-workers": {"kind": "iterable", "name": "stream", "workers": 0, "epoch": 1, "position": 3},
    "stream-2-workers": {"kind": "iterable", "name": "stream", "workers": 2, "epoch": 1, "position": 3},
    "stateful-stream-2-workers": {
        "kind": "iterable",
        "name": "stateful-stream",
        "workers": 2,
        "epoch": 0,
        "position": 4,
    },
}


def save(case):
    """Runs ``case``'s loader to where it saves; its state (through JSON) and the pass's iterator."""
    loader = build(case)
    for epoch in range(case["epoch"]):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    loader.set_epoch(case["epoch"])
    it = iter(loader)
    for _ in range(case["position"]):
        next(it)
    return loader, json.loads(json.dumps(loader.state_dict())), it


def write(commit, path=FIXTURE):
    """Saves each case's state where it says and digests what follows (with the code on the path)."""
    cases = {}
    for key, case in CASES.items():
        loader, state, it = save(case)
        after = [digest(b) for b in it]
        loader.set_epoch(case["epoch"] + 1)
        after_next = [digest(b) for b in loader]
        cases[key] = {**case, "state": state, "rest_of_epoch": after, "next_epoch": after_next}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"written_by": f"conveyor at commit {commit}", "cases": cases}, f, indent=1, sort_keys=True)
        f.write("\n")


def load_fixture(path=FIXTURE):
    with open(path) as f:
        return json.load(f)


def test_the_fixture_covers_every_case():
    assert sorted(load_fixture()["cases"]) == sorted(CASES)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", sorted(CASES))
def test_an_old_state_resumes_exactly(key):
    saved = load_fixture()["cases"][key]
    loader = build(saved, other=True)
    loader.load_state_dict(saved["state"])
    loader.set_epoch(saved["epoch"])  # what a restarted loop does; keeps the resume point
    assert [digest(b) for b in loader] == saved["rest_of_epoch"]
    loader.set_epoch(saved["epoch"] + 1)
    assert [digest(b) for b in loader] == saved["next_epoch"]


def without_new_fingerprints(state, old):
    """``state`` less the argument fingerprints (``*_crc32``) that ``old``
    lacks, at any depth, with its checksum made again: what this code saves
    as the earlier code saved it (the fingerprints of weights and indices are
    recorded since 2026-12-02; states without them still load)."""

    def drop(new, before):
        if not (isinstance(new, dict) and isinstance(before, dict)):
            return new
        return {k: drop(v, before.get(k)) for k, v in new.items() if k in before or not is_fingerprint(k)}

    dropped = drop(state, old)
    return {**dropped, "checksum": checksum(dropped)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", sorted(CASES))
def test_this_code_saves_the_same_state(key):
    """The same run saves, key for key, the state the earlier code saved
    (and, where the sampler's arguments have fingerprints the earlier code
    did not record, those besides)."""
    saved = load_fixture()["cases"][key]
    _, state, _ = save(CASES[key])
    assert without_new_fingerprints(state, saved["state"]) == saved["state"]
    if key.startswith(("weighted", "subset")):
        assert state != saved["state"]  # (their weights' and indices' fingerprints are new)


def test_an_edited_old_state_is_refused():
    """The checksum of an old state still guards it: one changed position is refused, naming load_state_dict."""
    saved = load_fixture()["cases"]["shuffle-seed-0-workers"]
    edited = json.loads(json.dumps(saved["state"]))
    assert edited["position"] == saved["position"] == 2
    edited["position"] = 3
    with pytest.raises(ValueError, match="load_state_dict"):
        build(saved, other=True).load_state_dict(edited)


def test_the_early_fixture_covers_every_case_and_holds_the_same_runs():
    early, current = load_fixture(EARLY_FIXTURE)["cases"], load_fixture()["cases"]
    assert sorted(early) == sorted(CASES)
    for key in CASES:  # (both commits delivered the same batches after each save)
        assert early[key]["rest_of_epoch"] == current[key]["rest_of_epoch"], key
        assert early[key]["next_epoch"] == current[key]["next_epoch"], key
        assert is_early_v2(early[key]["state"]) and not is_early_v2(current[key]["state"]), key


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", sorted(CASES))
def test_an_early_layout_state_resumes_exactly(key):
    saved = load_fixture(EARLY_FIXTURE)["cases"][key]
    loader = build(saved, other=True)
    loader.load_state_dict(saved["state"])
    loader.set_epoch(saved["epoch"])
    assert [digest(b) for b in loader] == saved["rest_of_epoch"]
    loader.set_epoch(saved["epoch"] + 1)
    assert [digest(b) for b in loader] == saved["next_epoch"]


@pytest.mark.parametrize("key", sorted(CASES))
def test_an_early_layout_state_upgrades_to_what_this_code_saves(key):
    """Upgraded, the early state is the later one key for key (the index
    sampler's own state aside where its layout grew: DistributedSampler's
    ``num_samples``), and a loader given it saves it in today's layout."""
    early, current = load_fixture(EARLY_FIXTURE)["cases"][key], load_fixture()["cases"][key]
    upgraded = upgrade(early["state"])
    same = [name for name in current["state"] if name not in ("sampler", "checksum")]
    assert {name: upgraded[name] for name in same} == {name: current["state"][name] for name in same}
    assert set(upgraded) == set(current["state"])
    if "distributed" not in key:
        assert upgraded == current["state"]
    loader = build(early, other=True)
    loader.load_state_dict(early["state"])
    assert not is_early_v2(loader.state_dict())


def test_an_edited_early_layout_state_is_refused():
    saved = load_fixture(EARLY_FIXTURE)["cases"]["stream-0-workers"]
    edited = json.loads(json.dumps(saved["state"]))
    edited["iterator_served"] += 1
    with pytest.raises(ValueError, match="load_state_dict: the state was changed after it was saved"):
        build(saved, other=True).load_state_dict(edited)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--write":
        sys.exit("usage: PYTHONPATH=src python tests/state/test_saved_states.py --write COMMIT")
    write(sys.argv[2])
