"""The DataLoader's resumable state: ``state_dict()`` and ``load_state_dict()``,
kept by its ResumeTracker (conveyor.state) over a view of its plan.

    loader.state_dict() ──▶ ResumeTracker.save(the loader's plan) ──▶ a small versioned dict
    loader.load_state_dict(state) ──▶ ResumeTracker.load(view, state): checked, then held
                                      for the next iter() (ResumeTracker.begin)
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol

import conveyor.state as _state

from ._plan import Plan

__all__ = ["StateMethods"]


class _Resumable(Protocol):
    """What the state methods need of their loader."""

    _tracker: _state.ResumeTracker

    def _plan(self) -> Plan: ...


class StateMethods:
    """The state methods of a DataLoader, over its ``_tracker`` and its ``_plan()``."""

    def state_dict(self: _Resumable) -> dict[str, Any]:
        """Where this loader stands, as a small versioned dict of plain values.

        It describes the most recent iterator: the next batch it would yield
        (between batches, mid-epoch), or, once it has finished or before any,
        the start of the next epoch. It holds the epoch, the epoch's base seed,
        which batches were delivered, the sampler's state and the generator's,
        and a checksum; ``json.dumps``, pickle and ``torch.save`` take it (JSON
        when the sampler's and the dataset's own states are plain).

        Example::

            >>> from conveyor import DataLoader
            >>> loader = DataLoader(list(range(10)), batch_size=2, shuffle=True, seed=0)
            >>> it = iter(loader); first = next(it)
            >>> state = loader.state_dict()
            >>> resumed = DataLoader(list(range(10)), batch_size=2, shuffle=True, seed=0)
            >>> resumed.load_state_dict(state)
            >>> [b.tolist() for b in resumed] == [b.tolist() for b in it]
            True
        """
        return self._tracker.save(self._plan())

    def load_state_dict(self: _Resumable, state_dict: Mapping[str, Any]) -> None:
        """Continue from ``state_dict`` (from :meth:`state_dict`) at the next ``iter(self)``.

        Build this loader with the same dataset and arguments as the one that
        saved it; ``num_workers`` may differ for map-style datasets. The next
        iteration then yields exactly the batches the saved run would have
        yielded next, without loading the ones before. An iterator already
        running goes on with its own batches; the state waits for the next
        ``iter()``, as in torchdata. Raises ValueError, showing both sides,
        when the state does not fit this loader or was changed after saving;
        then nothing has changed. ``{}`` loads nothing, as in torchdata.
        """
        self._tracker.load(self._plan(), state_dict)

    def resumes_at(self: _Resumable) -> Optional[tuple[int, int]]:
        """``(epoch, batches)``: where the next ``iter(self)`` resumes the
        state :meth:`load_state_dict` loaded, inside an epoch (its first
        ``batches`` batches are not loaded again); None when it starts an
        epoch from its first batch."""
        return self._tracker.resumes_at()
