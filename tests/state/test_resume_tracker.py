"""The ResumeTracker, driven directly through a loader's plan.

The tracker is the one owner of a loader's resumable state: ``begin`` starts
a pass (its epoch, base seed, progress record and what it resumes),
``save`` encodes where the loader stands, ``load`` checks a state and keeps
it for the next ``begin``, ``set_epoch`` keeps or drops a loaded resume
point. Here a test plays the loader's part: it takes the plan a DataLoader
makes (``plan_of``, with the index sampler the test drives), draws batches from the plan's index sampler
and reports them delivered to the pass's progress as the loader's iterator
does. Where a DataLoader with the same arguments exists, the tracker's
states are compared with the loader's own.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

import conveyor
from conveyor import rng
from conveyor.loader import _InfiniteConstantSampler
from conveyor.loader._plan import Plan
from conveyor.sampler import BatchSampler, RandomSampler
from conveyor.state import ResumeTracker
from conveyor.state._encoding import STATE_VERSION, checksum
from conveyor.state._records import Copies
from conveyor.state._settings import settings

N = 10
BATCH = 4
SEED = 7


def plan_of(sampler, *, dataset=None, seed=SEED, generator=None, num_workers=0, persistent=False, batch_size=BATCH):
    """The plan ``DataLoader(dataset, batch_size, sampler=..., seed=...)`` makes: a loader's own
    plan, with ``sampler`` (batched) as its index sampler."""
    data = list(range(N)) if dataset is None else dataset
    loader = conveyor.DataLoader(
        data,
        batch_size=batch_size,
        seed=seed,
        generator=generator,
        num_workers=num_workers,
        persistent_workers=persistent,
    )
    plan = loader._plan()
    return dataclasses.replace(plan, sampling=dataclasses.replace(plan.sampling, index_sampler=sampler))


def shuffled(seed=SEED, batch_size=BATCH, generator=None):
    """The plan of ``DataLoader(range(N), batch_size, shuffle=True, seed=seed)`` (or ``generator=``)."""
    data = list(range(N))
    inner = RandomSampler(data, generator=generator, seed=seed if generator is None else None)
    return plan_of(
        BatchSampler(inner, batch_size, False),
        seed=seed if generator is None else None,
        generator=generator,
        batch_size=batch_size,
    )


class Pass:
    """One pass as the loader's iterator drives it: begin, draw, deliver."""

    def __init__(self, tracker: ResumeTracker, plan: Plan):
        self.start = tracker.begin(plan)
        self.plan = plan
        self.next_index = self.start.progress.position  # (a resumed pass's stands where its state stood)
        self._first = self.next_index == 0
        self._indices = iter(plan.sampling.index_sampler)
        self._drawn = 0
        self._ahead: list = []
        # A save before the first delivery asks for the epoch's draw (the loader's _first_draw.FirstDrawAhead).
        self.start.progress.draw_first = self._draw_ahead

    def _draw_ahead(self) -> None:
        if self._drawn == 0:
            self._ahead.append(self._draw())

    def deliver(self, count: int) -> list:
        batches = []
        for _ in range(count):
            batches.append(self._draw())
            self.start.progress.delivered(self.next_index)
            self.next_index += 1
        return batches

    def finish(self) -> list:
        batches = []
        while True:
            try:
                batches.append(self._draw())
            except StopIteration:
                break
            self.start.progress.delivered(self.next_index)
            self.next_index += 1
        self.start.progress.finished = True
        return batches

    def _draw(self):
        if self._ahead:
            return self._ahead.pop()
        batch = next(self._indices)
        if self._drawn == 0:
            self.start.progress.note_first_draw(self.plan.sampling.index_sampler, batch, first=self._first)
        self._drawn += 1
        return batch


# ------------------------------------------------------------------- begin


def test_a_fresh_tracker_begins_epoch_0_with_the_seeds_base_seed_and_counts_on():
    tracker, plan = ResumeTracker(), shuffled()
    start = tracker.begin(plan)
    assert (start.epoch, start.base_seed, start.resume, start.copies) == (0, rng.derive_seed(SEED, 0), None, None)
    assert start.progress.position == 0 and start.progress.epoch == 0 and not start.progress.finished
    assert tracker.epoch == 1
    second = tracker.begin(plan)  # (an abandoned pass counts as an epoch, as in torch)
    assert (second.epoch, second.base_seed) == (1, rng.derive_seed(SEED, 1))


def test_the_base_seed_is_drawn_from_the_generator_once_per_pass():
    generator = np.random.default_rng(5)
    expected = np.random.default_rng(5)
    tracker, plan = ResumeTracker(), shuffled(generator=generator)
    first, second = tracker.begin(plan), tracker.begin(plan)
    source = rng.source_for(expected, "numpy")
    assert [first.base_seed, second.base_seed] == [source.draw_seed(), source.draw_seed()]


def test_persistent_workers_draw_the_base_seed_once_and_derive_the_next():
    generator = np.random.default_rng(5)
    data = list(range(N))
    sampler = BatchSampler(RandomSampler(data, generator=generator), BATCH, False)
    plan = plan_of(sampler, seed=None, generator=generator, num_workers=2, persistent=True)
    tracker = ResumeTracker()
    first = tracker.begin(plan)
    before = generator.bit_generator.state
    second = tracker.begin(plan)
    assert second.base_seed == rng.derive_seed(first.base_seed, 1)
    assert generator.bit_generator.state == before  # nothing drawn for it


# -------------------------------------------------------------------- save


def test_a_state_before_any_pass_is_the_start_of_epoch_0_sealed_with_its_settings():
    plan = shuffled()
    state = ResumeTracker().save(plan)
    assert state["version"] == STATE_VERSION and state["kind"] == "DataLoader"
    assert state["settings"] == settings(plan) and state["checksum"] == checksum(state)
    assert (state["epoch"], state["in_epoch"], state["position"], state["delivered_ahead"]) == (0, False, 0, [])
    assert state["base_seed"] == rng.derive_seed(SEED, 0)
    assert json.loads(json.dumps(state)) == state


def test_a_state_inside_an_epoch_names_the_batches_delivered():
    tracker, plan = ResumeTracker(), shuffled()
    run = Pass(tracker, plan)
    run.deliver(2)
    state = tracker.save(plan)
    assert (state["epoch"], state["in_epoch"], state["position"], state["delivered_ahead"]) == (0, True, 2, [])
    assert state["base_seed"] == run.start.base_seed
    assert state["sampler"]["position"] == 2 and state["sampler"]["in_iteration"] is True
    assert state["first_batch"] is not None


def test_batches_delivered_ahead_of_a_missing_one_are_listed():
    tracker, plan = ResumeTracker(), shuffled()
    progress = tracker.begin(plan).progress
    for index in (0, 2, 3):
        progress.delivered(index)
    state = tracker.save(plan)
    assert state["position"] == 1 and state["delivered_ahead"] == [2, 3]
    progress.delivered(1)
    assert tracker.save(plan)["position"] == 4 and tracker.save(plan)["delivered_ahead"] == []


def test_a_finished_pass_saves_the_start_of_the_next_epoch():
    tracker, plan = ResumeTracker(), shuffled()
    Pass(tracker, plan).finish()
    state = tracker.save(plan)
    assert (state["epoch"], state["in_epoch"], state["position"]) == (1, False, 0)
    assert state["base_seed"] == rng.derive_seed(SEED, 1)


@pytest.mark.parametrize("delivered", [0, 2, "all"])
def test_the_tracker_saves_what_a_loader_with_the_same_arguments_saves(delivered):
    loader = conveyor.DataLoader(list(range(N)), batch_size=BATCH, shuffle=True, seed=SEED)
    tracker, plan = ResumeTracker(), shuffled()
    run = Pass(tracker, plan)
    it = iter(loader)
    if delivered == "all":
        assert [b.tolist() for b in it] == run.finish()
    else:
        assert [next(it).tolist() for _ in range(delivered)] == run.deliver(delivered)
    assert tracker.save(plan) == loader.state_dict()


# -------------------------------------------------------------------- load


def test_a_loaded_state_waits_for_the_next_begin_and_resumes_there():
    reference_tracker, reference_plan = ResumeTracker(), shuffled()
    reference = Pass(reference_tracker, reference_plan)
    reference_batches = reference.finish()
    next_epoch = reference_tracker.begin(reference_plan)

    saving_tracker, saving_plan = ResumeTracker(), shuffled()
    Pass(saving_tracker, saving_plan).deliver(2)
    state = json.loads(json.dumps(saving_tracker.save(saving_plan)))

    tracker, plan = ResumeTracker(), shuffled()
    tracker.load(plan, state)
    assert tracker.save(plan) == state  # loaded, not yet begun: the state as loaded
    resumed = Pass(tracker, plan)
    start = resumed.start
    assert (start.epoch, start.base_seed) == (0, reference.start.base_seed)
    assert start.resume is not None and start.resume.state.position == 2 and start.progress.position == 2
    assert resumed.finish() == reference_batches[2:]
    after = tracker.begin(plan)
    assert (after.epoch, after.base_seed) == (next_epoch.epoch, next_epoch.base_seed)


def test_a_state_between_epochs_loads_as_the_start_of_the_next():
    saving_tracker, saving_plan = ResumeTracker(), shuffled()
    Pass(saving_tracker, saving_plan).finish()
    state = saving_tracker.save(saving_plan)
    tracker, plan = ResumeTracker(), shuffled()
    tracker.load(plan, state)
    start = tracker.begin(plan)
    assert (start.epoch, start.base_seed, start.resume) == (1, rng.derive_seed(SEED, 1), None)


def test_a_state_between_epochs_holds_the_generators_next_draws():
    """Saved between epochs, the next epoch's base seed (and the sampler's
    draw) are taken from the generator at once, so a tracker that loads the
    state into a generator seeded otherwise begins the same epoch."""
    g = np.random.default_rng(5)
    tracker, plan = ResumeTracker(), shuffled(generator=g)
    Pass(tracker, plan).finish()
    state = tracker.save(plan)
    assert tracker.save(plan) == state  # a second save draws nothing more
    other = np.random.default_rng(999)
    loaded_tracker, loaded_plan = ResumeTracker(), shuffled(generator=other)
    loaded_tracker.load(loaded_plan, json.loads(json.dumps(state)))
    expected, resumed = Pass(tracker, plan), Pass(loaded_tracker, loaded_plan)
    assert resumed.start.base_seed == expected.start.base_seed and resumed.start.epoch == expected.start.epoch == 1
    assert resumed.finish() == expected.finish()


def test_an_empty_state_loads_nothing():
    tracker, plan = ResumeTracker(), shuffled()
    before = tracker.save(plan)
    tracker.load(plan, {})
    assert tracker.save(plan) == before and tracker.begin(plan).resume is None


def test_a_state_from_other_settings_is_refused_and_changes_nothing():
    saving_tracker, saving_plan = ResumeTracker(), shuffled()
    Pass(saving_tracker, saving_plan).deliver(1)
    state = saving_tracker.save(saving_plan)
    tracker, plan = ResumeTracker(), shuffled(batch_size=BATCH + 1)
    before = tracker.save(plan)
    with pytest.raises(ValueError, match="batch_size") as error:
        tracker.load(plan, state)
    assert "this loader:" in str(error.value) and "Fix:" in str(error.value)
    assert tracker.save(plan) == before
    assert tracker.begin(plan).resume is None


def test_an_edited_state_is_refused():
    tracker, plan = ResumeTracker(), shuffled()
    Pass(tracker, plan).deliver(1)
    state = tracker.save(plan)
    with pytest.raises(ValueError, match="changed after it was saved"):
        ResumeTracker().load(shuffled(), {**state, "position": 2})


# --------------------------------------------------------------- set_epoch


def test_set_epoch_picks_the_next_pass_epoch():
    tracker, plan = ResumeTracker(), shuffled()
    assert tracker.set_epoch(5, "DataLoader") is False
    start = tracker.begin(plan)
    assert (start.epoch, start.base_seed) == (5, rng.derive_seed(SEED, 5))


def test_set_epoch_keeps_a_loaded_resume_point_of_its_epoch_and_drops_another_with_a_warning():
    saving_tracker, saving_plan = ResumeTracker(), shuffled()
    Pass(saving_tracker, saving_plan).deliver(2)
    state = saving_tracker.save(saving_plan)

    tracker, plan = ResumeTracker(), shuffled()
    tracker.load(plan, state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tracker.set_epoch(0, "DataLoader") is False
    assert tracker.begin(plan).resume.state.position == 2

    tracker, plan = ResumeTracker(), shuffled()
    tracker.load(plan, state)
    with pytest.warns(UserWarning, match=r"Owner\.set_epoch\(3\) drops the resume point .* call set_epoch\(0\)"):
        assert tracker.set_epoch(3, "Owner") is True
    start = tracker.begin(plan)
    assert start.resume is None and start.epoch == 3


# --------------------------------------------------------- iterable datasets


class Counter(conveyor.IterableDataset):
    """Counts its passes: its own state, carried from epoch to epoch."""

    def __init__(self):
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(range(3))

    def state_dict(self):
        return {"passes": self.passes}

    def load_state_dict(self, state):
        self.passes = state["passes"]


def iterable_plan(dataset):
    """The plan of ``DataLoader(dataset, batch_size=BATCH)`` over an iterable dataset."""
    return plan_of(BatchSampler(_InfiniteConstantSampler(), BATCH, False), dataset=dataset, seed=None)


def test_between_epochs_an_iterable_datasets_own_state_is_saved_and_loaded_with_no_workers():
    dataset = Counter()
    tracker, plan = ResumeTracker(), iterable_plan(dataset)
    tracker.begin(plan).progress.finished = True
    iter(dataset)
    iter(dataset)
    state = tracker.save(plan)
    assert state["dataset_state"] == {"passes": 2} and state["settings"]["dataset"] == "iterable"
    fresh = Counter()
    ResumeTracker().load(iterable_plan(fresh), state)
    assert fresh.passes == 2


def test_an_iterable_datasets_copies_go_in_the_state_and_come_back_at_the_next_begin():
    tracker, plan = ResumeTracker(), iterable_plan(Counter())
    progress = tracker.begin(plan).progress
    copies = {
        "states": [{"dataset_state": {"passes": 1}, "iterator_state": None, "iterator_ended": False, "served": 1}],
        "retired": [],
        "next": 0,
    }
    progress.copies = Copies.of(copies)  # (as the executor reports them)
    progress.delivered(0)
    state = tracker.save(plan)
    assert state["copies"] == copies and state["in_epoch"] is True
    loaded = ResumeTracker()
    loaded_plan = iterable_plan(Counter())
    loaded.load(loaded_plan, json.loads(json.dumps(state)))
    start = loaded.begin(loaded_plan)
    assert start.copies == Copies.of(copies) and start.resume.state.position == 1
