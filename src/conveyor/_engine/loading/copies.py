"""Where an iterable dataset's copies stand: the typed records the engine and the state share.

    worker: IterableFetcher.state() ──CopyState──▶ Batch.worker_state / Exhausted (across the pipe)
    main:   IterableProgress (executor/progress.py) ──snapshot()──▶ Copies ──▶ Delivered.copies
            ──▶ EpochProgress.copies ──▶ LoaderState.copies ──to_dict()──▶ DataLoader.state_dict()["copies"]
    load:   state["copies"] ──checked (state/_checks.py)──▶ Copies.of ──▶ Start.copies ──▶ the executor
            ──▶ Task.restore (a CopyState) ──▶ IterableFetcher.begin_epoch

Each worker holds its own copy of an iterable dataset (``num_workers=0``:
the one copy in the loop's process). These records are plain values, no
checks: a saved state is checked once, where it is decoded
(``state/_records.py``'s ``LoaderState.from_dict``, by ``state/_checks.py``,
which reads the keys from here: ``COPIES_KEYS``, ``COPY_KEYS``), and only
then made into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Optional


@dataclass(frozen=True)
class CopyState:
    """Where one copy stands, as its worker reports it (``IterableFetcher.state``):
    the dataset's and its iterator's own states (None: they have none), whether
    its iterator ended, and how many batches it was asked for this epoch."""

    dataset_state: Any
    iterator_state: Any
    iterator_ended: bool
    served: int

    def __reduce__(self) -> tuple:  # (crosses the pipe with every batch of an iterable: positional, small)
        return (CopyState, (self.dataset_state, self.iterator_state, self.iterator_ended, self.served))

    def to_dict(self) -> dict[str, Any]:
        """The saved copy (one of ``copies["states"]``): its fields by name (``COPY_KEYS``)."""
        return {key: getattr(self, key) for key in COPY_KEYS}

    @classmethod
    def of(cls, copy: Mapping[str, Any]) -> "CopyState":
        """A checked state's dict as a record."""
        return cls(**{key: copy[key] for key in COPY_KEYS})

    @property
    def carried_over(self) -> bool:
        """Whether this is a copy carried into a new epoch from the one before
        (:meth:`Copies.next_epoch`: its dataset's state, nothing of this
        epoch yet). A copy that had begun an epoch and served nothing from an
        iterator without a state looks the same, and is resumed the same."""
        return self.iterator_state is None and not self.iterator_ended and self.served == 0

    @property
    def reads_again(self) -> int:
        """Batches whose items a resumed copy reads again: it has no state to
        go on from and had not ended (IterableFetcher.begin_epoch moves it on
        past them)."""
        if self.dataset_state is None and self.iterator_state is None and not self.iterator_ended:
            return int(self.served)
        return 0


@dataclass(frozen=True)
class Copies:
    """The copies of one pass (the state's ``copies``): each copy's state
    (None: it had not started), the workers whose copy ran out this epoch (in
    the order delivery passed their end), and whose turn is next in the round
    robin (the key ``next``)."""

    states: tuple[Optional[CopyState], ...]
    retired: tuple[int, ...]
    next_turn: int

    def to_dict(self) -> dict[str, Any]:
        """The state's plain dict (``copies`` in DataLoader.state_dict; its keys: ``COPIES_KEYS``)."""
        states = [None if copy is None else copy.to_dict() for copy in self.states]
        return dict(zip(COPIES_KEYS, (states, list(self.retired), self.next_turn)))

    @classmethod
    def of(cls, saved: Optional[Mapping[str, Any]]) -> Optional["Copies"]:
        """A checked state's ``copies`` as a record; None for None."""
        if saved is None:
            return None
        states, retired, next_turn = (saved[key] for key in COPIES_KEYS)
        return cls(tuple(None if copy is None else CopyState.of(copy) for copy in states), tuple(retired), next_turn)

    def next_epoch(self) -> "Copies":
        """As the start of the next epoch: each copy's dataset state, a new
        iteration, every worker active, worker 0 first."""
        states = tuple(None if copy is None else CopyState(copy.dataset_state, None, False, 0) for copy in self.states)
        return Copies(states, (), 0)

    @property
    def reads_again(self) -> int:
        """Batches whose items copies without state read again to resume."""
        return sum(copy.reads_again for copy in self.states if copy is not None)


#: The keys of a saved copy (``CopyState.to_dict``): its fields' names.
COPY_KEYS = tuple(field.name for field in fields(CopyState))
#: The keys of a saved ``copies`` (``Copies.to_dict``): the copies' states,
#: the workers retired, whose turn is next (the field ``next_turn``).
COPIES_KEYS = ("states", "retired", "next")

__all__ = ["CopyState", "Copies", "COPY_KEYS", "COPIES_KEYS"]
