"""Measure your own loader over a sweep of num_workers and prefetch_factor, and recommend a setting.

conveyor tune MODULE:FACTORY (or path/to/file.py:FACTORY) calls FACTORY(). A dataset it
returns is loaded with DataLoader(dataset, batch_size=--batch-size, shuffle=True) (--torch:
conveyor.torch's). A conveyor DataLoader it returns keeps its other arguments (sampler,
collate_fn, worker_method, ...), while num_workers, prefetch_factor and batch_size
(--batch-sizes) vary; tune always collects stats, shows no progress bar, and keeps the
workers between the passes of a round.

How it measures: each setting runs --rounds times, the settings taking turns (every other
round in reverse order), so that load from other programs that comes and goes falls on all
of them alike. A round is a fresh loader. The first batch of each worker is left out of the
rates: the first one is start-up (the "first batch" column), and the workers start together,
so the others arrive at once. Then come batches, each followed by --step-ms of sleep (your
training step), for the setting's share of --seconds (0.25 s at least) and at least
--min-batches batches and twice the batches in flight, over as many passes as that takes
(workers are kept between passes). A setting's samples/s are shown as its best round, the
median and the slowest; its other figures are medians over its rounds. After the sweep, one
longer round of the recommended setting (0.6 s and 20 batches at least) gives the stats'
verdict, and the advice.

How it chooses: settings are compared by their best round. Other programs can only slow a
round down, so the fastest round is the nearest to what a setting can do, and taking turns
gives each setting its chances at the quieter moments. The noise is how far a setting's best
round stands above its next best (the median over the settings). Settings whose best is within
the noise, and at least 10%, of the fastest tie; of those, the one with the fewest workers,
then the smallest prefetch, then the least memory is recommended. The advice printed with it
never asks for a setting the sweep measured and did not recommend.

Budgets: a setting is skipped when one with no more workers and no more prefetch went over
--max-rss-gb, when the memory per worker seen so far predicts it would, or when it would
pass --max-seconds.

Exit status: 0; 1 when no setting was measured; 2 for a FACTORY or an option that cannot be
used.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .._engine.cpu import usable_cores
from .factory import FactoryError, load_factory
from .tune_choice import recommend
from .tune_measure import TuneError, available_bytes, loader_builder, tree_memory_bytes
from .tune_report import (
    describe_bound,
    describe_choice,
    format_round,
    format_row,
    load_average,
    noise_note,
    write_outputs,
)
from .tune_sweep import SweepOptions, default_workers, plan, sweep, verdict_round

#: The default --max-rss-gb: this share of what is free at start plus what
#: this process holds already, leaving room for the rest of the machine.
_DEFAULT_MEMORY_SHARE = 0.8
_GB = 1 << 30


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, e.g. 0,1,2,4; got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``conveyor tune``."""
    add = parser.add_argument
    add("factory", metavar="MODULE:FACTORY", help="a function returning a dataset or a DataLoader")
    add("--workers", type=_int_list, help="num_workers to try, e.g. 0,1,2,4 (default: 0,1,2,4,... to twice the cores)")
    add("--prefetch", type=_int_list, default=[2, 4], help="prefetch_factor values to try (default 2,4)")
    add("--batch-sizes", type=_int_list, help="batch sizes to try (default: the loader's own)")
    add("--batch-size", type=int, default=32, help="batch size when FACTORY returns a dataset (default 32)")
    add("--torch", action="store_true", help="load a dataset with conveyor.torch.DataLoader (torch tensors)")
    add("--step-ms", type=float, default=0.0, help="a simulated training step per batch, in ms (default 0)")
    add("--seconds", type=float, default=3.0, help="seconds to measure each setting, over all its rounds (default 3)")
    add("--rounds", type=int, default=8, help="rounds per setting, at least 2 (default 8)")
    add("--min-batches", type=int, default=10, help="batches each round delivers at least (default 10)")
    add("--max-seconds", type=float, default=120.0, help="seconds for the whole sweep (default 120)")
    add("--max-rss-gb", type=float, help="memory budget in GB (default: 80%% of the memory free at start)")
    add("--out", type=Path, help="a folder for tune.json and tune.png")


def run(args: argparse.Namespace) -> int:
    """Run the sweep; the exit status."""
    try:
        return _run(args)
    except FactoryError as exc:
        print(f"conveyor tune: error: {exc}", file=sys.stderr)
        return 2


def _options(args: argparse.Namespace) -> SweepOptions:
    if min(args.prefetch) < 1 or min(args.batch_sizes or [1]) < 1:
        raise TuneError("--prefetch and --batch-sizes values must be at least 1")
    if args.rounds < 2:
        raise TuneError("--rounds must be at least 2: the spread of the rounds tells a real difference from noise")
    if args.min_batches < 1 or args.seconds < 0:
        raise TuneError("--min-batches must be at least 1 and --seconds not negative")
    budget = args.max_rss_gb * _GB if args.max_rss_gb else None
    if budget is None and (available := available_bytes()) is not None:
        budget = int(_DEFAULT_MEMORY_SHARE * (available + (tree_memory_bytes() or 0)))
    return SweepOptions(
        rounds=args.rounds,
        seconds=args.seconds,
        min_batches=args.min_batches,
        step_s=args.step_ms / 1000,
        max_seconds=args.max_seconds,
        budget=budget,
    )


def _run(args: argparse.Namespace) -> int:
    options = _options(args)
    build, loader, can_batch = loader_builder(load_factory(args.factory)(), args.batch_size, args.torch)
    if args.torch and loader.endswith("from the factory"):
        print("conveyor tune: note: --torch is for a dataset; the factory's DataLoader class is kept", file=sys.stderr)
    if args.batch_sizes and not can_batch:
        raise TuneError("--batch-sizes needs a loader that batches by batch_size; this one has a batch_sampler")
    cores = usable_cores()
    settings = plan(args.workers or default_workers(cores), args.prefetch, args.batch_sizes or [None])
    budget = "-" if options.budget is None else f"{options.budget / _GB:.3g}"
    print(
        f"conveyor tune: {loader}\n  {cores} cores; {len(settings)} settings, each in {options.rounds} rounds of at "
        f"least {options.round_seconds:.2g} s and {options.min_batches} batches; training step {args.step_ms:g} ms; "
        f"at most {options.max_seconds:g} s and {budget} GB",
        flush=True,
    )
    started_load, began = load_average(), time.monotonic()
    results = sweep(settings, build, options, lambda n, rs: print(format_round(n, options.rounds, rs), flush=True))
    rec = recommend(results)
    judged = verdict_round(build, rec, options, time.monotonic() - began) if rec is not None else None
    loads = (started_load, load_average())
    with_batch = bool(args.batch_sizes)
    print(format_row(None, with_batch))
    for result in results:
        print(format_row(result, with_batch))
    done = min((len(r.rounds) for r in results if r.status == "measured"), default=options.rounds)
    if done < options.rounds:
        print(f"  --max-seconds {options.max_seconds:g} reached after {done} of {options.rounds} rounds")
    print(describe_choice(rec, results))
    if note := noise_note(results, loads, cores):
        print(note)
    if rec is not None:
        print(describe_bound(rec, results, args.step_ms, judged))
    if args.out is not None:
        write_outputs(args.out, args.factory, loader, options, results, rec, loads, judged)
    return 0 if rec is not None else 1
