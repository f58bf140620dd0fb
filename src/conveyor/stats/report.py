"""What a loader's stats say: :class:`LoaderStats`, its figures and the ways of showing them.

    StatsRecorder.snapshot() ──Mark (raw totals)──▶ LoaderStats
        LoaderStats ──to_dict()──▶ JSON (shares and the raw totals)
                    ──summary(), str()──▶ table + verdict (table.py, verdict.py)
                    ──_repr_html_()──▶ the same, in a notebook

The figures themselves, and how each share is made of the raw totals, are in
figures.py (:class:`~.figures.LoaderFigures`); the table and the verdict read
those figures, so this module, which shows them, sits above both.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, TextIO

from .figures import LoaderFigures, Mark, StageStats, _cores_read, fractions, share_of
from .table import html_table, text_table
from .verdict import Verdict, judge
from .workers import per_worker


@dataclass(frozen=True)
class LoaderStats(LoaderFigures):
    """Where a loader's time went, from its first ``iter()`` until now.

    The figures, their units and how each share is made are those of
    :class:`~.figures.LoaderFigures`; this class adds the table, the verdict
    and their text and HTML. ``interval`` holds the same figures since an
    earlier snapshot (see ``DataLoader.stats(since=...)``; None otherwise).
    """

    interval: Optional["LoaderStats"] = None

    @classmethod
    def from_mark(
        cls, mark: Mark, stages: Mapping[str, StageStats], *, num_workers: int, **extras: Any
    ) -> "LoaderStats":
        wall = mark.wall_s
        wait = stages["wait"].total_s
        shares = fractions(mark, num_workers)
        workers, nodes = per_worker(mark.workers, wall)
        return cls(
            batches=mark.batches,
            samples=mark.samples,
            errors=mark.errors,
            wall_s=wall,
            samples_per_s=mark.samples / wall if wall > 0 else 0.0,
            batches_per_s=mark.batches / wall if wall > 0 else 0.0,
            data_wait_fraction=share_of(wait, wall) or 0.0,
            startup_s=mark.startup_s,
            steady_wait_fraction=share_of(wait - mark.startup_s, wall - mark.startup_s) or 0.0,
            workers_busy_fraction=shares.workers_busy,
            loading_cpu_fraction=shares.loading_cpu,
            loading_cpu_wait_fraction=shares.loading_cpu_wait,
            loading_off_cpu_fraction=shares.loading_off_cpu,
            cpu_measured_batches=mark.cpu_batches,
            cores=_cores_read(mark),
            cores_job_fraction=shares.cores_job,
            cores_others_fraction=shares.cores_others,
            cores_idle_fraction=shares.cores_idle,
            num_workers=num_workers,
            stages=stages,
            workers=workers,
            nodes=nodes,
            _mark=mark,
            **extras,
        )

    def with_interval(self, interval: "LoaderStats") -> "LoaderStats":
        return replace(self, interval=interval)

    def verdict(self, cores: Optional[int] = None) -> "Verdict":
        """Input- or compute-bound, the slowest stage, and what to change."""
        return judge(self, cores)

    def table(self) -> str:
        """The stats as a short table (the first part of :meth:`summary`)."""
        return text_table(self)

    def summary(self, file: Optional[TextIO] = None, cores: Optional[int] = None) -> None:
        """Print the table and the verdict (to ``file``, default stdout).

        It returns nothing, so a REPL or a notebook shows it once;
        ``str(stats)`` is the same text, ``stats.verdict()`` the verdict as
        an object, and in a notebook ``stats`` on its own shows them as HTML."""
        print(self.text(cores), file=file if file is not None else sys.stdout)

    def text(self, cores: Optional[int] = None) -> str:
        """The table and the verdict, as :meth:`summary` prints them."""
        return f"{self.table()}\n{self.verdict(cores)}"

    def __str__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        """The table and the verdict as HTML (Jupyter shows it for ``loader.stats()``)."""
        return html_table(self)
