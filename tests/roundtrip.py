"""One round trip for every stateful component: save at any point, load into
a fresh one, and what follows is what the uninterrupted run gave.

::

    reference:   build() ─ epoch 0 ─ epoch 1 ─ ...                         (items as plain values)
    each point:  build() ─ the epochs before ─ k items ─ state_dict() ─┐ (through JSON)
                 build() ─ load_state_dict(state) ─ the rest of the epoch, ─┘
                           then every later epoch     == the reference's, from that point on

A component is anything with ``state_dict``/``load_state_dict`` that is
iterated an epoch at a time: a sampler, a batch sampler, a DataLoader, a
shard reader. ``build()`` makes a fresh one with the same arguments each
time (a generator it draws from is made anew too). The points are, in every
epoch: before ``iter()`` (for epochs after the first: after the previous one
ended), and after ``k`` items for every ``k`` from 0 to the epoch's length
(``k`` = length: every item taken, the end not yet seen). At each point it
also checks that

* saving twice gives the same state, and the component that saved goes on
  with the reference's items (saving does not move it);
* a component that loaded a state and has not moved saves that state;
* the loaded component, one item further, saves a state that resumes too
  (the rest of the epoch and the later ones).

Where a component has epochs (``epochs`` > 1), each epoch is another
``iter()``; ``set_epoch=True`` calls ``set_epoch(e)`` before each, as a
training loop does (DistributedSampler needs it to change its order). The
helper asserts with the point in the message, so a failure names where the
round trip broke.
"""

from __future__ import annotations

import itertools
import json
from typing import Any, Callable, Iterator, Optional

import numpy as np


def plain(item: Any) -> Any:
    """``item`` as plain values that compare exactly: arrays and tensors as
    (dtype, shape, bytes); containers item by item."""
    if not isinstance(item, np.ndarray) and callable(getattr(item, "numpy", None)):
        item = item.numpy()  # (a torch tensor)
    if isinstance(item, np.ndarray):
        return ("array", item.dtype.str, item.shape, item.tobytes())
    if isinstance(item, np.generic):
        return item.item()
    if isinstance(item, dict):
        return {key: plain(value) for key, value in item.items()}
    if isinstance(item, (list, tuple)):
        return [plain(value) for value in item]
    return item


def through_json(state: Any) -> Any:
    """``state`` as a JSON file would give it back."""
    return json.loads(json.dumps(state))


def check_round_trip(
    build: Callable[[], Any],
    *,
    epochs: int = 2,
    set_epoch: bool = False,
    begin: Callable[[Any], Iterator] = iter,
    value: Callable[[Any], Any] = plain,
    encode: Callable[[Any], Any] = through_json,
    resaves: bool = True,
) -> int:
    """Save ``build()``'s component at every point of ``epochs`` epochs, load
    each state into a fresh ``build()``, and compare what follows with the
    uninterrupted run (see the module docstring). ``begin(component)`` is
    one epoch's iterator (``iter`` by default: a shard reader, its own
    iterator, takes ``lambda reader: reader``); ``value`` makes an item
    comparable; ``encode`` is what a state goes through between save and
    load; ``resaves=False`` leaves out the check that a component that has
    loaded a state saves it unchanged. Returns the number of points checked."""
    trip = _RoundTrip(build, epochs, set_epoch, begin, value, encode, resaves)
    points = 0
    for epoch in range(epochs):
        trip.check(epoch, None)
        points += 1
        for taken in range(len(trip.reference[epoch]) + 1):
            trip.check(epoch, taken)
            points += 1
    return points


class _RoundTrip:
    def __init__(self, build, epochs, set_epoch, begin, value, encode, resaves):
        self.build, self.epochs, self.set_epoch = build, epochs, set_epoch
        self.begin, self.value, self.encode, self.resaves = begin, value, encode, resaves
        component = build()
        self.reference = [self._rest(self._start(component, epoch)) for epoch in range(epochs)]
        assert any(self.reference), "the reference run gave no items: the round trip would check nothing"

    # -- one point ---------------------------------------------------------------

    def check(self, epoch: int, taken: Optional[int]) -> None:
        """Save at ``taken`` items of ``epoch`` (None: before its iter()), load, compare."""
        where = f"epoch {epoch}, " + ("before iter()" if taken is None else f"after {taken} items")
        expected = self.reference[epoch][taken or 0 :]
        saving = self.build()
        for earlier in range(epoch):
            assert self._rest(self._start(saving, earlier)) == self.reference[earlier], f"{where}: the run there"
        if taken is None:
            state = self._saved(saving, where)
        else:
            items = self._start(saving, epoch)
            assert self._take(items, taken) == self.reference[epoch][:taken], f"{where}: the run there"
            state = self._saved(saving, where)
            assert self._rest(items) == expected, f"{where}: the component that saved did not go on as before"
        loaded = self._loaded(state, where)
        items = self._start(loaded, epoch)
        head = self._take(items, 1)
        state_one_on = self._saved(loaded, f"{where}, resumed, one item on") if head else None
        assert head + self._rest(items) == expected, f"{where}: the resumed epoch differs from the reference's rest"
        for later in range(epoch + 1, self.epochs):
            got = self._rest(self._start(loaded, later))
            assert got == self.reference[later], f"{where}: epoch {later} after the resume differs"
        if state_one_on is not None:
            again = self._loaded(state_one_on, f"{where}, resumed, one item on")
            got = self._rest(self._start(again, epoch))
            assert got == expected[1:], f"{where}: a state saved by the resumed component does not resume"
            for later in range(epoch + 1, self.epochs):
                got = self._rest(self._start(again, later))
                assert got == self.reference[later], f"{where}: epoch {later} after the second resume differs"

    # -- steps ---------------------------------------------------------------------

    def _start(self, component: Any, epoch: int) -> Iterator:
        if self.set_epoch:
            component.set_epoch(epoch)
        return self.begin(component)

    def _take(self, items: Iterator, count: int) -> list:
        return [self.value(item) for item in itertools.islice(items, count)]

    def _rest(self, items: Iterator) -> list:
        return [self.value(item) for item in items]

    def _saved(self, component: Any, where: str) -> Any:
        state = self.encode(component.state_dict())
        assert self.encode(component.state_dict()) == state, f"{where}: two state_dict() calls in a row differ"
        return state

    def _loaded(self, state: Any, where: str) -> Any:
        component = self.build()
        component.load_state_dict(state)
        if self.resaves:
            assert self.encode(component.state_dict()) == state, f"{where}: after load_state_dict, state_dict() differs"
        return component
