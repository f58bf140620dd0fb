"""A budget for bad samples: ``DataLoader(skip_bad_samples=...)``.

One corrupt file should not end a week-long run, and a thousand should not
pass unnoticed. With a budget, a sample whose ``__getitem__`` raises one of
the budget's exception types is left out of its batch (the batch is one
sample shorter; a batch whose every sample failed is left out), logged on
the ``conveyor`` logger, counted in ``loader.stats().skipped``, and the
epoch goes on; once the epoch's skips pass the budget, iteration fails with
:class:`BadSampleBudgetExceeded`, which lists every skip.

    worker: dataset[i] raises ──▶ SkippedSample(index, error) rides with its batch
    main:   SkipLedger.add ──▶ log, stats, the epoch's list (saved by state_dict)
                           ──▶ over budget: BadSampleBudgetExceeded(every skip)

Which samples fail depends on the samples only, so batches are the same for
any number or kind of workers, and a resumed epoch carries its skips on.
Map-style datasets only: a generator that raised cannot go on.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Optional, Union

__all__ = ["SkipBudget", "SkippedSample", "BadSampleBudgetExceeded"]

log = logging.getLogger("conveyor")


@dataclass(frozen=True)
class SkippedSample:
    """One sample left out: its index, the batch it belonged to, who loaded
    it, and what it raised (``"OSError: truncated file"``, and the traceback)."""

    index: Any
    batch_index: int
    worker: str
    error: str
    traceback: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SkipBudget:
    """How many bad samples an epoch may skip: at most ``count``, and at
    most ``fraction`` of the epoch's samples (both when both are given).
    Only exceptions of the types in ``errors`` are skipped; any other still
    fails its batch, as without a budget.

    ``DataLoader(skip_bad_samples=10)`` is ``SkipBudget(count=10)``;
    ``skip_bad_samples=0.001`` is ``SkipBudget(fraction=0.001)``."""

    count: Optional[int] = None
    fraction: Optional[float] = None
    errors: tuple = (Exception,)

    def __post_init__(self) -> None:
        if self.count is None and self.fraction is None:
            raise ValueError("SkipBudget needs count= (samples per epoch) or fraction= (of the epoch's samples)")
        if self.count is not None and (not _is_int(self.count) or self.count < 0):
            raise ValueError(f"SkipBudget count must be a non-negative int, got {self.count!r}")
        if self.fraction is not None and not (
            isinstance(self.fraction, numbers.Real) and not isinstance(self.fraction, bool) and 0 < self.fraction <= 1
        ):
            raise ValueError(f"SkipBudget fraction must be a number in (0, 1], got {self.fraction!r}")
        errors = self.errors if isinstance(self.errors, tuple) else (self.errors,)
        if not errors or not all(isinstance(e, type) and issubclass(e, Exception) for e in errors):
            raise TypeError(
                f"SkipBudget errors must be exception classes (subclasses of Exception), got {self.errors!r}"
            )
        object.__setattr__(self, "errors", errors)

    @classmethod
    def of(cls, value: Any) -> Optional["SkipBudget"]:
        """What ``DataLoader(skip_bad_samples=value)`` means: None (off), an
        int (a count), a float in (0, 1) (a fraction), or a SkipBudget."""
        if value is None or isinstance(value, cls):
            return value
        if _is_int(value):
            return cls(count=value)
        if isinstance(value, float):
            return cls(fraction=value)
        raise TypeError(
            f"skip_bad_samples must be None, an int (bad samples per epoch), a float in (0, 1] (a fraction "
            f"of the epoch) or a conveyor.SkipBudget, got {type(value).__name__} ({value!r})"
        )

    def limit(self, epoch_samples: Optional[int]) -> Union[int, float]:
        """The most skips an epoch of ``epoch_samples`` samples may have."""
        limits = []
        if self.count is not None:
            limits.append(self.count)
        if self.fraction is not None and epoch_samples is not None:
            limits.append(math.floor(self.fraction * epoch_samples))
        return min(limits) if limits else math.inf


class BadSampleBudgetExceeded(RuntimeError):
    """An epoch skipped more bad samples than its budget allows;
    ``skipped`` lists every one (index, batch, worker, error)."""

    def __init__(self, message: str, skipped: tuple):
        super().__init__(message)
        self.skipped = skipped


class SkipLedger:
    """One epoch's skips, in the main process: logs each, checks the budget."""

    def __init__(self, budget: SkipBudget, epoch_samples: Optional[int], skipped: list):
        self.budget = budget
        self.epoch_samples = epoch_samples
        #: The epoch's skips (the list the epoch's progress record holds, so state_dict saves them).
        self.skipped = skipped

    def add(self, records: Iterable[SkippedSample]) -> None:
        """Log and keep ``records``; raise BadSampleBudgetExceeded once over budget."""
        for record in records:
            self.skipped.append(record)
            # No "conveyor:" here: the logger's name says it (``%(name)s: %(message)s``).
            log.warning(
                "skipped sample %r of batch %d (%s): %s", record.index, record.batch_index, record.worker, record.error
            )
        limit = self.budget.limit(self.epoch_samples)
        if len(self.skipped) > limit:
            raise BadSampleBudgetExceeded(self._message(limit), tuple(self.skipped))

    def _message(self, limit: Union[int, float]) -> str:
        of = f" of {self.epoch_samples}" if self.epoch_samples is not None else ""
        lines = [
            f"conveyor: {len(self.skipped)} samples{of} failed this epoch, more than skip_bad_samples allows "
            f"({self.budget}: at most {limit}). Every one (index, batch, worker, error):"
        ]
        lines += [f"  {r.index!r} (batch {r.batch_index}, {r.worker}): {r.error}" for r in self.skipped]
        lines.append(
            "The first one's traceback:\n" + self.skipped[0].traceback
            if self.skipped and self.skipped[0].traceback
            else "Fix the data, or raise the budget."
        )
        return "\n".join(lines)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def epoch_samples(sampler: Any, batch_sampler: Any, dataset: Any) -> Optional[int]:
    """Samples an epoch draws (what a budget's fraction is of): the
    sampler's when it feeds the batches, else the dataset's length; None
    when neither has a length."""
    feeds = batch_sampler is None or getattr(batch_sampler, "sampler", None) is sampler
    try:
        return len(sampler) if feeds else len(dataset)
    except TypeError:
        return None
