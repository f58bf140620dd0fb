"""Resumable loader state: one owner, the ``ResumeTracker`` a loader holds.

::

    DataLoader.__iter__        ──▶ tracker.begin(view) ──▶ Start(epoch, base seed, progress, resume, copies)
    iterator, each batch       ──▶ progress.delivered(index), progress.copies = delivered.copies
    DataLoader.state_dict()    ──▶ tracker.save(view)  ──▶ {version, kind, settings, ..., checksum}
    DataLoader.load_state_dict ──▶ tracker.load(view, state): check everything, load the
                                   sampler/generator/dataset parts (undone if one refuses),
                                   keep a ResumePoint (inside an epoch) for the next begin()

Actors:
  * ``ResumeTracker``: the epoch count, the latest iteration's progress, a
    loaded resume point, and the base seeds (drawn as torch draws them).
  * ``EpochProgress``: what one iteration has delivered, kept by the tracker
    and updated by that iteration's iterator. It outlives the iterator, so a
    loader reports where an abandoned iteration stopped, as torchdata does.
  * ``ResumePoint``: a checked state inside an epoch, waiting for ``iter()``.
  * ``state_format``: the encoding, and the checks of header and settings
    (both-sides errors); ``state_checks``: every other field's type and range.

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

import contextlib
import copy
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, runtime_checkable

import numpy as np

from . import rng
from .sampler import _has_position, batch_fingerprint, replay_point, restore_replay_point
from .state_checks import (
    check_dataset_state,
    check_generator,
    check_replay,
    check_sampler,
    read_copies,
    read_position,
    read_skipped,
)
from .state_format import LOADER_FIX, STATE_VERSION, LoaderView, check_header, check_settings, mismatch_error, seal

__all__ = ["Stateful", "STATE_VERSION", "ResumeTracker", "LoaderView"]


@runtime_checkable
class Stateful(Protocol):
    """Anything with ``state_dict()`` and ``load_state_dict(state)``: samplers,
    datasets, their iterators, the DataLoader itself (torchdata's protocol).

    Example::

        >>> from conveyor import DataLoader, Stateful
        >>> isinstance(DataLoader(list(range(4))), Stateful)
        True
    """

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


# ---------------------------------------------------------------------------
# one iteration


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
    replay: Any = None
    #: Fingerprint of the epoch's first batch of indices, to check a replay by.
    first_batch: Optional[str] = None
    #: Draws the iteration's first batch of indices now, if it was not yet
    #: (set by the iterator; see loader._FirstDrawAhead).
    draw_first: Optional[Callable[[], None]] = None
    position: int = 0
    delivered_ahead: set = field(default_factory=set)
    finished: bool = False
    #: False once its iterator has finished, been closed or been collected.
    iterating: bool = True
    #: Iterable dataset: where each copy stood after its last delivered
    #: batch (one per worker, or the one in this process), as
    #: ``Delivered.copies`` reports it; at the end, as the epoch left them.
    copies: Any = None
    #: Samples skip_bad_samples left out this epoch (skips.SkippedSample).
    skipped: list = field(default_factory=list)

    @property
    def count(self) -> int:
        """Batches delivered so far in this epoch."""
        return self.position + len(self.delivered_ahead)

    def __getstate__(self) -> dict:
        # A pickled loader (spawn workers get one) keeps the record, not the live iteration.
        return {**self.__dict__, "draw_first": None}

    def delivered(self, index: int) -> None:
        """Batch ``index`` reached the user (or raised there)."""
        if index == self.position:
            self.position += 1
            ahead = self.delivered_ahead
            while ahead and self.position in ahead:
                ahead.discard(self.position)
                self.position += 1
        elif index > self.position:
            self.delivered_ahead.add(index)

    def note_first_draw(self, index_sampler: Any, batch: Any, *, first: bool) -> None:
        """The first batch of indices drawn by this iteration (``first``:
        and the epoch's first batch): keep its fingerprint, and the state that
        replays this epoch's draw if the sampler can jump to a batch."""
        if first and self.first_batch is None:
            self.first_batch = batch_fingerprint(batch)
        if _is_stateful(index_sampler):
            state = index_sampler.state_dict()
            if _has_position(state):
                self.sampler_state = state


@dataclass(frozen=True)
class ResumePoint:
    """Where the next ``iter(loader)`` starts inside an epoch.

    The plan starts at batch ``position`` and leaves out
    ``delivered_ahead``; a sampler that cannot jump draws and drops
    ``sampler_skip`` batches first. An iterable dataset's copies continue
    from ``copies``.
    """

    state: Mapping[str, Any]
    epoch: int
    base_seed: int
    position: int
    delivered_ahead: frozenset
    sampler_state: Any
    generator_state: Any
    sampler_skip: int
    copies: Any = None
    replay: Any = None
    first_batch: Optional[str] = None
    #: Samples skip_bad_samples left out so far this epoch (skips.SkippedSample).
    skipped: tuple = ()

    @property
    def count(self) -> int:
        return self.position + len(self.delivered_ahead)


@dataclass(frozen=True)
class Start:
    """How a new iteration starts: its epoch and base seed, the progress
    record it updates, the resume point it continues (if any), and where an
    iterable dataset's copies begin (None: fresh)."""

    epoch: int
    base_seed: int
    progress: EpochProgress
    resume: Optional[ResumePoint]
    copies: Any


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
        self._next_copies: Any = None

    # -- iterations -----------------------------------------------------------

    def begin(self, view: LoaderView) -> Start:
        """A new iteration: the epoch, its base seed (drawn before the
        sampler draws, as torch does), its progress record (taken before the
        sampler draws) and what it resumes."""
        resume, self._resume = self._resume, None
        if resume is None:
            epoch = self.epoch
            base_seed = self._base_seed(view, epoch)
            progress = self._fresh_progress(view, epoch, base_seed)
            copies = _next_epoch_start(self._next_copies)
        else:
            epoch, base_seed = resume.epoch, resume.base_seed
            progress = EpochProgress(
                epoch, base_seed, resume.sampler_state, resume.generator_state, resume.replay, resume.first_batch
            )
            progress.position, progress.delivered_ahead = resume.position, set(resume.delivered_ahead)
            progress.skipped = list(resume.skipped)
            copies = resume.copies
        self._next_copies = None
        self.epoch = epoch + 1
        self._last_base_seed = base_seed
        self._progress = progress
        return Start(epoch, base_seed, progress, resume, copies)

    @staticmethod
    def _fresh_progress(view: LoaderView, epoch: int, base_seed: int) -> EpochProgress:
        sampler = view.index_sampler
        if _is_stateful(sampler):
            return EpochProgress(epoch, base_seed, sampler.state_dict(), _generator_state(view))
        replay = None if view.iterable else replay_point(sampler, view.flavor)
        return EpochProgress(epoch, base_seed, None, _generator_state(view), replay)

    def _base_seed(self, view: LoaderView, epoch: int) -> int:
        """The root of epoch ``epoch``'s batch seeds. With ``seed=``, derived
        from it; else drawn from ``generator`` (or the global generator) as
        torch draws its base seed. Like torch, a loader with persistent
        workers draws only for its first iteration; later ones derive theirs
        from the one before, so the generator gives the sampler the same
        numbers as under torch."""
        if view.seed is not None:
            return rng.derive_seed(view.seed, epoch)
        if self._next_base_seed is not None:
            seed, self._next_base_seed = self._next_base_seed, None
            return seed
        if view.keeps_base_seed and self._last_base_seed is not None:
            return rng.derive_seed(self._last_base_seed, epoch)
        if view.generator is not None:
            return rng.source_for(view.generator, view.flavor).draw_seed()
        return rng.draw_seed(view.flavor)

    def _pin_next_epoch(self, view: LoaderView) -> int:
        """Draw now what the next iteration draws from a generator (its base
        seed, then the index sampler's seed), as torch orders them, and keep
        it for that iteration: a state saved between epochs then holds the
        next epoch's shuffle and batch seeds. Returns the base seed."""
        if self._next_base_seed is None:
            self._next_base_seed = self._base_seed(view, self.epoch)
            pin = getattr(view.index_sampler, "pin_next_draw", None)
            if callable(pin):
                pin()
        return self._next_base_seed

    def set_epoch(self, epoch: int, owner: str) -> bool:
        """Make the next iteration epoch ``epoch``. A loaded resume point of
        that epoch is kept; any other is dropped, with a warning; True when
        one was dropped."""
        resume = self._resume
        dropped = resume is not None and resume.epoch != epoch
        if dropped:
            warnings.warn(
                f"{owner}.set_epoch({epoch}) drops the resume point loaded by load_state_dict "
                f"(epoch {resume.epoch}, {resume.count} batches delivered); call set_epoch({resume.epoch}) to "
                f"resume it",
                stacklevel=3,
            )
            self._resume = None
        self.epoch = int(epoch)
        return dropped

    # -- save -----------------------------------------------------------------

    def save(self, view: LoaderView) -> dict[str, Any]:
        """Where the loader stands: its latest iteration, or the start of
        its next epoch (see :meth:`DataLoader.state_dict`)."""
        if self._resume is not None:
            return copy.deepcopy(dict(self._resume.state))
        progress = self._progress
        if progress is not None and not progress.finished:
            if progress.count == 0 and progress.draw_first is not None:
                progress.draw_first()  # the epoch's draw must be in the state
            return seal(view, self._inside_epoch(progress))
        return seal(view, self._between_epochs(view))

    @staticmethod
    def _inside_epoch(progress: EpochProgress) -> dict[str, Any]:
        skipped = {"skipped": [record.to_dict() for record in progress.skipped]} if progress.skipped else {}
        return {
            **skipped,
            "epoch": progress.epoch,
            "in_epoch": True,
            "base_seed": progress.base_seed,
            "position": progress.position,
            "delivered_ahead": sorted(progress.delivered_ahead),
            "sampler": _positioned(progress.sampler_state, progress.position),
            "generator_state": progress.generator_state,
            "dataset_state": None,
            "copies": progress.copies,
            "replay": progress.replay,
            "first_batch": progress.first_batch,
        }

    def _between_epochs(self, view: LoaderView) -> dict[str, Any]:
        dataset = view.dataset
        in_this_process = view.iterable and view.num_workers == 0 and _is_stateful(dataset)
        base_seed = self._pin_next_epoch(view)  # (before the sampler's state: it may pin a draw too)
        sampler = view.index_sampler
        return {
            "epoch": self.epoch,
            "in_epoch": False,
            # The next epoch's base seed, drawn now (with the sampler's seed) so that it is the same after a resume.
            "base_seed": base_seed,
            "position": 0,
            "delivered_ahead": [],
            "sampler": sampler.state_dict() if _is_stateful(sampler) else None,
            "generator_state": _generator_state(view),
            # num_workers=0: the one copy is the dataset itself, and carries its state on.
            "dataset_state": dataset.state_dict() if in_this_process else None,
            "copies": self._carried_copies(view),
            "replay": None,
            "first_batch": None,
        }

    def _carried_copies(self, view: LoaderView) -> Any:
        """Between epochs: with persistent workers, each worker's copy of an
        iterable dataset carries its state into the next epoch (an epoch
        counter, a shard list); where the copies stood at the latest epoch's
        end (or as loaded). None when the next epoch starts from fresh copies."""
        if not (view.iterable and view.keeps_base_seed):
            return None
        if self._next_copies is not None:
            return self._next_copies
        progress = self._progress
        return progress.copies if progress is not None and progress.finished else None

    # -- load -----------------------------------------------------------------

    def load(self, view: LoaderView, state: Any) -> None:
        """Check ``state`` against the loader, then continue from it at the
        next ``iter()`` (see :meth:`DataLoader.load_state_dict`).

        Everything is checked before anything changes; what the state is
        then loaded into (sampler, generator, dataset) is put back as it was
        if one of them refuses it, so a failed load leaves the loader as it was."""
        if isinstance(state, Mapping) and len(state) == 0:
            return  # torchdata's StatefulDataLoader takes {} as "nothing to load"
        check_header(state)
        check_settings(view, state["settings"])
        epoch, in_epoch, base_seed, position, ahead = read_position(state)
        if in_epoch and view.seed is not None and base_seed != rng.derive_seed(view.seed, epoch):
            raise mismatch_error(
                "DataLoader", "the base seed does not follow from seed= and the epoch.",
                {"base_seed": base_seed}, {"seed": view.seed}, LOADER_FIX,
            )
        check_sampler(view.index_sampler, state["sampler"], position, in_epoch, view.iterable)
        check_replay(view.index_sampler, state, view.flavor)
        check_generator(_generator_source(view), state["generator_state"])
        loads_dataset = view.iterable and view.num_workers == 0 and not in_epoch
        check_dataset_state(view.dataset, state["dataset_state"], "dataset_state", loads_dataset)
        copies = read_copies(view, state["copies"], position + len(ahead) if in_epoch else None)
        skipped = read_skipped(state.get("skipped", []))
        jumps = _has_position(state["sampler"])
        with _undone_on_failure(view, state["dataset_state"] is not None):
            _apply(view, state, replays=in_epoch and not jumps)
            if ahead and getattr(view.index_sampler, "loaded_from_another_size", False):
                raise ValueError(
                    "DataLoader.load_state_dict: the state was saved with in_order=False and names batches "
                    f"delivered ahead of position {position} ({sorted(ahead)}); on another number of ranks those "
                    "are other batches. Resume on the number of ranks that saved it, or save with in_order=True."
                )
        if in_epoch:
            _warn_fast_forward(view, epoch, copies)
        self.epoch = epoch
        self._progress = None
        self._last_base_seed = None
        self._next_base_seed = None if in_epoch else base_seed
        self._next_copies = None if in_epoch else copies
        self._resume = None
        if in_epoch:
            self._resume = ResumePoint(
                state=copy.deepcopy(dict(state)),
                epoch=epoch,
                base_seed=base_seed,
                position=position,
                delivered_ahead=ahead,
                sampler_state=state["sampler"],
                generator_state=state["generator_state"],
                sampler_skip=0 if (jumps or view.iterable) else position,
                copies=copies,
                replay=state["replay"],
                first_batch=state["first_batch"],
                skipped=skipped,
            )


# ---------------------------------------------------------------------------
# helpers


def _positioned(sampler_state: Any, position: int) -> Any:
    """``sampler_state`` moved to batch ``position`` of its iteration."""
    if _has_position(sampler_state) and sampler_state["in_iteration"]:
        return {**sampler_state, "position": position}
    return sampler_state


def _generator_source(view: LoaderView) -> Any:
    generator = view.generator
    if isinstance(generator, np.random.Generator) or rng.is_torch_generator(generator):
        return rng.source_for(generator, view.flavor)
    return None  # None, or an int seed: nothing that moves


def _generator_state(view: LoaderView) -> Any:
    source = _generator_source(view)
    return None if source is None else source.get_state()


def _restore_generator(view: LoaderView, generator_state: Any) -> None:
    source = _generator_source(view)
    if source is not None and generator_state is not None:
        source.set_state(generator_state)


def _next_epoch_start(copies: Any) -> Any:
    """Copies saved between epochs, as the start of the next epoch: each
    copy's dataset state, a new iteration, every worker active."""
    if copies is None:
        return None
    states = [
        None if st is None else {"dataset_state": st.get("dataset_state"), "iterator_state": None,
                                 "iterator_ended": False, "served": 0}
        for st in copies["states"]
    ]
    return {"states": states, "retired": [], "next": 0}


def _warn_fast_forward(view: LoaderView, epoch: int, copies: Any) -> None:
    """Say so when copies without state will read their items again."""
    if copies is None:
        return
    batches = sum(
        int(st.get("served", 0))
        for st in copies["states"]
        if st is not None and st.get("dataset_state") is None and st.get("iterator_state") is None
        and not st.get("iterator_ended")
    )
    if batches:
        warnings.warn(
            f"{type(view.dataset).__name__} (and its iterator) has no state_dict/load_state_dict: to resume "
            f"epoch {epoch}, the next iteration reads again, without collating or sending them, the items of "
            f"the {batches} batches already served. Give the dataset or its iterator "
            f"state_dict/load_state_dict to resume without re-reading.",
            stacklevel=5,
        )


def _apply(view: LoaderView, state: Mapping[str, Any], replays: bool) -> None:
    """Load the state's parts into the sampler, the generator and the
    dataset. An iterable dataset's index sampler repeats one placeholder
    batch: where it stood changes nothing, so nothing is loaded into it
    (its saved position is kept for the next save; see ResumePoint)."""
    sampler = view.index_sampler
    if not view.iterable:
        if state["sampler"] is not None and _is_stateful(sampler):
            sampler.load_state_dict(state["sampler"])
        if replays:
            restore_replay_point(sampler, state["replay"], view.flavor)
    _restore_generator(view, state["generator_state"])
    if state["dataset_state"] is not None and _is_stateful(view.dataset):
        try:
            view.dataset.load_state_dict(state["dataset_state"])
        except Exception as exc:
            exc.add_note(
                f"(conveyor: raised by {type(view.dataset).__name__}.load_state_dict, loading the state's "
                f"'dataset_state' given to DataLoader.load_state_dict; the loader is left as it was)"
            )
            raise


@contextlib.contextmanager
def _undone_on_failure(view: LoaderView, loads_dataset: bool) -> Iterator[None]:
    """Put the sampler, the generator and (when ``loads_dataset``) the
    dataset back as they were if the block raises (a sampler or dataset
    refusing its part of the state)."""
    sampler, dataset = view.index_sampler, view.dataset
    sampler_before = replay_point(sampler, view.flavor)
    generator_before = _generator_state(view)
    dataset_before = dataset.state_dict() if loads_dataset and _is_stateful(dataset) else None
    try:
        yield
    except BaseException:
        restore_replay_point(sampler, sampler_before, view.flavor)
        _restore_generator(view, generator_before)
        if dataset_before is not None:
            dataset.load_state_dict(dataset_before)
        raise
