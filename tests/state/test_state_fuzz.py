"""Crafted loader states: refused clearly, or loaded and iterated correctly, never hung.

A state comes from disk and may have been edited. Each case here takes a
real state (map-style and iterable loaders, in-process and with worker
threads, seeded, with generators, distributed, with skipped samples,
between epochs and inside one), changes one field anywhere in it (another
type, a huge or negative number, a missing key) and recomputes the checksum,
as a careful forger would. Then ``load_state_dict`` either

* refuses it with a ValueError or TypeError naming ``load_state_dict`` and
  a key on the edited path, leaving the loader as it was (its own state
  unchanged), or
* loads it, and the loader then gives two whole passes of valid samples.

Nothing may hang (each case runs under a watchdog). What lies inside a
dataset's or its iterator's own state is theirs to check and is not edited
here; replacing such a state whole must be refused at load, or make their
``load_state_dict`` raise, when the copy starts, an error naming the key.
"""

from __future__ import annotations

import _thread
import copy
import random
import threading
import warnings

import numpy as np
import pytest

import conveyor
from conveyor.state._encoding import checksum
from resume_helpers import CountingIterator

pytestmark = pytest.mark.timeout(600)

#: Edits per scenario.
CASES = 220
#: A case that takes longer than this is a hang (each takes milliseconds).
HANG_S = 20.0

VALUES = [
    None,
    -1,
    0,
    1,
    2,
    10**18,
    -(10**18),
    2**64,
    "x",
    "",
    "0123abcd",
    1.5,
    float("nan"),
    [],
    {},
    True,
    False,
    [0, 1],
    {"a": 1},
    [None],
    [10**18],
]


class Counting(conveyor.IterableDataset):
    """An iterable with a dataset state and an iterator state."""

    def __init__(self):
        self.start = 0

    def __iter__(self):
        info = conveyor.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return CountingIterator(list(range(self.start + worker, 10, workers)))

    def state_dict(self):
        return {"start": self.start}

    def load_state_dict(self, state):
        self.start = state["start"]


class Plain(conveyor.IterableDataset):
    def __iter__(self):
        return iter(range(10))


class Flaky(conveyor.Dataset):
    """Sample 4 raises (skip_bad_samples leaves it out)."""

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i == 4:
            raise OSError("truncated")
        return i


def _torch_loader():
    torch = pytest.importorskip("torch")
    import conveyor.torch as ct

    return ct.DataLoader(list(range(20)), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(5))


THREADS = {"num_workers": 2, "worker_method": "thread"}
SCENARIOS = {
    # name: (make a loader, batches to take before saving, what every sample must be)
    "map, seed": (lambda: conveyor.DataLoader(list(range(20)), batch_size=3, shuffle=True, seed=1), 2, range(20)),
    "map, numpy generator": (
        lambda: conveyor.DataLoader(list(range(20)), batch_size=3, shuffle=True, generator=np.random.default_rng(0)),
        2,
        range(20),
    ),
    "map, global generator": (lambda: conveyor.DataLoader(list(range(20)), batch_size=3, shuffle=True), 2, range(20)),
    "map, torch generator": (_torch_loader, 3, range(20)),
    "map, between epochs": (
        lambda: conveyor.DataLoader(list(range(20)), batch_size=3, shuffle=True, seed=1),
        99,
        range(20),
    ),
    "map, unbatched": (
        lambda: conveyor.DataLoader(list(range(20)), batch_size=None, shuffle=True, seed=2),
        3,
        range(20),
    ),
    "map, threads, out of order": (
        lambda: conveyor.DataLoader(list(range(20)), batch_size=3, shuffle=True, seed=1, in_order=False, **THREADS),
        2,
        range(20),
    ),
    "map, weighted": (
        lambda: conveyor.DataLoader(
            list(range(20)),
            batch_size=3,
            sampler=conveyor.WeightedRandomSampler([1.0] * 20, 20, generator=np.random.default_rng(3)),
        ),
        2,
        range(20),
    ),
    "map, distributed": (
        lambda: conveyor.DataLoader(
            list(range(20)),
            batch_size=3,
            sampler=conveyor.DistributedSampler(list(range(20)), num_replicas=2, rank=1, seed=4),
        ),
        1,
        range(20),
    ),
    "map, skipped samples": (lambda: conveyor.DataLoader(Flaky(), batch_size=3, skip_bad_samples=3), 3, range(20)),
    "iterable": (lambda: conveyor.DataLoader(Counting(), batch_size=3), 1, range(10)),
    "iterable without state": (lambda: conveyor.DataLoader(Plain(), batch_size=3), 1, range(10)),
    "iterable, between epochs": (lambda: conveyor.DataLoader(Counting(), batch_size=3), 99, range(10)),
    "iterable, threads": (lambda: conveyor.DataLoader(Counting(), batch_size=2, **THREADS), 3, range(10)),
    "iterable, persistent threads, between epochs": (
        lambda: conveyor.DataLoader(Counting(), batch_size=2, persistent_workers=True, **THREADS),
        99,
        range(10),
    ),
}


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, prefix + (index,))


def edited(state, chance):
    """``state`` with one field changed (or removed) and its checksum made
    anew; the edited path."""
    state = copy.deepcopy(state)
    path = chance.choice([p for p in _paths(state) if p and p != ("checksum",) and not _inside_user_part(p)])
    parent = state
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and chance.random() < 0.1:
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(chance.choice(VALUES))
    state["checksum"] = checksum(state)
    return state, path


_USER_PARTS = ("dataset_state", "iterator_state")


def _user_part(path):
    """Whether ``path`` is a dataset's or an iterator's own state: theirs
    to check (their load_state_dict runs when the copy starts)."""
    return path[-1] in _USER_PARTS


def _inside_user_part(path):
    """What lies inside such a state is the dataset's business: not edited here."""
    return any(key in _USER_PARTS for key in path[:-1])


def _names_a_key(text, path):
    return any(isinstance(key, str) and key in text for key in path)


class Watchdog:
    """Interrupts the main thread (KeyboardInterrupt) if a case outlives ``HANG_S``."""

    def __enter__(self):
        self.fired = False
        self._timer = threading.Timer(HANG_S, self._fire)
        self._timer.start()
        return self

    def _fire(self):
        self.fired = True
        _thread.interrupt_main()

    def __exit__(self, *exc):
        self._timer.cancel()
        return False


def saved_state(make, take):
    loader = make()
    batches = iter(loader)
    for _ in range(take):
        if next(batches, None) is None:
            break
    state = loader.state_dict()
    del batches
    return state


def samples(batch):
    return np.asarray(batch).ravel().tolist()


def try_case(make, state, path, valid):
    """None when the case holds, else what went wrong."""
    loader = make()
    before = loader.state_dict()
    try:
        loader.load_state_dict(state)
    except (ValueError, TypeError) as exc:
        text = str(exc)
        if "load_state_dict" not in text or not _names_a_key(text, path):
            return f"refused without naming load_state_dict and the key: {type(exc).__name__}: {text}"
        if loader.state_dict() != before:
            return f"refused ({text.splitlines()[0]}) but the loader changed"
        return None
    except Exception as exc:
        return f"load_state_dict raised {type(exc).__name__}: {exc}"
    try:
        got = [samples(b) for _ in range(2) for b in loader]
    except Exception as exc:
        text = "".join(__import__("traceback").format_exception(exc))
        if _user_part(path) and "load_state_dict" in text and _names_a_key(text, path):
            return None  # (the dataset's own load_state_dict refused its part, and the error says where it came from)
        return f"loaded, then iterating raised {type(exc).__name__}: {str(exc)[:300]}"
    bad = [value for batch in got for value in batch if value not in valid]
    return f"loaded, then gave samples {bad[:5]} that are not the dataset's" if bad else None


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_an_edited_state_is_refused_or_resumes(scenario):
    make, take, valid = SCENARIOS[scenario]
    warnings.simplefilter("ignore")  # (fast-forward and set_epoch warnings are not the point here)
    state = saved_state(make, take)
    chance = random.Random(scenario)
    failures = []
    for case in range(CASES):
        bad, path = edited(state, chance)
        try:
            with Watchdog() as watchdog:
                problem = try_case(make, bad, path, set(valid))
        except KeyboardInterrupt:
            if not watchdog.fired:
                raise
            problem = f"hung for {HANG_S} s"
        if problem is not None:
            failures.append(f"case {case}, {path!r} = {_at(bad, path)!r}: {problem}")
    assert not failures, f"{len(failures)} of {CASES} edits of a '{scenario}' state:\n" + "\n".join(failures[:10])


def _at(state, path):
    value = state
    try:
        for key in path:
            value = value[key]
    except (KeyError, IndexError, TypeError):
        return "<removed>"
    return value


def _sealed(state, **changes):
    """``state`` with fields changed along dotted paths, its checksum made anew."""
    state = copy.deepcopy(state)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = state
        for key in parents:
            target = target[int(key) if key.isdigit() else key]
        target[int(last) if last.isdigit() else last] = value
    state["checksum"] = checksum(state)
    return state


@pytest.mark.parametrize(
    "scenario,changes,key",
    [
        ("iterable", {"sampler__position": 10**18, "position": 10**18}, None),  # loads, and iterates without spinning
        ("iterable", {"sampler__position": 10**18}, "sampler"),
        ("map, global generator", {"sampler__sampler__rng": None}, "rng"),
        ("map, numpy generator", {"sampler__sampler__rng": {"state": "x"}}, "rng"),
        ("map, numpy generator", {"generator_state": 7}, "generator_state"),
        ("map, torch generator", {"generator_state": "not base64"}, "generator_state"),
        ("iterable", {"copies__states__0__served": "3"}, "served"),
        ("iterable", {"copies__states__0__iterator_ended": 1}, "iterator_ended"),
        ("iterable", {"copies__states__0__dataset_state": "x"}, "dataset_state"),
        ("iterable without state", {"copies__states__0__dataset_state": {"start": 1}}, "dataset_state"),
        ("iterable", {"copies__states__0__served": 10**18}, "copies"),
    ],
)
def test_the_states_the_issue_names(scenario, changes, key):
    make, take, valid = SCENARIOS[scenario]
    state = _sealed(saved_state(make, take), **changes)
    loader = make()
    before = loader.state_dict()
    if key is None:
        loader.load_state_dict(state)
        with Watchdog():
            assert all(value in valid for batch in loader for value in samples(batch))
        return
    with pytest.raises(ValueError, match=r"DataLoader.load_state_dict|Sampler.load_state_dict") as raised:
        loader.load_state_dict(state)
    assert repr(key) in str(raised.value) or key in str(raised.value), str(raised.value)
    assert loader.state_dict() == before
