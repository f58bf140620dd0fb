"""The epoch's first draw runs in a short-lived thread (loader/_first_draw.py), so
that a signal handler's state_dict() never waits on the main thread itself;
to the sampler it looks as if the loop's thread drew."""

from __future__ import annotations

import contextvars

import pytest

import conveyor

WHO = contextvars.ContextVar("who", default="unset")


class DrawsWho:
    """A batch sampler whose batches say what the context variable was when drawn."""

    def __iter__(self):
        yield [len(WHO.get())]
        yield [len(WHO.get())]

    def __len__(self):
        return 2


class FailsFirst:
    def __iter__(self):
        raise LookupError("the sampler's own error")
        yield  # (a generator)

    def __len__(self):
        return 1


def test_the_first_draw_sees_the_callers_context_variables():
    token = WHO.set("eleven char")
    try:
        loader = conveyor.DataLoader(list(range(20)), batch_sampler=DrawsWho(), collate_fn=lambda batch: batch)
        assert list(loader) == [[11], [11]]
    finally:
        WHO.reset(token)


def test_the_samplers_error_in_the_first_draw_reaches_next_as_it_is():
    loader = conveyor.DataLoader(list(range(4)), batch_sampler=FailsFirst())
    iterator = iter(loader)
    with pytest.raises(LookupError, match="the sampler's own error"):
        next(iterator)
    with pytest.raises(RuntimeError, match="cannot go on"):
        next(iterator)  # (and the pass says it cannot go on, rather than ending as if it were done)
    assert loader.state_dict()["position"] == 0
