"""The plan: a DataLoader's arguments turned into frozen, grouped parts,
each layer receiving only its own.

    DataLoader(arguments) ──plan()──▶ Plan
        .loading    what to load: the dataset and its kind, batching, collate,
                    how samples are read (fetch.FetchSpec)          ──▶ the workers
        .running    how: the workers and their kind, the window,
                    order, waits, timing (executor.Running)       ──▶ the executor
        .sampling   the order and its seeds: the index sampler,
                    seed, generator, flavour (Sampling)             ──▶ the state, the pass
        .delivering one pass's delivery: pinning, the length torch
                    checks, the bad-sample budget, stats (Delivering) ──▶ the iterator

The loader makes a plan when a pass starts and when its state is saved or
loaded (a torch user may set ``num_workers`` or ``prefetch_factor`` between
passes, and the next pass follows). Modes are decided here, once: where
the workers run (``Running.method``: "inline" for ``num_workers=0``,
"thread", or a process start method), how a map-style batch's samples are
read (``fetch.choose_reads``); nothing below the plan asks the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .._engine.executor.records import Running
from .._engine.loading.fetch import FetchSpec


@dataclass(frozen=True)
class Sampling:
    """What decides a pass's batches and their seeds."""

    #: The batch sampler (or the sampler, when batching is off).
    index_sampler: Any
    #: How errors name it: "the sampler RandomSampler", "the batch_sampler ...".
    sampler_text: str
    seed: Optional[int]
    generator: Any
    #: "numpy" (the core) or "torch" (conveyor.torch): whose global generator is drawn from.
    flavor: str


@dataclass(frozen=True)
class Delivering:
    """What one pass does with each batch before the loop has it."""

    pin: bool
    #: Batches the pin thread runs ahead (prefetch_factor), when pinning.
    pin_ahead: int
    #: An iterable dataset's length as len(loader) reported it (torch's check).
    expected_length: Optional[int]
    #: Where each batch's timings go (None: stats are off).
    stats: Any
    #: skip_bad_samples (None: off), and the epoch's samples its fraction is of.
    skip_budget: Any
    epoch_samples: Optional[int]


@dataclass(frozen=True)
class Plan:
    """Everything a pass, a state or an executor needs of its loader."""

    loading: FetchSpec
    running: Running
    sampling: Sampling
    delivering: Delivering

    @property
    def iterable(self) -> bool:
        return self.loading.iterable

    @property
    def keeps_base_seed(self) -> bool:
        """Whether passes after the first draw no base seed (persistent workers, as torch)."""
        return self.running.persistent and self.running.num_workers > 0
