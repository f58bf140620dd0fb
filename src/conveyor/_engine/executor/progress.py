"""Where the workers' copies of an iterable dataset stand, for exact resume.

Each worker holds its own copy of an iterable dataset. After every
delivered batch the loader needs, to save its state: each copy's own state
(a ``CopyState``, as its worker reports it), which copies ran out this
epoch, and whose turn is next in the round robin. A snapshot is the typed
``Copies`` (``loading/copies.py``): made at every delivered batch, handed on
as it is (``Delivered.copies``), and saved as it is (the state's ``copies``).
"""

from __future__ import annotations

from typing import Optional

from ..loading.copies import Copies, CopyState


class IterableProgress:
    """The workers' progress through an iterable dataset, as of the last
    delivered batch (resume mechanism 4: docs/architecture.md)."""

    def __init__(self, num_workers: int, saved: Optional[Copies] = None):
        if saved is None:
            self.states: list[Optional[CopyState]] = [None] * num_workers
            self.retired: list[int] = []
            self.next_turn = 0
        else:
            self.states = list(saved.states)
            self.retired = list(saved.retired)
            self.next_turn = saved.next_turn
        #: Batch index -> (worker id, its state) of copies that ran out, until
        #: delivery passes that batch.
        self._exhausted_at: dict[int, tuple[int, Optional[CopyState]]] = {}
        #: Batch index -> (worker id, its state after it) of batches that
        #: arrived and wait for their turn.
        self._arrived: dict[int, tuple[int, Optional[CopyState]]] = {}

    def restore_points(self) -> dict[int, CopyState]:
        """Worker id -> the state its copy resumes from (those with one)."""
        return {wid: state for wid, state in enumerate(self.states) if state is not None}

    def started(self, worker_id: int, state: Optional[CopyState]) -> None:
        """``worker_id``'s copy started its epoch now, standing at ``state``."""
        self.states[worker_id] = state

    def delivered(self, worker_id: int, state: Optional[CopyState]) -> None:
        """A batch of ``worker_id`` was delivered; its copy now stands at ``state``."""
        if state is not None:
            self.states[worker_id] = state
        self.next_turn = (worker_id + 1) % len(self.states)

    def arrived(self, batch_index: int, worker_id: int, state: Optional[CopyState]) -> None:
        """Batch ``batch_index`` of ``worker_id`` arrived, after which its copy
        stands at ``state``: so it stands once the batch is handed over."""
        self._arrived[batch_index] = (worker_id, state)

    def handed_over(self, batch_index: int) -> None:
        """Batch ``batch_index``, which arrived, is delivered now (:meth:`delivered`)."""
        found = self._arrived.pop(batch_index, None)
        if found is not None:
            self.delivered(*found)

    def exhausted(self, batch_index: int, worker_id: int, state: Optional[CopyState]) -> None:
        """``worker_id``'s copy ran out when asked for batch ``batch_index``."""
        self._exhausted_at[batch_index] = (worker_id, state)

    def passed(self, batch_index: int) -> None:
        """Delivery passed batch ``batch_index``, which a copy that ran out left empty."""
        found = self._exhausted_at.pop(batch_index, None)
        if found is None:
            return
        worker_id, state = found
        if state is not None:
            self.states[worker_id] = state
        if worker_id not in self.retired:
            self.retired.append(worker_id)

    def snapshot(self) -> Copies:
        """Where the copies stand now (``copies`` in DataLoader.state_dict)."""
        return Copies(tuple(self.states), tuple(self.retired), self.next_turn)
