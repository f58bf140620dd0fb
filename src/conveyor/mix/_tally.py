"""What a loader's pass over a mix has delivered, per source (``loader.stats().mix``).

    _plan's tasks ──watch──▶ {batch index: its positions}   (the batches in flight)
    delivery      ──delivered(batch index, left out)──▶ Mix.account(positions) added up
    loader.stats() ──report()──▶ MixReport over the pass's delivered samples

Counted at delivery, not when planned: a batch loaded ahead and not yet
handed out is not in the figures, one that raised counts nothing, and one
whose samples ``skip_bad_samples`` left out counts the samples the loop got. Any
sampler works, shuffled or split across ranks: each position is looked up
(``Mix.account``), never assumed to follow the one before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

import numpy as np

from ._report import MixReport, SourceReport

if TYPE_CHECKING:
    from ._dataset import Mix

__all__ = ["MixTally"]


class MixTally:
    """Per source, the samples of one pass's delivered batches, their
    target and the source's epoch; tasks go through :meth:`watch`, and
    each delivered batch is told to :meth:`delivered`."""

    def __init__(self, mix: "Mix") -> None:
        self._mix = mix
        n = len(mix.names)
        #: (served, target, reached) per source, replaced whole at each batch, so that a reading from
        #: another thread or a signal handler sees one batch's figures or the next's, never a mix.
        self._sums = (np.zeros(n, np.int64), np.zeros(n), np.zeros(n, np.int64))
        #: Batch index -> its positions, from planned until delivered (the batches in flight).
        self._planned: dict[int, Any] = {}

    def watch(self, tasks: Iterator[Any]) -> Iterator[Any]:
        """``tasks`` as they are, each one's positions noted (in the thread that plans)."""
        for task in tasks:
            self._planned[task.batch_index] = task.indices
            yield task

    def delivered(self, batch_index: int, left_out: Iterable[int] = (), raised: bool = False) -> None:
        """Batch ``batch_index`` was handed out without the sample indices
        ``left_out`` (or it ``raised``: nothing of it counts); once per
        batch (a second call adds nothing)."""
        positions = self._planned.pop(batch_index, None)
        if positions is None or raised:
            return
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)  # (a list, or one index: batch_size=None)
        skipped = list(left_out)
        if skipped:
            positions = positions[~np.isin(positions, skipped)]
        served, target, reached = self._mix.account(positions)
        before = self._sums
        self._sums = (before[0] + served, before[1] + target, np.maximum(before[2], reached))

    def report(self) -> MixReport:
        """The pass's delivered samples per source (``position``: how many
        in all), against their target; each source's epoch is that of the
        sample after its latest one delivered (0 before any)."""
        served_of, target_of, reached_of = self._sums
        total = int(served_of.sum())
        rows = []
        for s, name in enumerate(self._mix.names):
            served, length = int(served_of[s]), self._mix.lengths[s]
            epoch, in_epoch = divmod(int(reached_of[s]), length)
            target = float(target_of[s])
            share = served / total if total else 0.0
            target_share = target / total if total else self._mix.shares[name]
            rows.append(SourceReport(name, served, target, share, target_share, epoch, in_epoch, length))
        return MixReport(total, tuple(rows))
