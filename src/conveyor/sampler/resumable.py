"""Resumable iteration: the cursor, the resume point and the state dict every sampler shares.

::

    sampler.__iter__ ──▶ _Resumable._start ──▶ _chunks(context) ──▶ _drop(skip) ──▶ cursor.feed ──▶ items
                              │ a _Resume loaded by load_state_dict, or a fresh draw
                              └─ _Cursor: epoch, replay record, items yielded so far

* A sampler draws in chunks and yields the items of each chunk; a ``_Cursor``
  counts what has been handed out, so ``state_dict()`` is cheap at any moment.
* ``state_dict()`` records *what the current iteration was drawn from* (a seed,
  an epoch or a generator state taken before the first draw) and the
  *position* (items yielded so far). ``load_state_dict()`` makes the next
  ``__iter__`` draw again from that record and skip ``position`` items, chunk
  by chunk, so the generator ends where the uninterrupted run left it.

State dictionaries hold plain JSON values: ``version``, ``kind`` (the class
name), the settings that must match on load (every argument that shapes the
order; a long one, such as weights, by its fingerprint ``<argument>_crc32``:
:mod:`.fingerprint`), then ``epoch``, ``position``, ``in_iteration`` and
``rng`` (the replay record). ``position`` may be lowered
before loading (a loader that prefetched can rewind to what it delivered).
A state that does not fit the sampler raises ValueError showing both sides.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .arguments import _check_int, _is_int
from .fingerprint import describe_arguments, is_fingerprint

_STATE_VERSION = 1
_PROGRESS_KEYS = ("epoch", "position", "in_iteration", "rng")


class _Cursor:
    """How far one iteration of a sampler got, and the record it was drawn from.

    Items are handed out with ``yield from cursor.feed(chunk)``; the position is
    read back from the chunk's iterator (``length_hint``) instead of being
    counted per item, which keeps the per-item cost at a plain ``yield from``.
    """

    __slots__ = ("epoch", "record", "done", "_base", "_items", "_size")

    def __init__(self, epoch: int, record: Any, position: int):
        self.epoch = epoch
        self.record = record
        self.done = False
        self._base = position
        self._items: Iterator[Any] = iter(())
        self._size = 0

    @property
    def position(self) -> int:
        return self._base + self._size - operator.length_hint(self._items)

    def feed(self, chunk: Sequence[Any]) -> Iterator[Any]:
        """Iterator over ``chunk``; the previous chunk must have been used up."""
        self._base += self._size
        self._items = iter(chunk)
        self._size = len(chunk)
        return self._items

    def advance(self) -> None:
        """Count one item handed out without ``feed`` (one batch of a BatchSampler)."""
        self._base += 1


#: Items per chunk when a long draw is handed out in pieces (see in_blocks).
BLOCK_ITEMS = 1 << 16


def in_blocks(array: Any) -> Iterator[list[int]]:
    """An int64 array of indices as lists of Python ints, ``BLOCK_ITEMS`` at
    a time: an epoch's permutation of millions stays one array (8 bytes an
    index, against about 36 for a list of Python ints, held by the main
    process for the whole epoch). The draw happened before; a resumed
    sampler passes only the part from its position on, so nothing before
    the position is converted."""
    for start in range(0, len(array), BLOCK_ITEMS):
        yield array[start : start + BLOCK_ITEMS].tolist()


def _drop(chunks: Iterable[Sequence[Any]], skip: int) -> Iterator[Sequence[Any]]:
    """``chunks`` without their first ``skip`` items; every chunk is still drawn."""
    for chunk in chunks:
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        yield chunk[skip:] if skip else chunk
        skip = 0


class _Resume:
    """A loaded state waiting for the next ``__iter__``."""

    __slots__ = ("epoch", "position", "record")

    def __init__(self, epoch: int, position: int, record: Any):
        self.epoch, self.position, self.record = epoch, position, record


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def mismatch_error(owner: str, what: str, saved: Mapping[str, Any], mine: Mapping[str, Any], fix: str) -> ValueError:
    """``owner.load_state_dict: what`` with both sides and the fix: the one
    "does not fit" error of the project, which samplers (:func:`_state_error`)
    and the loader's state checks (``state/_checks.py``) both raise."""
    width = max(len("saved state"), len(f"this {owner_noun(owner)}"))
    return ValueError(
        f"{owner}.load_state_dict: {what}\n"
        f"  {'saved state:'.ljust(width + 1)} {_describe(saved)}\n"
        f"  {f'this {owner_noun(owner)}:'.ljust(width + 1)} {_describe(mine)}\n"
        f"{fix}"
    )


def owner_noun(owner: str) -> str:
    """ "loader" for a DataLoader's state, "sampler" for a sampler's."""
    return "loader" if owner.endswith("DataLoader") else "sampler"


_SAMPLER_FIX = (
    "Fix: load the state into a sampler (and a loader) built with the same dataset and arguments as "
    "the run that saved it (and the same conveyor version), or start without load_state_dict."
)


def _state_error(kind: str, what: str, saved: Mapping[str, Any], mine: Mapping[str, Any]) -> ValueError:
    """The project's one both-sides error (:func:`mismatch_error`), for a sampler."""
    return mismatch_error(kind, what, saved, mine, _SAMPLER_FIX)


def _check_state(kind: str, state: Any, expected: Mapping[str, Any]) -> None:
    """Raise ValueError, showing both sides, when ``state`` was not saved by a sampler like this one."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{kind}.load_state_dict expects the dict returned by state_dict(), got {type(state).__name__}")
    header = {"version": _STATE_VERSION, "kind": kind}
    saved_header = {key: state.get(key, "<missing>") for key in header}
    if saved_header != header:
        raise _state_error(kind, "the state comes from another kind of sampler or state version.", saved_header, header)
    saved = {key: state.get(key, "<missing>") for key in expected}
    # A state saved before an argument's fingerprint was recorded lacks it: accepted (nothing to check it by).
    differing = [key for key in expected if saved[key] != expected[key] and (key in state or not is_fingerprint(key))]
    if differing:
        raise _state_error(
            kind,
            f"the state was saved by a sampler with other settings: {describe_arguments(differing)}.",
            {key: saved[key] for key in differing},
            {key: expected[key] for key in differing},
        )


def _read_progress(kind: str, state: Mapping[str, Any]) -> tuple[int, int, bool, Any]:
    missing = [key for key in _PROGRESS_KEYS if key not in state]
    if missing:
        raise ValueError(f"{kind}.load_state_dict: the state lacks {missing}; pass a dict returned by state_dict()")
    epoch, position, in_iteration = state["epoch"], state["position"], state["in_iteration"]
    if not _is_int(epoch) or not _is_int(position) or position < 0 or not isinstance(in_iteration, bool):
        raise ValueError(
            f"{kind}.load_state_dict: epoch and position must be integers (position >= 0) and "
            f"in_iteration a bool, got epoch={epoch!r}, position={position!r}, in_iteration={in_iteration!r}"
        )
    return int(epoch), int(position), in_iteration, state["rng"]


class _Resumable:
    """Shared ``__iter__`` skeleton, ``state_dict``, ``load_state_dict`` and ``set_epoch``.

    A subclass provides ``_settings()`` (what must match on load), ``_open(epoch,
    record)`` (the draw context for an iteration, from scratch when ``record`` is
    None, and the record to replay it) and ``_chunks(context)`` (the items, as
    sequences). Samplers whose draws do not follow from the epoch override
    ``_idle_record`` / ``_restore_idle`` to carry a generator's state between
    iterations.
    """

    #: Whether each iteration moves ``epoch`` on by one (torch's DistributedSampler does not).
    _auto_epoch = True

    epoch: int

    def _init_progress(self) -> None:
        self.epoch = 0
        self._cursor: _Cursor | None = None
        self._resume: _Resume | None = None

    # -- hooks -------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        return None, None

    def _chunks(self, context: Any) -> Iterable[Sequence[Any]]:
        raise NotImplementedError

    def _chunks_from(self, context: Any, position: int) -> Iterable[Sequence[Any]]:
        """The items from ``position`` on: ``_chunks`` with the first
        ``position`` items dropped (every chunk drawn again). A sampler
        whose order is computed per position overrides it to start there."""
        return _drop(self._chunks(context), position)

    def _idle_record(self) -> Any:
        return None

    def _restore_idle(self, record: Any) -> None:
        return None

    def _max_position(self) -> int | None:
        return None

    def _record_problem(self, record: Any, in_iteration: bool) -> str | None:
        """Why a state's ``rng`` record cannot replay this sampler's draw
        (None: it can); checked before anything is loaded."""
        return None

    # -- iteration ---------------------------------------------------------

    def _start(self) -> tuple[_Cursor, Any]:
        resume, self._resume = self._resume, None
        if resume is None:
            epoch, position = self.epoch, 0
            context, record = self._open(epoch, None)
        else:
            epoch, position = resume.epoch, resume.position
            context, record = self._open(epoch, resume.record)
        self.epoch = epoch + 1 if self._auto_epoch else epoch
        cursor = _Cursor(epoch, record, position)
        self._cursor = cursor
        return cursor, context

    def _iterate(self) -> Iterator[Any]:
        """The iteration's items from the cursor's position on: resume
        mechanism 1 (docs/architecture.md, "Resume mechanisms"), the
        sampler jumps (draws its chunks again, hands out none before the
        position, reads no sample; a computed order starts at the position
        itself: ``_chunks_from``)."""
        cursor, context = self._start()
        for chunk in self._chunks_from(context, cursor.position):
            yield from cursor.feed(chunk)
        cursor.done = True

    # -- public ------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (its shuffle follows from ``seed`` and ``epoch``).

        A resume point loaded by :meth:`load_state_dict` for another epoch is
        dropped, with a warning.
        """
        epoch = _check_int("epoch", epoch)
        if self._resume is not None and self._resume.epoch != epoch:
            warnings.warn(
                f"{type(self).__name__}.set_epoch({epoch}) drops the resume point loaded by "
                f"load_state_dict (epoch {self._resume.epoch}, position {self._resume.position}); "
                f"call set_epoch({self._resume.epoch}) to resume it",
                stacklevel=2,
            )
            self._resume = None
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        """Where this sampler stands, as a small dict of JSON values.

        Load it with :meth:`load_state_dict` into a sampler built the same way;
        its next iteration then yields exactly the items this one had not yet
        yielded, and later iterations follow as if never interrupted.
        """
        return {"version": _STATE_VERSION, "kind": type(self).__name__, **self._settings(), **self._progress()}

    def _progress(self) -> dict[str, Any]:
        if self._resume is not None:
            resume = self._resume
            return {"epoch": resume.epoch, "position": resume.position, "in_iteration": True, "rng": resume.record}
        cursor = self._cursor
        if cursor is not None and not cursor.done:
            return {"epoch": cursor.epoch, "position": cursor.position, "in_iteration": True, "rng": cursor.record}
        return {"epoch": self.epoch, "position": 0, "in_iteration": False, "rng": self._idle_record()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from :meth:`state_dict`) at the next ``__iter__``.

        Raises ValueError, showing both sides, when the state was saved by a
        sampler of another kind or with other settings.
        """
        kind = type(self).__name__
        _check_state(kind, state, self._settings())
        epoch, position, in_iteration, record = _read_progress(kind, state)
        limit = self._max_position()
        if limit is not None and position > limit:
            what = "the saved position is past the end of an iteration."
            raise _state_error(kind, what, {"position": position}, {"len": limit})
        problem = self._record_problem(record, in_iteration)
        if problem is not None:
            raise ValueError(
                f"{kind}.load_state_dict: the state's 'rng' {problem}; pass a dict returned by {kind}.state_dict() "
                f"of a sampler built the same way"
            )
        self._cursor = None
        self.epoch = epoch
        self._resume = _Resume(epoch, position, record) if in_iteration else None
        if not in_iteration:
            self._restore_idle(record)


def _has_position(state: Any) -> bool:
    """Whether ``state`` is a conveyor sampler state (its position can be set)."""
    return isinstance(state, Mapping) and "position" in state and "in_iteration" in state
