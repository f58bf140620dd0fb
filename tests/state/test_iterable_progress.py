"""Where the workers' copies of an iterable dataset stand, driven directly.

``IterableProgress`` is updated as batches are delivered: each copy's own
state (a ``CopyState``), whose turn is next in the round robin, and which
copies ran out (counted only once delivery passes the batch they left
empty). Its ``snapshot`` (a ``Copies``) is the ``copies`` of a loader state,
and a progress built from a snapshot stands where the saved one stood.
"""

from __future__ import annotations

import json

from conveyor._engine.executor.progress import IterableProgress
from conveyor._engine.loading.copies import Copies, CopyState


def at(read: int, ended: bool = False) -> CopyState:
    """A copy that read ``read`` items (its iterator's state says so)."""
    return CopyState(dataset_state=None, iterator_state={"read": read}, iterator_ended=ended, served=read)


def test_a_fresh_progress_has_no_states_nothing_retired_and_worker_0_next():
    progress = IterableProgress(num_workers=3)
    assert progress.snapshot() == Copies((None, None, None), (), 0)
    assert progress.restore_points() == {}


def test_a_delivered_batch_records_its_copys_state_and_moves_the_turn_on():
    progress = IterableProgress(num_workers=3)
    progress.delivered(0, at(4))
    assert progress.snapshot() == Copies((at(4), None, None), (), 1)
    progress.delivered(2, at(7))
    assert progress.snapshot().next_turn == 0  # (after the last worker, the first)
    assert progress.restore_points() == {0: at(4), 2: at(7)}


def test_a_delivered_batch_without_state_keeps_the_copys_last_state():
    progress = IterableProgress(num_workers=2)
    progress.delivered(1, at(2))
    progress.delivered(1, None)  # (a copy without state_dict reports none)
    assert progress.snapshot() == Copies((None, at(2)), (), 0)


def test_a_copy_that_ran_out_is_retired_only_once_delivery_passes_its_batch():
    progress = IterableProgress(num_workers=2)
    progress.delivered(0, at(1))
    progress.exhausted(5, worker_id=1, state=at(3, ended=True))
    assert progress.snapshot().retired == ()  # batches before 5 may still come
    assert progress.snapshot().states[1] is None
    progress.passed(4)  # another batch: nothing to do with worker 1
    assert progress.snapshot().retired == ()
    progress.passed(5)
    assert progress.snapshot() == Copies((at(1), at(3, ended=True)), (1,), 1)
    progress.passed(5)  # passed again: no change
    assert progress.snapshot().retired == (1,)


def test_a_copy_that_ran_out_without_state_keeps_its_last_one():
    progress = IterableProgress(num_workers=2)
    progress.delivered(1, at(2))
    progress.exhausted(3, worker_id=1, state=None)
    progress.passed(3)
    assert progress.snapshot().states[1] == at(2) and progress.snapshot().retired == (1,)


def test_copies_are_retired_in_the_order_delivery_passed_them_and_once_each():
    progress = IterableProgress(num_workers=3)
    progress.exhausted(7, 2, None)
    progress.exhausted(4, 0, None)
    progress.passed(4)
    progress.passed(7)
    progress.exhausted(9, 0, None)  # (an epoch's copy reporting its end twice)
    progress.passed(9)
    assert progress.snapshot().retired == (0, 2)


def test_a_snapshot_stays_as_it_was_taken_and_saves_as_plain_values():
    progress = IterableProgress(num_workers=2)
    progress.delivered(0, at(1))
    progress.exhausted(1, 1, at(0))
    progress.passed(1)
    snapshot = progress.snapshot()
    saved = snapshot.to_dict()
    assert json.loads(json.dumps(saved)) == saved
    assert Copies.of(saved) == snapshot
    progress.delivered(0, at(2))  # progress goes on; the snapshot does not
    assert snapshot == Copies((at(1), at(0)), (1,), 1)
    assert progress.snapshot() == Copies((at(2), at(0)), (1,), 1)


def test_a_progress_built_from_a_snapshot_goes_on_where_the_saved_one_stood():
    saved = IterableProgress(num_workers=3)
    saved.delivered(0, at(5))
    saved.delivered(1, at(6))
    saved.exhausted(2, 2, at(1))
    saved.passed(2)
    snapshot = Copies.of(json.loads(json.dumps(saved.snapshot().to_dict())))
    resumed = IterableProgress(num_workers=3, saved=snapshot)
    assert resumed.snapshot() == saved.snapshot()
    assert resumed.restore_points() == {0: at(5), 1: at(6), 2: at(1)}
    for progress in (saved, resumed):  # and both go on alike
        progress.delivered(0, at(9))
        progress.exhausted(4, 1, None)
        progress.passed(4)
    assert resumed.snapshot() == saved.snapshot() == Copies((at(9), at(6), at(1)), (2, 1), 1)


def test_an_exhaustion_seen_before_a_save_and_passed_after_it_is_not_in_the_snapshot():
    """What a copy reported when it ran out waits for delivery to pass its
    batch; a snapshot taken in between does not count it (its batch was not
    delivered yet) and a progress built from that snapshot has not seen it."""
    progress = IterableProgress(num_workers=2)
    progress.exhausted(3, 0, at(2))
    snapshot = progress.snapshot()
    assert snapshot == Copies((None, None), (), 0)
    resumed = IterableProgress(num_workers=2, saved=snapshot)
    resumed.passed(3)
    assert resumed.snapshot() == snapshot


def test_a_copy_state_crosses_a_pipe_as_it_was():
    import pickle

    state = CopyState({"shard": 3}, {"at": [1, 2]}, True, 7)
    assert pickle.loads(pickle.dumps(state)) == state
    assert Copies.of(Copies((state, None), (0,), 1).to_dict()) == Copies((state, None), (0,), 1)
