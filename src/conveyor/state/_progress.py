"""What one pass over the data keeps of where it stands, for the loader's
state: the progress record an iterator updates as batches are delivered
(``EpochProgress``), a loaded state waiting for the next ``iter()``
(``ResumePoint``, holding the decoded ``_records.LoaderState``), and
how a new pass starts (``Start``). The ``ResumeTracker`` (_tracker.py) owns them.

A pass's progress and a state saved inside its epoch are one shape, converted
by one pair: ``EpochProgress.to_state`` (a save) and ``EpochProgress.from_state``
(the pass a loaded state resumes).

An iterable dataset's copies are followed here as the engine reports them,
the typed ``Copies`` (``EpochProgress.copies``, updated at every delivered
batch, and ``Start.copies``, what the executor starts the pass from), the
record a saved state holds too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .._engine.loading.copies import Copies
from ..sampler.replay import batch_fingerprint
from ..sampler.resumable import _has_position
from ..skips import SkippedSample
from ._records import LoaderState, ReplayPoint
from ._stateful import is_stateful


@dataclass
class EpochProgress:
    """What one iteration has delivered, and what replays its draws.

    ``position`` is the lowest batch index not delivered yet; with
    ``in_order=False`` batches after it may have been delivered already, and
    ``delivered_ahead`` holds those (at most the batches in flight).
    """

    epoch: int
    base_seed: int
    #: The index sampler's state that replays this epoch's draw (taken when the
    #: first batch is drawn) or, for samplers that cannot jump, its state before
    #: the epoch; None for samplers without state.
    sampler_state: Any
    #: The loader's generator right after the base seed was drawn from it.
    generator_state: Any
    #: For an index sampler without state: what replays its draw (see
    #: sampler.replay_point), taken before the epoch's first draw.
    replay: Optional[ReplayPoint] = None
    #: Fingerprint of the epoch's first batch of indices, to check a replay by.
    first_batch: Optional[str] = None
    #: Draws the iteration's first batch of indices now, if it was not yet
    #: (set before the pass is published; see loader/_first_draw.py).
    draw_first: Optional[Callable[[], None]] = None
    position: int = 0
    delivered_ahead: set[int] = field(default_factory=set)
    finished: bool = False
    #: False once its iterator has finished, been closed or been collected.
    iterating: bool = True
    #: Iterable dataset: where each copy stood after its last delivered
    #: batch (one per worker, or the one in this process), as
    #: ``Delivered.copies`` reports it; at the end, as the epoch left them.
    copies: Optional[Copies] = None
    #: Samples skip_bad_samples left out this epoch.
    skipped: list[SkippedSample] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Batches delivered so far in this epoch."""
        return self.position + len(self.delivered_ahead)

    @classmethod
    def from_state(cls, state: LoaderState) -> "EpochProgress":
        """The pass a state saved inside an epoch resumes, standing where the
        state stood (the inverse of :meth:`to_state`)."""
        assert state.in_epoch and state.base_seed is not None  # (checked: inside an epoch a state has one)
        return cls(
            epoch=state.epoch,
            base_seed=state.base_seed,
            sampler_state=state.sampler,
            generator_state=state.generator_state,
            replay=state.replay,
            first_batch=state.first_batch,
            position=state.position,
            delivered_ahead=set(state.delivered_ahead),
            copies=state.copies,
            skipped=list(state.skipped or ()),
        )

    def to_state(self, settings: Mapping[str, Any]) -> LoaderState:
        """This pass as a state saved inside its epoch; ``settings``: the
        loader's (``_settings.settings``). An iterable dataset's own state is in
        its copies, so ``dataset_state`` is None."""
        return LoaderState(
            settings=settings,
            skipped=tuple(self.skipped) or None,
            epoch=self.epoch,
            in_epoch=True,
            base_seed=self.base_seed,
            position=self.position,
            delivered_ahead=tuple(sorted(self.delivered_ahead)),
            sampler=positioned(self.sampler_state, self.position),
            generator_state=self.generator_state,
            dataset_state=None,
            copies=self.copies,
            replay=self.replay,
            first_batch=self.first_batch,
        )

    def __getstate__(self) -> dict:
        # A pickled loader (spawn workers get one) keeps the record, not the live iteration.
        return {**self.__dict__, "draw_first": None}

    def delivered(self, index: int, copies: Optional[Copies] = None) -> None:
        """Batch ``index`` reached the user (or raised there); ``copies``:
        where an iterable dataset's copies stand as of it. Again for the
        same batch, nothing changes.

        Safe from a signal handler's save: the record changes in one call
        (a handler runs before or after it), so a state never holds a
        position and copies of two different batches."""
        position, ahead = self.position, self.delivered_ahead
        if index == position:
            position += 1
            if ahead:
                ahead = set(ahead)
                while position in ahead:
                    ahead.discard(position)
                    position += 1
        elif index > position:
            ahead = ahead | {index}
        changes: dict[str, Any] = {"position": position, "delivered_ahead": ahead}
        if copies is not None:
            changes["copies"] = copies
        vars(self).update(changes)

    def finish(self, copies: Optional[Copies]) -> None:
        """The pass ended; ``copies``: where an iterable dataset's copies stand at its end (None: as they were)."""
        vars(self).update({"finished": True} if copies is None else {"finished": True, "copies": copies})

    def note_first_draw(self, index_sampler: Any, batch: Any, *, first: bool) -> None:
        """The first batch of indices drawn by this iteration (``first``:
        and the epoch's first batch): keep its fingerprint, and the state that
        replays this epoch's draw if the sampler can jump to a batch."""
        if first and self.first_batch is None:
            self.first_batch = batch_fingerprint(batch)
        if is_stateful(index_sampler):
            state = index_sampler.state_dict()
            if _has_position(state):
                self.sampler_state = state


def positioned(sampler_state: Any, position: int) -> Any:
    """``sampler_state`` moved to batch ``position`` of its iteration."""
    if _has_position(sampler_state) and sampler_state["in_iteration"]:
        return {**sampler_state, "position": position}
    return sampler_state


@dataclass(frozen=True)
class ResumePoint:
    """Where the next ``iter(loader)`` starts inside an epoch: a checked
    ``state``, whose pass is ``EpochProgress.from_state(state)``.

    The pass it resumes is ``Start.progress`` (where the plan starts, what
    it leaves out, the epoch's first batch: the state's own fields); a
    sampler that cannot jump draws and drops ``sampler_skip`` batches first.
    """

    state: LoaderState
    #: The state as load_state_dict was given it (a deep copy), which the
    #: loader saves until ``iter()``: key for key what it loaded. (``state.to_dict()``
    #: gives the same for every state conveyor writes; one it accepts without
    #: writing it so, a skipped sample without its traceback, would come back filled in.)
    given: Mapping[str, Any]
    sampler_skip: int


@dataclass(frozen=True)
class Start:
    """How a new iteration starts: its epoch and base seed, the progress
    record it updates, the resume point it continues (if any), and where an
    iterable dataset's copies begin (None: fresh), as the executor takes them."""

    epoch: int
    base_seed: int
    progress: EpochProgress
    resume: Optional[ResumePoint]
    copies: Optional[Copies]
