"""The plan: a DataLoader's arguments turned into frozen, grouped parts,
each layer receiving only its own, and how they are made (``make_plan``).

    DataLoader(arguments) ──make_plan──▶ Plan
        .loading    what to load: the dataset and its kind, batching, collate
                    and its numpy route, reads in flight, errors a sample may
                    be skipped for (fetch.FetchSpec)                ──▶ the workers
        .running    how: the workers and where they run ("inline" for
                    num_workers=0, "thread", or a start method), the window,
                    order, waits, timing (executor.Running)        ──▶ the executor
        .sampling   the order and its seeds: the index sampler,
                    seed, generator, flavour (Sampling)             ──▶ the state, the pass
        .delivering one pass's delivery: pinning, the length torch
                    checks, the bad-sample budget, stats and a Mix's
                    count of its sources (Delivering)               ──▶ the iterator

The loader makes a plan when a pass starts and when its state is saved or
loaded, reading its arguments each time (a torch user may set
``num_workers`` or ``prefetch_factor`` between passes, and the next pass
follows). Modes are decided here, once: where the workers run
(``Running.method``), how a map-style batch's samples are read
(``fetch.choose_reads``); nothing below the plan asks the loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol

from .._engine.executor.kinds import kind_of
from .._engine.executor.records import Running
from .._engine.loading.fetch import FetchSpec, collate_route
from .._engine.workers.launch import START_METHODS, resolve_start_method
from ..mix import Mix, MixTally
from ..ray_options import ray_workers_of
from ..skips import epoch_samples

__all__ = ["Delivering", "LoaderArguments", "Plan", "Sampling", "make_plan", "start_method"]


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
    #: The Mix whose sources the stats count per pass (``stats().mix``; None: not a Mix, or stats off).
    mix: Optional[Mix] = None

    def mix_tally(self) -> Optional[MixTally]:
        """A new pass's count of the mix's sources (None: nothing to count)."""
        return MixTally(self.mix) if self.mix is not None else None


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


class LoaderArguments(Protocol):
    """What a plan is made of: the DataLoader's arguments as it keeps them."""

    dataset: Any
    batch_size: Optional[int]
    drop_last: bool
    sampler: Any
    batch_sampler: Any
    collate_fn: Callable[[Any], Any]
    num_workers: int
    prefetch_factor: Optional[int]
    pin_memory: bool
    timeout: float
    worker_init_fn: Optional[Callable[[int], None]]
    worker_method: Any
    multiprocessing_context: Any
    in_order: bool
    generator: Any
    seed: Optional[int]
    stall_warning: float
    reads_in_flight: int
    skip_bad_samples: Any
    persistent_workers: bool
    _flavor: str
    _iterable: bool
    _prefetch_given: bool
    _stats: Any
    _IterableDataset_len_called: Optional[int]

    @property
    def _auto_collation(self) -> bool: ...

    @property
    def _index_sampler(self) -> Any: ...


def make_plan(loader: LoaderArguments) -> Plan:
    """``loader``'s arguments as the parts each layer takes."""
    collate_into, to_torch = collate_route(loader.collate_fn)
    loading = FetchSpec(
        dataset=loader.dataset,
        kind=kind_of(loader._iterable),
        auto_collation=loader._auto_collation,
        batch_size=loader.batch_size,
        drop_last=loader.drop_last,
        collate_fn=loader.collate_fn,
        collate_into=collate_into,
        to_torch=to_torch,
        reads_in_flight=loader.reads_in_flight,
        skip_errors=loader.skip_bad_samples.errors if loader.skip_bad_samples is not None else (),
    )
    inline = loader.num_workers == 0  # (one worker, in this thread, loading nothing ahead: inline.py)
    method = "inline" if inline else start_method(loader.multiprocessing_context, loader.worker_method)
    running = Running(
        workers=1 if inline else loader.num_workers,
        num_workers=loader.num_workers,
        method=method,
        prefetch_factor=1 if inline or loader.prefetch_factor is None else loader.prefetch_factor,
        deepen_small=not (inline or loader._prefetch_given),
        in_order=loader.in_order,
        timeout_s=0 if inline else loader.timeout,
        worker_init_fn=None if inline else loader.worker_init_fn,
        stall_warning_s=0.0 if inline else float(loader.stall_warning),
        timed=loader._stats is not None,
        persistent=loader.persistent_workers,
        ray=None if inline else ray_workers_of(loader.worker_method),
        stagger=method == "fork" and loader.num_workers > 1,
    )
    index_sampler = loader._index_sampler
    which = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    sampling = Sampling(
        index_sampler=index_sampler,
        sampler_text=f"the {which} {type(index_sampler).__name__}",
        seed=loader.seed,
        generator=loader.generator,
        flavor=loader._flavor,
    )
    skipping = loader.skip_bad_samples is not None
    delivering = Delivering(
        pin=bool(loader.pin_memory),
        pin_ahead=loader.prefetch_factor or 1,
        expected_length=loader._IterableDataset_len_called,
        stats=loader._stats,
        skip_budget=loader.skip_bad_samples,
        epoch_samples=epoch_samples(loader.sampler, loader.batch_sampler, loader.dataset) if skipping else None,
        mix=loader.dataset if isinstance(loader.dataset, Mix) and loader._stats is not None else None,
    )
    return Plan(loading, running, sampling, delivering)


def start_method(multiprocessing_context: Any, worker_method: Any) -> str:
    """Where workers run when there are any: "thread", "ray", or the process
    start method of ``multiprocessing_context`` (the platform's default when None)."""
    if ray_workers_of(worker_method) is not None:
        return "ray"
    if worker_method == "thread":
        return "thread"
    method = resolve_start_method(multiprocessing_context)
    if method not in START_METHODS:
        raise ValueError(f"unsupported start method {method!r}; use one of {START_METHODS}")
    return method
