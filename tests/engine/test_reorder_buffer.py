"""The reorder buffer, driven directly (no loader, no workers).

``ReorderBuffer`` takes finished batches in any order and hands them out in
plan order (``in_order=True``) or in the order they arrived
(``in_order=False``). A *retired* batch (an iterable's copy ran out before
filling it) holds its place in the plan and is passed over, and
``on_retired(index)`` says when delivery passes it. A resumed epoch starts
at ``first_index`` and passes over ``skip`` (batches delivered before the
save). ``finish`` passes what is still retired at the end of an epoch.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor._engine.executor.reorder import ReorderBuffer


def drained(buffer: ReorderBuffer) -> list:
    """Every record ``take`` gives now, until it gives None."""
    out = []
    while (record := buffer.take()) is not None:
        out.append(record)
    return out


class Passed(list):
    """An ``on_retired`` that lists the indices delivery passed."""

    def __call__(self, index: int) -> None:
        self.append(index)


# ------------------------------------------------------------------ in order


def test_in_order_holds_a_batch_until_the_ones_before_it_arrive():
    buffer = ReorderBuffer(in_order=True)
    buffer.put(2, "b2")
    buffer.put(1, "b1")
    assert buffer.take() is None and len(buffer) == 2  # batch 0 is missing
    buffer.put(0, "b0")
    assert drained(buffer) == ["b0", "b1", "b2"]
    assert len(buffer) == 0 and buffer.next_index == 3


def test_in_order_takes_one_record_at_a_time_as_its_turn_comes():
    buffer = ReorderBuffer(in_order=True)
    buffer.put(0, "b0")
    assert buffer.take() == "b0" and buffer.take() is None
    buffer.put(1, "b1")
    assert buffer.take() == "b1" and buffer.next_index == 2


def test_in_order_passes_a_retired_batch_in_its_place():
    passed = Passed()
    buffer = ReorderBuffer(in_order=True, on_retired=passed)
    buffer.retire(1)
    assert passed == []  # not passed until delivery reaches it
    buffer.put(2, "b2")
    assert buffer.take() is None and passed == []  # batch 0 still missing
    buffer.put(0, "b0")
    assert buffer.take() == "b0" and passed == []
    assert buffer.take() == "b2" and passed == [1]  # passed on the way to batch 2
    assert buffer.next_index == 3


def test_in_order_passes_retired_batches_at_the_front_on_the_next_take():
    passed = Passed()
    buffer = ReorderBuffer(in_order=True, on_retired=passed)
    buffer.retire(0)
    buffer.retire(1)
    assert buffer.take() is None and passed == [0, 1] and buffer.next_index == 2
    buffer.put(2, "b2")
    assert buffer.take() == "b2"


def test_a_resumed_epoch_starts_at_first_index_and_passes_over_skip():
    passed = Passed()
    buffer = ReorderBuffer(in_order=True, first_index=3, skip=frozenset({4, 6}), on_retired=passed)
    assert buffer.next_index == 3
    buffer.put(5, "b5")
    buffer.put(7, "b7")
    assert buffer.take() is None  # batch 3 is the first of the resumed epoch
    buffer.put(3, "b3")
    assert drained(buffer) == ["b3", "b5", "b7"]
    assert passed == [4, 6]  # skipped batches are passed over as retired ones are
    assert buffer.next_index == 8


# -------------------------------------------------------------- out of order


def test_out_of_order_gives_batches_as_they_arrived():
    buffer = ReorderBuffer(in_order=False)
    for index in (3, 0, 2):
        buffer.put(index, f"b{index}")
    assert drained(buffer) == ["b3", "b0", "b2"]
    buffer.put(1, "b1")
    assert buffer.take() == "b1" and buffer.take() is None and len(buffer) == 0


def test_out_of_order_passes_a_retired_batch_when_its_turn_in_arrival_comes():
    passed = Passed()
    buffer = ReorderBuffer(in_order=False, on_retired=passed)
    buffer.put(2, "b2")
    buffer.retire(0)
    buffer.put(1, "b1")
    assert buffer.take() == "b2" and passed == []
    assert buffer.take() == "b1" and passed == [0]
    assert buffer.take() is None


def test_out_of_order_skip_is_never_delivered_and_finish_passes_it():
    passed = Passed()
    buffer = ReorderBuffer(in_order=False, first_index=2, skip=frozenset({3}), on_retired=passed)
    buffer.put(4, "b4")
    buffer.put(2, "b2")
    assert drained(buffer) == ["b4", "b2"] and passed == []
    buffer.finish()
    assert passed == [3]


# --------------------------------------------------------------------- finish


def test_finish_passes_the_retired_batches_no_delivery_reached_in_plan_order():
    passed = Passed()
    buffer = ReorderBuffer(in_order=True, on_retired=passed)
    buffer.put(0, "b0")
    for index in (5, 3, 4):
        buffer.retire(index)
    assert drained(buffer) == ["b0"] and passed == []  # batches 1 and 2 never came
    buffer.finish()
    assert passed == [3, 4, 5]
    buffer.finish()
    assert passed == [3, 4, 5], "a second finish passes nothing again"


def test_retiring_and_finishing_without_on_retired_is_quiet():
    for in_order in (True, False):
        buffer = ReorderBuffer(in_order)
        buffer.retire(0)
        buffer.put(1, "b1")
        assert drained(buffer) == ["b1"]
        buffer.retire(2)
        buffer.finish()
        assert buffer.take() is None


# ------------------------------------------------------------ any interleaving


@st.composite
def epochs(draw):
    """An epoch of n batches: which are retired, the order they come back
    in, and after each arrival how many takes the consumer tries."""
    n = draw(st.integers(0, 24))
    retired = draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n)) if n else set()
    order = draw(st.permutations(range(n)))
    takes = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return n, retired, order, takes


def run_epoch(in_order: bool, n: int, retired: set, order: list, takes: list) -> tuple[list, Passed]:
    passed = Passed()
    buffer = ReorderBuffer(in_order, on_retired=passed)
    delivered = []
    for index, tries in zip(order, takes):
        if index in retired:
            buffer.retire(index)
        else:
            buffer.put(index, index)
        for _ in range(tries):
            record = buffer.take()
            if record is not None:
                delivered.append(record)
        assert len(buffer) <= n
    delivered += drained(buffer)
    buffer.finish()
    assert len(buffer) == 0
    return delivered, passed


@settings(max_examples=200, deadline=None)
@given(epochs())
def test_in_order_any_arrival_gives_the_plan_order_and_passes_each_retired_batch_once(epoch):
    n, retired, order, takes = epoch
    delivered, passed = run_epoch(True, n, retired, order, takes)
    assert delivered == [i for i in range(n) if i not in retired]
    assert sorted(passed) == sorted(retired) and len(passed) == len(set(passed))
    # Delivery and passing together walk the plan in order (before finish, which comes last).
    assert passed == sorted(passed)


@settings(max_examples=200, deadline=None)
@given(epochs())
def test_out_of_order_any_arrival_gives_every_batch_once_in_arrival_order(epoch):
    n, retired, order, takes = epoch
    delivered, passed = run_epoch(False, n, retired, order, takes)
    assert delivered == [i for i in order if i not in retired]
    assert passed == [i for i in order if i in retired]
