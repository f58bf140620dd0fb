"""The order in which finished batches reach the user.

    results, in any order ──▶ ReorderBuffer ──▶ plan order (in_order=True)
                                             └─▶ order of arrival (in_order=False)

Batches of an iterable dataset that a worker could not fill (its copy ran
out) are *retired*: they hold a place in the plan and are passed over.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Optional


class ReorderBuffer:
    """Holds finished batches until their turn; what it holds is bounded by
    the batches in flight, however long the stream (each structure drops an
    entry when delivery passes it).

    ``put`` takes a finished batch's record, ``retire`` a planned batch
    that will never come; ``take`` gives the next record to deliver, or
    None. ``on_retired(index)`` is called as delivery passes a retired batch
    in plan order (iterable datasets track which workers ran out by it).
    """

    def __init__(
        self,
        in_order: bool,
        first_index: int = 0,
        skip: frozenset = frozenset(),
        on_retired: Optional[Callable[[int], None]] = None,
    ):
        self.in_order = in_order
        #: The batch index delivered next (in plan order).
        self.next_index = first_index
        self._ready: dict[int, Any] = {}
        self._retired: set[int] = set(skip)
        self._arrivals: deque[int] = deque()
        self._on_retired = on_retired

    def __len__(self) -> int:
        return len(self._ready)

    def put(self, index: int, record: Any) -> None:
        self._ready[index] = record
        if not self.in_order:  # (in plan order, next_index says what comes next)
            self._arrivals.append(index)

    def retire(self, index: int) -> None:
        self._retired.add(index)
        if not self.in_order:
            self._arrivals.append(index)

    def take(self) -> Optional[Any]:
        if not self.in_order:
            while self._arrivals:
                index = self._arrivals.popleft()
                record = self._ready.pop(index, None)
                if record is not None:
                    return record
                if index in self._retired:  # passed as it arrives
                    self._retired.discard(index)
                    if self._on_retired is not None:
                        self._on_retired(index)
            return None
        while self.next_index in self._retired:
            self._retired.discard(self.next_index)
            if self._on_retired is not None:
                self._on_retired(self.next_index)
            self.next_index += 1
        record = self._ready.pop(self.next_index, None)
        if record is not None:
            self.next_index += 1
        return record

    def finish(self) -> None:
        """The epoch is over: pass the retired batches no delivery reached
        (copies that ran out after the last batch)."""
        for index in sorted(self._retired):
            if self._on_retired is not None:
                self._on_retired(index)
        self._retired.clear()
