"""Resumable loader state: one encoding, a version, named keys, a checksum.

::

    DataLoader.state_dict()  ──▶ save(loader) ──▶ {version, kind, settings, epoch, position, ..., checksum}
    DataLoader.load_state_dict(state) ──▶ load(loader, state): check, then
         sampler.load_state_dict, generator and dataset states, loader epoch,
         and (inside an epoch) a ResumePoint that the next iter(loader) takes

Actors:
  * ``EpochProgress``: kept by the loader for its latest iterator, updated by
    that iterator at each batch (which batch indices were delivered), read by
    ``save``. It outlives the iterator, so a loader reports where an abandoned
    iteration stopped, as torchdata's StatefulDataLoader does.
  * ``ResumePoint``: a checked state inside an epoch, waiting for ``iter()``.

Why a resumed epoch is exact without re-reading: batch ``i`` of an epoch holds
the samples the sampler gives as its ``i``-th batch, and is loaded with
``random``/``numpy``/torch seeded from ``derive_seed(base_seed, i)``. The state
holds ``base_seed``, the sampler's state (which replays the epoch's draw and
jumps to any batch without drawing the ones before one by one) and which
batches were delivered; the resumed iterator plans the others, with their
seeds, for any number of workers.

The state is plain JSON values when the sampler's and dataset's states are.
``checksum`` is the CRC-32 of the canonical JSON of everything else, so a
truncated or hand-edited state is refused instead of yielding other data.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Protocol, runtime_checkable

import numpy as np

from . import rng
from .sampler import _has_position, batch_fingerprint, replay_point, restore_replay_point

__all__ = ["Stateful", "STATE_VERSION"]

#: Version of the loader state layout; a state of another version is refused.
#: 2: iterable datasets without state resume per copy (workers' states always
#: saved), no longer by loading delivered batches again.
STATE_VERSION = 2
_KIND = "DataLoader"
_FIX = (
    "Fix: build the DataLoader with the same dataset and arguments as the run that saved the state "
    "(num_workers may differ for map-style datasets), or start without load_state_dict."
)
#: Keys of a loader state besides the header; all must be present.
_KEYS = (
    "settings",
    "epoch",
    "in_epoch",
    "base_seed",
    "position",
    "delivered_ahead",
    "sampler",
    "generator_state",
    "dataset_state",
    "iterator_state",
    "iterator_ended",
    "iterator_served",
    "worker_progress",
)
#: Keys of torchdata's StatefulDataLoader states, to name them in the error.
_TORCHDATA_KEYS = ("_snapshot", "_num_yielded", "_sampler_iter_yielded", "_index_sampler_state")


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
# progress of one iteration


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
    #: The in-process fetcher of an iterable dataset, whose iterator state is saved.
    fetcher: Any = None
    #: Iterable dataset in workers: each worker's copy after its last
    #: delivered batch, the workers that ran out, whose turn is next.
    worker_progress: Any = None

    @property
    def count(self) -> int:
        """Batches delivered so far in this epoch."""
        return self.position + len(self.delivered_ahead)

    def __getstate__(self) -> dict:
        # A pickled loader (spawn workers get one) keeps the record, not the live iteration.
        return {**self.__dict__, "draw_first": None, "fetcher": None}

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


def begin_progress(loader: Any, epoch: int, base_seed: int, resume: Optional["ResumePoint"]) -> EpochProgress:
    """The progress record of a new iteration, taken before the sampler draws."""
    if resume is not None:
        progress = EpochProgress(
            epoch, base_seed, resume.sampler_state, resume.generator_state, resume.replay, resume.first_batch
        )
        progress.position, progress.delivered_ahead = resume.position, set(resume.delivered_ahead)
        return progress
    sampler = loader._index_sampler
    if _is_stateful(sampler):
        return EpochProgress(epoch, base_seed, sampler.state_dict(), _generator_state(loader))
    replay = None if loader._iterable else replay_point(sampler, loader._flavor)
    return EpochProgress(epoch, base_seed, None, _generator_state(loader), replay)


# ---------------------------------------------------------------------------
# a checked state, waiting for iter()


@dataclass(frozen=True)
class ResumePoint:
    """Where the next ``iter(loader)`` starts inside an epoch.

    The plan starts at batch ``position`` and leaves out
    ``delivered_ahead``; a sampler that cannot jump draws and drops
    ``sampler_skip`` batches first. An iterable dataset's copies (one per
    worker, or the one in this process) continue from ``worker_progress``.
    """

    state: Mapping[str, Any]
    epoch: int
    base_seed: int
    position: int
    delivered_ahead: frozenset
    sampler_state: Any
    generator_state: Any
    sampler_skip: int
    #: Iterable dataset: where each copy stood (one per worker, or the one
    #: of num_workers=0), as ``IterableProgress`` snapshots; or None.
    worker_progress: Any = None
    #: See EpochProgress.replay and first_batch.
    replay: Any = None
    first_batch: Optional[str] = None

    @property
    def count(self) -> int:
        return self.position + len(self.delivered_ahead)



# ---------------------------------------------------------------------------
# save


def settings(loader: Any) -> dict[str, Any]:
    """What must be the same in the loader that loads a state."""
    sampler = loader._index_sampler
    kind = type(sampler).__name__
    inner = getattr(sampler, "sampler", None)
    if inner is not None and loader.batch_sampler is sampler:
        kind = f"{kind}({type(inner).__name__})"
    return {
        "dataset": "iterable" if loader._iterable else "map",
        "dataset_length": None if loader._iterable else len(loader.dataset),
        "batch_size": loader.batch_size,
        "drop_last": loader.drop_last,
        "sampler": kind,
        "seed": loader.seed,
        "generator": _generator_kind(loader),
        "flavor": loader._flavor,
        # Map-style batches do not depend on the workers; an iterable dataset's do.
        "num_workers": loader.num_workers if loader._iterable else "any",
    }


def _generator_kind(loader: Any) -> str:
    if loader.seed is not None:
        return "seed"
    if loader.generator is None:
        return "global"
    return "torch" if rng.is_torch_generator(loader.generator) else type(loader.generator).__name__


def _generator_source(loader: Any) -> Any:
    generator = loader.generator
    if isinstance(generator, np.random.Generator) or rng.is_torch_generator(generator):
        return rng.source_for(generator, loader._flavor)
    return None  # None, or an int seed: nothing that moves


def _generator_state(loader: Any) -> Any:
    source = _generator_source(loader)
    return None if source is None else source.get_state()


def _positioned(sampler_state: Any, position: int) -> Any:
    """``sampler_state`` moved to batch ``position`` of its iteration."""
    if _has_position(sampler_state) and sampler_state["in_iteration"]:
        return {**sampler_state, "position": position}
    return sampler_state


def _iterable_states(loader: Any, fetcher: Any) -> dict[str, Any]:
    """Where an iterable dataset stands in this process: dataset state,
    iterator state, whether the iterator ended, batches served this epoch."""
    if not loader._iterable or loader.num_workers > 0:
        # Not iterated here (with workers, the states live there: worker_progress).
        return {"dataset_state": None, "iterator_state": None, "iterator_ended": False, "served": 0}
    if fetcher is None:
        dataset = loader.dataset
        return {
            "dataset_state": dataset.state_dict() if _is_stateful(dataset) else None,
            "iterator_state": None,
            "iterator_ended": False,
            "served": 0,
        }
    return fetcher.state()


def save(loader: Any) -> dict[str, Any]:
    """The state of ``loader``: where its latest iteration stands, or the
    start of its next epoch (see :meth:`DataLoader.state_dict`)."""
    resume = loader._resume
    if resume is not None:
        return copy.deepcopy(dict(resume.state))
    progress = loader._progress
    if progress is not None and not progress.finished:
        if progress.count == 0 and progress.draw_first is not None:
            progress.draw_first()  # the epoch's draw must be in the state
        body = _inside_epoch(loader, progress)
    else:
        body = _between_epochs(loader)
    return _seal({"version": STATE_VERSION, "kind": _KIND, "settings": settings(loader), **body})


def _inside_epoch(loader: Any, progress: EpochProgress) -> dict[str, Any]:
    here = _iterable_states(loader, progress.fetcher)
    return {
        "epoch": progress.epoch,
        "in_epoch": True,
        "base_seed": progress.base_seed,
        "position": progress.position,
        "delivered_ahead": sorted(progress.delivered_ahead),
        "sampler": _positioned(progress.sampler_state, progress.position),
        "generator_state": progress.generator_state,
        "dataset_state": here["dataset_state"],
        "iterator_state": here["iterator_state"],
        "iterator_ended": here["iterator_ended"],
        "iterator_served": here["served"],
        "worker_progress": progress.worker_progress,
        "replay": progress.replay,
        "first_batch": progress.first_batch,
    }


def _carried_worker_progress(loader: Any) -> Any:
    """Between epochs: with persistent workers, each worker's copy of an
    iterable dataset carries its state into the next epoch (an epoch
    counter, a shard list); where the copies stood at the latest epoch's end
    (or as loaded). None when the next epoch starts from fresh copies."""
    if not (loader._iterable and loader.num_workers > 0 and loader.persistent_workers):
        return None
    if loader._next_worker_progress is not None:
        return loader._next_worker_progress
    progress = loader._progress
    return progress.worker_progress if progress is not None and progress.finished else None


def next_epoch_start(worker_progress: Any) -> Any:
    """A worker progress saved between epochs, as the start of the next
    epoch: each copy's dataset state, a new iteration, every worker active."""
    if worker_progress is None:
        return None
    states = [
        None if st is None else {"dataset_state": st.get("dataset_state"), "iterator_state": None,
                                 "iterator_ended": False, "served": 0}
        for st in worker_progress["states"]
    ]
    return {"states": states, "retired": [], "next": 0}


def _between_epochs(loader: Any) -> dict[str, Any]:
    sampler = loader._index_sampler
    dataset_state = _iterable_states(loader, None)["dataset_state"]
    base_seed = loader._pin_next_epoch()  # (before the sampler's state: it may pin a draw too)
    return {
        "epoch": loader._epoch,
        "in_epoch": False,
        # The next epoch's base seed, drawn now (with the sampler's seed) so that it is the same after a resume.
        "base_seed": base_seed,
        "position": 0,
        "delivered_ahead": [],
        "sampler": sampler.state_dict() if _is_stateful(sampler) else None,
        "generator_state": _generator_state(loader),
        "dataset_state": dataset_state,
        "iterator_state": None,
        "iterator_ended": False,
        "iterator_served": 0,
        "worker_progress": _carried_worker_progress(loader),
        "replay": None,
        "first_batch": None,
    }


def _plain(value: Any) -> Any:
    """JSON stand-in for a leaf json cannot write (arrays, tensors, bytes)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return repr(value)


def _checksum(state: Mapping[str, Any]) -> str:
    body = {key: value for key, value in state.items() if key != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_plain)
    return f"{zlib.crc32(canonical.encode('utf-8')):08x}"


def _seal(state: dict[str, Any]) -> dict[str, Any]:
    state["checksum"] = _checksum(state)
    return state


# ---------------------------------------------------------------------------
# load


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def _mismatch(what: str, saved: Mapping[str, Any], mine: Mapping[str, Any], fix: str = _FIX) -> ValueError:
    return ValueError(
        f"DataLoader.load_state_dict: {what}\n"
        f"  saved state: {_describe(saved)}\n"
        f"  this loader: {_describe(mine)}\n"
        f"{fix}"
    )


def _check_header(state: Any) -> None:
    if not isinstance(state, Mapping):
        raise TypeError(
            f"DataLoader.load_state_dict expects the dict returned by DataLoader.state_dict(), "
            f"got {type(state).__name__}"
        )
    if state.get("kind") != _KIND and any(key in state for key in _TORCHDATA_KEYS):
        raise ValueError(
            "DataLoader.load_state_dict: this state was saved by torchdata's StatefulDataLoader, whose "
            "layout conveyor does not read. Resume that run with torchdata, or start the conveyor run "
            "from the start of an epoch (set_epoch) and save conveyor states from then on."
        )
    header = {"version": STATE_VERSION, "kind": _KIND}
    saved = {key: state.get(key, "<missing>") for key in header}
    if saved != header:
        raise _mismatch(
            "the state is not a DataLoader state of this version.",
            saved,
            header,
            "Fix: pass the dict returned by DataLoader.state_dict() of this conveyor version (or of a "
            "version that reads it), or start without load_state_dict.",
        )
    missing = [key for key in (*_KEYS, "checksum") if key not in state]
    if missing:
        raise ValueError(
            f"DataLoader.load_state_dict: the state lacks {missing} (truncated or edited?); pass the "
            f"whole dict returned by DataLoader.state_dict()"
        )
    expected = _checksum(state)
    if state["checksum"] != expected:
        raise ValueError(
            f"DataLoader.load_state_dict: the state was changed after it was saved (checksum "
            f"{state['checksum']!r} does not match its contents, which give {expected!r}). A changed state "
            f"could yield other batches than the saved run; pass the dict exactly as state_dict() returned "
            f"it (JSON, pickle and torch.save keep it intact)."
        )


def _check_settings(loader: Any, saved: Any) -> None:
    mine = settings(loader)
    if not isinstance(saved, Mapping):
        raise ValueError(f"DataLoader.load_state_dict: the state's settings are not a dict: {saved!r}")
    differing = [key for key in mine if saved.get(key, "<missing>") != mine[key]]
    if differing:
        raise _mismatch(
            "the state was saved by a loader with other settings.",
            {key: saved.get(key, "<missing>") for key in differing},
            {key: mine[key] for key in differing},
        )


def _read_progress(state: Mapping[str, Any]) -> tuple[int, bool, Any, int, frozenset]:
    epoch, in_epoch, base_seed = state["epoch"], state["in_epoch"], state["base_seed"]
    position, ahead = state["position"], state["delivered_ahead"]
    ints = (epoch, position, *ahead) if isinstance(ahead, (list, tuple)) else None
    if (
        ints is None
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints)
        or not isinstance(in_epoch, bool)
        or not (isinstance(base_seed, int) or (base_seed is None and not in_epoch))
        or any(index <= position for index in ahead)
    ):
        raise ValueError(
            f"DataLoader.load_state_dict: the state's position is malformed: epoch={epoch!r}, "
            f"in_epoch={in_epoch!r}, base_seed={base_seed!r}, position={position!r}, "
            f"delivered_ahead={ahead!r}; pass a dict returned by DataLoader.state_dict()"
        )
    return epoch, in_epoch, base_seed, position, frozenset(ahead)


def load(loader: Any, state: Any) -> None:
    """Check ``state`` against ``loader``, then make the loader continue from it
    at its next ``iter()`` (see :meth:`DataLoader.load_state_dict`).

    Everything is checked before anything changes; what the state is then
    loaded into (sampler, generator, dataset) is put back as it was if one
    of them refuses it, so a failed load leaves the loader as it was."""
    if isinstance(state, Mapping) and len(state) == 0:
        return  # torchdata's StatefulDataLoader takes {} as "nothing to load"
    _check_header(state)
    _check_settings(loader, state["settings"])
    epoch, in_epoch, base_seed, position, ahead = _read_progress(state)
    if in_epoch and loader.seed is not None and base_seed != rng.derive_seed(loader.seed, epoch):
        raise _mismatch(
            "the base seed does not follow from seed= and the epoch.", {"base_seed": base_seed}, {"seed": loader.seed}
        )
    worker_progress = _read_worker_progress(loader, state["worker_progress"])
    # num_workers=0, inside an epoch: the one copy's states are loaded by
    # the next iter(), around its __iter__ (dataset first, iterator after).
    copy_resumes = in_epoch and loader._iterable and loader.num_workers == 0
    if copy_resumes:
        worker_progress = _in_process_progress(state)
    sampler_state = state["sampler"]
    jumps = _has_position(sampler_state)
    loads_dataset = state["dataset_state"] is not None and not copy_resumes
    with _undone_on_failure(loader, loads_dataset):
        _apply(loader, state, in_epoch and not jumps, loads_dataset)
    if in_epoch:
        _warn_fast_forward(loader, epoch, worker_progress)
    loader._epoch = epoch
    loader._progress = None
    loader._resume = None
    loader._last_base_seed = None
    loader._next_base_seed = None if in_epoch else base_seed
    loader._next_worker_progress = None if in_epoch else worker_progress
    if in_epoch:
        loader._resume = ResumePoint(
            state=copy.deepcopy(dict(state)),
            epoch=epoch,
            base_seed=base_seed,
            position=position,
            delivered_ahead=ahead,
            sampler_state=sampler_state,
            generator_state=state["generator_state"],
            sampler_skip=0 if (jumps or loader._iterable) else position,
            worker_progress=worker_progress,
            replay=state.get("replay"),
            first_batch=state.get("first_batch"),
        )


def _warn_fast_forward(loader: Any, epoch: int, worker_progress: Any) -> None:
    """Say so when copies without state will read their items again."""
    if worker_progress is None:
        return
    batches = sum(
        int(st.get("served", 0))
        for st in worker_progress["states"]
        if st is not None and st.get("dataset_state") is None and st.get("iterator_state") is None
        and not st.get("iterator_ended")
    )
    if batches:
        warnings.warn(
            f"{type(loader.dataset).__name__} (and its iterator) has no state_dict/load_state_dict: to resume "
            f"epoch {epoch}, the next iteration reads again, without collating or sending them, the items of "
            f"the {batches} batches already served. Give the dataset or its iterator "
            f"state_dict/load_state_dict to resume without re-reading.",
            stacklevel=4,
        )


def _apply(loader: Any, state: Mapping[str, Any], replays: bool, loads_dataset: bool) -> None:
    """Load the state's parts into the sampler, the generator and the dataset."""
    sampler = loader._index_sampler
    if state["sampler"] is not None and _is_stateful(sampler):
        sampler.load_state_dict(state["sampler"])
    if replays:
        restore_replay_point(sampler, state.get("replay"), loader._flavor)
    _restore_generator(loader, state["generator_state"])
    if loads_dataset and _is_stateful(loader.dataset):
        loader.dataset.load_state_dict(state["dataset_state"])


@contextlib.contextmanager
def _undone_on_failure(loader: Any, loads_dataset: bool) -> Iterator[None]:
    """Put the sampler, the generator and (when ``loads_dataset``) the
    dataset back as they were if the block raises (a sampler or dataset
    refusing its part of the state)."""
    sampler, dataset = loader._index_sampler, loader.dataset
    sampler_before = replay_point(sampler, loader._flavor)
    generator_before = _generator_state(loader)
    dataset_before = dataset.state_dict() if loads_dataset and _is_stateful(dataset) else None
    try:
        yield
    except BaseException:
        restore_replay_point(sampler, sampler_before, loader._flavor)
        _restore_generator(loader, generator_before)
        if dataset_before is not None:
            dataset.load_state_dict(dataset_before)
        raise


def _read_worker_progress(loader: Any, saved: Any) -> Any:
    """The saved worker progress, checked against this loader's workers."""
    if saved is None:
        return None
    count = loader.num_workers
    try:
        states, retired, turn = saved["states"], saved["retired"], saved["next"]
        ok = (
            isinstance(states, list)
            and len(states) == count
            and all(isinstance(w, int) and 0 <= w < count for w in retired)
            and isinstance(turn, int)
            and 0 <= turn < count
        )
    except (TypeError, KeyError):
        ok = False
    if not ok:
        raise ValueError(
            f"DataLoader.load_state_dict: the state's worker_progress does not fit num_workers={count}: "
            f"{saved!r}; pass a dict returned by DataLoader.state_dict() of a loader with the same arguments"
        )
    return saved


def _restore_generator(loader: Any, generator_state: Any) -> None:
    source = _generator_source(loader)
    if source is not None and generator_state is not None:
        source.set_state(generator_state)


def _in_process_progress(state: Mapping[str, Any]) -> dict:
    """Where the one copy of an iterable dataset (num_workers=0) stood, as
    the progress of a single worker."""
    copy_state = {
        "dataset_state": state["dataset_state"],
        "iterator_state": state["iterator_state"],
        "iterator_ended": state["iterator_ended"],
        "served": state["iterator_served"],
    }
    return {"states": [copy_state], "retired": [], "next": 0}


def drop_resume_for_epoch(loader: Any, epoch: int) -> bool:
    """``set_epoch(epoch)`` keeps a loaded resume point of that epoch and drops
    any other, with a warning; True when it dropped one."""
    resume = loader._resume
    if resume is not None and resume.epoch != epoch:
        warnings.warn(
            f"{type(loader).__name__}.set_epoch({epoch}) drops the resume point loaded by load_state_dict "
            f"(epoch {resume.epoch}, {resume.count} batches delivered); call set_epoch({resume.epoch}) to "
            f"resume it",
            stacklevel=3,
        )
        loader._resume = None
        return True
    return False
