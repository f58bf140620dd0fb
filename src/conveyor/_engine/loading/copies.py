"""Where an iterable dataset's copies stand: the typed records the engine and the state share.

    worker: IterableFetcher.state() ──CopyState──▶ Batch.worker_state / Exhausted (across the pipe)
    main:   IterableProgress (executor/progress.py) ──snapshot()──▶ Copies ──▶ Delivered.copies
            ──▶ EpochProgress.copies ──▶ LoaderState.copies ──to_dict()──▶ DataLoader.state_dict()["copies"]
    load:   state["copies"] ──checked (state_checks)──▶ Copies.of ──▶ Start.copies ──▶ the executor
            ──▶ Task.restore (a CopyState) ──▶ IterableFetcher.begin_epoch

Each worker holds its own copy of an iterable dataset (``num_workers=0``:
the one copy in the loop's process). These records are plain values, no
checks: a saved state is checked once, where it is decoded
(``state_records.LoaderState.from_dict``), and only then made into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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
        return {
            "dataset_state": self.dataset_state,
            "iterator_state": self.iterator_state,
            "iterator_ended": self.iterator_ended,
            "served": self.served,
        }

    @classmethod
    def of(cls, copy: Mapping[str, Any]) -> "CopyState":
        """A checked state's dict as a record."""
        return cls(copy["dataset_state"], copy["iterator_state"], copy["iterator_ended"], copy["served"])

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
        """The state's plain dict (``copies`` in DataLoader.state_dict)."""
        states = [None if copy is None else copy.to_dict() for copy in self.states]
        return {"states": states, "retired": list(self.retired), "next": self.next_turn}

    @classmethod
    def of(cls, saved: Optional[Mapping[str, Any]]) -> Optional["Copies"]:
        """A checked state's ``copies`` as a record; None for None."""
        if saved is None:
            return None
        states = tuple(None if copy is None else CopyState.of(copy) for copy in saved["states"])
        return cls(states, tuple(saved["retired"]), saved["next"])

    def next_epoch(self) -> "Copies":
        """As the start of the next epoch: each copy's dataset state, a new
        iteration, every worker active, worker 0 first."""
        states = tuple(None if copy is None else CopyState(copy.dataset_state, None, False, 0) for copy in self.states)
        return Copies(states, (), 0)

    @property
    def reads_again(self) -> int:
        """Batches whose items copies without state read again to resume."""
        return sum(copy.reads_again for copy in self.states if copy is not None)


__all__ = ["CopyState", "Copies"]
