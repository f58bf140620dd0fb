"""Resumable loader state: one owner, the ``ResumeTracker`` a loader holds.

::

    DataLoader.__iter__        ──▶ tracker.begin(plan, prepare) ──▶ Start(epoch, base seed, progress, resume, copies)
                                   (published in one step, its draw wired first: safe from a signal handler)
    iterator, each batch       ──▶ progress.delivered(index, copies)  (one call)
    DataLoader.state_dict()    ──▶ tracker.save(plan)  ──▶ LoaderState(...).to_dict()
                                   (inside an epoch: progress.to_state(settings))
                                   = {version, kind, settings, ..., checksum}
    DataLoader.load_state_dict ──▶ tracker.load(plan, state): LoaderState.from_dict checks
                                   everything, then the sampler/generator/dataset parts are
                                   loaded (undone if one refuses); a ResumePoint (inside an
                                   epoch) waits for the next begin(), whose progress is
                                   EpochProgress.from_state(its state)

Actors (the state's typed records in _records.py, the pass's in
_progress.py, loading into the parts in _apply.py):
  * ``ResumeTracker``: the epoch count, the latest iteration's progress, a
    loaded resume point, and the base seeds (drawn as torch draws them).
  * ``EpochProgress``: what one iteration has delivered, kept by the tracker
    and updated by that iteration's iterator. It outlives the iterator, so a
    loader reports where an abandoned iteration stopped, as torchdata does.
  * ``ResumePoint``: a checked state inside an epoch, waiting for ``iter()``.
  * ``LoaderState`` (_records.py): the state, one typed field per key;
    ``from_dict`` is the one place a state is decoded and checked
    (_encoding.py: the layout, its checksum and upgrades; _checks.py: the
    header, the settings with both sides, every field's type and range).

Why a resumed epoch is exact without re-reading: batch ``i`` of an epoch holds
the samples the sampler gives as its ``i``-th batch, and is loaded with
``random``/``numpy``/torch seeded from ``derive_seed(base_seed, i)``. The state
holds ``base_seed``, the sampler's state (which replays the epoch's draw and
jumps to any batch) and which batches were delivered; the resumed iterator
plans the others, with their seeds, for any number of workers. An iterable
dataset's copies (one per worker, or the one of ``num_workers=0``) continue
from where each stood (``copies``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Optional

from .._engine.loading.copies import Copies
from ..rng import derive_seed, draw_seed, source_for
from ..sampler.replay import replay_point
from ..sampler.resumable import _has_position
from ._apply import apply_parts, generator_state, undone_on_failure, warn_fast_forward
from ._encoding import upgrade
from ._progress import EpochProgress, ResumePoint, Start
from ._records import LoaderState, ReplayPoint
from ._settings import settings
from ._stateful import is_stateful

if TYPE_CHECKING:
    from ..loader._plan import Plan

# ---------------------------------------------------------------------------
# the tracker


class ResumeTracker:
    """Where a loader stands across its iterations; the one owner of its
    resumable state (see the module docstring)."""

    def __init__(self) -> None:
        #: The epoch the next iteration runs.
        self.epoch = 0
        self._resume: Optional[ResumePoint] = None
        self._progress: Optional[EpochProgress] = None
        #: The latest iteration's base seed (persistent workers derive the next from it).
        self._last_base_seed: Optional[int] = None
        #: The next iteration's base seed, drawn ahead by a state saved
        #: between epochs (see _pin_next_epoch) or loaded from one.
        self._next_base_seed: Optional[int] = None
        #: Loaded between epochs: where persistent workers' copies stood.
        self._next_copies: Optional[Copies] = None

    # -- iterations -----------------------------------------------------------

    def begin(self, plan: Plan, prepare: Optional[Callable[[Start], None]] = None) -> Start:
        """A new iteration: the epoch, its base seed (drawn before the
        sampler draws, as torch does), its progress record (taken before the
        sampler draws) and what it resumes.

        Safe from a signal handler's ``save()`` at any moment (the main
        thread runs handlers between any two bytecodes): nothing is changed
        until the pass is published, in one step, after ``prepare(start)``
        has wired what such a save needs (the epoch's draw ahead,
        ``progress.draw_first``); until then a save describes the loader as
        it was, and a base seed it pins meanwhile is the one this pass takes."""
        while True:
            start = self._start(plan)
            if prepare is not None:
                prepare(start)
            if start.resume is not None or self._next_base_seed in (None, start.base_seed):
                break  # (else a handler's save pinned this epoch's base seed meanwhile: start with it)
        # Published in one call: a handler runs before or after it, never amid it.
        vars(self).update(
            _resume=None,
            _next_copies=None,
            _next_base_seed=None,
            epoch=start.epoch + 1,
            _last_base_seed=start.base_seed,
            _progress=start.progress,
        )
        return start

    def _start(self, plan: Plan) -> Start:
        """How the next iteration starts, changing nothing (see :meth:`begin`)."""
        resume = self._resume
        if resume is None:
            epoch = self.epoch
            base_seed = self._take_base_seed(plan, epoch)
            progress = self._fresh_progress(plan, epoch, base_seed)
            carried = self._next_copies
            copies = None if carried is None else carried.next_epoch()
        else:
            progress = EpochProgress.from_state(resume.state)
            epoch, base_seed, copies = progress.epoch, progress.base_seed, progress.copies
        return Start(epoch, base_seed, progress, resume, copies)

    def _take_base_seed(self, plan: Plan, epoch: int) -> int:
        """This pass's base seed: the one a save pinned (between epochs, or
        from a signal handler while it was being drawn here), else drawn now."""
        pinned = self._next_base_seed
        if pinned is None:
            drawn = self._base_seed(plan, epoch)
            pinned = self._next_base_seed  # (a handler's save may have pinned one meanwhile: it wins)
            if pinned is None:
                return drawn
        return pinned

    @staticmethod
    def _fresh_progress(plan: Plan, epoch: int, base_seed: int) -> EpochProgress:
        sampler = plan.sampling.index_sampler
        if is_stateful(sampler):
            return EpochProgress(epoch, base_seed, sampler.state_dict(), generator_state(plan))
        replay = None if plan.iterable else ReplayPoint.of(replay_point(sampler, plan.sampling.flavor))
        return EpochProgress(epoch, base_seed, None, generator_state(plan), replay)

    def _base_seed(self, plan: Plan, epoch: int) -> int:
        """The root of epoch ``epoch``'s batch seeds. With ``seed=``, derived
        from it; else drawn from ``generator`` (or the global generator) as
        torch draws its base seed. Like torch, a loader with persistent
        workers draws only for its first iteration; later ones derive theirs
        from the one before, so the generator gives the sampler the same
        numbers as under torch."""
        if plan.sampling.seed is not None:
            return derive_seed(plan.sampling.seed, epoch)
        if plan.keeps_base_seed and self._last_base_seed is not None:
            return derive_seed(self._last_base_seed, epoch)
        if plan.sampling.generator is not None:
            return source_for(plan.sampling.generator, plan.sampling.flavor).draw_seed()
        return draw_seed(plan.sampling.flavor)

    def _pin_next_epoch(self, plan: Plan) -> int:
        """Draw now what the next iteration draws from a generator (its base
        seed, then the index sampler's seed), as torch orders them, and keep
        it for that iteration: a state saved between epochs then holds the
        next epoch's shuffle and batch seeds (resume mechanism 3, as
        :meth:`_draw_pending` says). Returns the base seed."""
        if self._next_base_seed is None:
            self._next_base_seed = self._base_seed(plan, self.epoch)
            pin = getattr(plan.sampling.index_sampler, "pin_next_draw", None)
            if callable(pin):
                pin()
        seed = self._next_base_seed
        assert seed is not None  # (pinned above)
        return seed

    def set_epoch(self, epoch: int, owner: str) -> bool:
        """Make the next iteration epoch ``epoch``. A loaded resume point of
        that epoch is kept; any other is dropped, with a warning; True when
        one was dropped."""
        loaded = self._resume.state if self._resume is not None else None
        dropped = loaded is not None and loaded.epoch != epoch
        if loaded is not None and dropped:
            warnings.warn(
                f"{owner}.set_epoch({epoch}) drops the resume point loaded by load_state_dict "
                f"(epoch {loaded.epoch}, {loaded.count} batches delivered); call set_epoch({loaded.epoch}) to "
                f"resume it",
                stacklevel=3,
            )
            self._resume = None
        self.epoch = int(epoch)
        return dropped

    def resumes_at(self) -> Optional[tuple[int, int]]:
        """(epoch, batches delivered) where the next iteration resumes a loaded
        state inside an epoch; None when it starts an epoch."""
        loaded = self._resume.state if self._resume is not None else None
        return (loaded.epoch, loaded.count) if loaded is not None else None

    # -- save -----------------------------------------------------------------

    def save(self, plan: Plan) -> dict[str, Any]:
        """Where the loader stands: its latest iteration, or the start of
        its next epoch (see :meth:`DataLoader.state_dict`)."""
        if self._resume is not None:
            return copy.deepcopy(dict(self._resume.given))
        progress = self._progress
        inside = progress if progress is not None and not progress.finished else None
        self._draw_pending(plan, inside)
        if inside is not None:
            return inside.to_state(settings(plan)).to_dict()
        return self._between_epochs(plan).to_dict()

    def _draw_pending(self, plan: Plan, progress: Optional[EpochProgress]) -> None:
        """Resume mechanism 3 (docs/architecture.md, "Resume mechanisms"):
        draw now what the pass the state names would draw later from a
        generator the state does not hold (the global one), so that the
        state holds the draw and a resumed run makes the same. Inside an
        epoch before its first batch is delivered (``progress``): the
        sampler's first batch (``loader/_first_draw.py``'s ``FirstDrawAhead``). Between
        epochs: the next epoch's base seed and sampler seed (:meth:`_pin_next_epoch`)."""
        if progress is None:
            self._pin_next_epoch(plan)
        elif progress.count == 0 and progress.draw_first is not None:
            progress.draw_first()

    def _between_epochs(self, plan: Plan) -> LoaderState:
        dataset = plan.loading.dataset
        in_this_process = plan.iterable and plan.running.num_workers == 0 and is_stateful(dataset)
        base_seed = self._pin_next_epoch(plan)  # (drawn by _draw_pending, before the sampler's state is taken)
        sampler = plan.sampling.index_sampler
        return LoaderState(
            settings=settings(plan),
            epoch=self.epoch,
            in_epoch=False,
            # The next epoch's base seed, drawn now (with the sampler's seed) so that it is the same after a resume.
            base_seed=base_seed,
            position=0,
            delivered_ahead=(),
            sampler=sampler.state_dict() if is_stateful(sampler) else None,
            generator_state=generator_state(plan),
            # num_workers=0: the one copy is the dataset itself, and carries its state on.
            dataset_state=dataset.state_dict() if in_this_process else None,
            copies=self._carried_copies(plan),
            replay=None,
            first_batch=None,
        )

    def _carried_copies(self, plan: Plan) -> Optional[Copies]:
        """Between epochs: with persistent workers, each worker's copy of an
        iterable dataset carries its state into the next epoch (an epoch
        counter, a shard list); where the copies stood at the latest epoch's
        end (or as loaded). None when the next epoch starts from fresh copies."""
        if not (plan.iterable and plan.keeps_base_seed):
            return None
        if self._next_copies is not None:
            return self._next_copies
        progress = self._progress
        return progress.copies if progress is not None and progress.finished else None

    # -- load -----------------------------------------------------------------

    def load(self, plan: Plan, state: Any) -> None:
        """Check ``state`` against the loader, then continue from it at the
        next ``iter()`` (see :meth:`DataLoader.load_state_dict`).

        Everything is checked before anything changes; what the state is
        then loaded into (sampler, generator, dataset) is put back as it was
        if one of them refuses it, so a failed load leaves the loader as it was."""
        if isinstance(state, Mapping) and len(state) == 0:
            return  # torchdata's StatefulDataLoader takes {} as "nothing to load"
        state = upgrade(state)  # (a state an earlier conveyor wrote in another layout)
        loaded = LoaderState.from_dict(state, plan)
        epoch, in_epoch, position, ahead = loaded.epoch, loaded.in_epoch, loaded.position, loaded.delivered_ahead
        jumps = _has_position(loaded.sampler)
        with undone_on_failure(plan, loaded.dataset_state is not None):
            apply_parts(plan, loaded, replays=in_epoch and not jumps)
            if ahead and getattr(plan.sampling.index_sampler, "loaded_from_another_size", False):
                raise ValueError(
                    "DataLoader.load_state_dict: the state was saved with in_order=False and names batches "
                    f"delivered ahead of position {position} ({sorted(ahead)}); on another number of ranks those "
                    "are other batches. Resume on the number of ranks that saved it, or save with in_order=True."
                )
        if in_epoch:
            warn_fast_forward(plan, epoch, loaded.copies)
        self.epoch = epoch
        self._progress = None
        self._last_base_seed = None
        self._next_base_seed = None if in_epoch else loaded.base_seed
        self._next_copies = None if in_epoch else loaded.copies
        self._resume = None
        if in_epoch:
            self._resume = ResumePoint(
                state=loaded, given=copy.deepcopy(dict(state)), sampler_skip=0 if (jumps or plan.iterable) else position
            )
