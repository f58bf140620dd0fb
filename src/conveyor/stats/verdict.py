"""The verdict on a loader's stats: input- or compute-bound, the slowest
stage, and the change most likely to help, with the number that shows why.

    LoaderStats ──judge()──▶ Verdict(bound, slowest stage, its share, advice)

The rules, in order (each names its evidence):

1. No batches yet: nothing to say.
2. Once running (start-up, the wait for each pass's first batch, left
   out), the loop waited for data less than ``INPUT_BOUND_WAIT`` of the
   time: compute-bound; a faster loader would not speed the run up (and
   idle workers could be fewer).
3. Otherwise input-bound, and the advice follows the evidence:
   no workers → use workers; a main-process stage is the slowest (sampler,
   transport, pin) → fix that stage; loading waits for a free core → the
   cores are taken, make loading cheaper or the training process lighter;
   loading mostly waits on something else (storage, network) → more
   workers than cores (threads), concurrent reads, packed shards; workers
   saturated → more workers if cores are free, else make the slowest stage
   cheaper; workers idle while the loop waits → more batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from .._engine.cpu import usable_cores
from .report import LOADING_STAGES

if TYPE_CHECKING:
    from .report import LoaderStats

#: The loop waiting for data at least this share of wall time is input-bound.
INPUT_BOUND_WAIT = 0.10
#: Workers busy at least this share of their time have no room left.
SATURATED_BUSY = 0.80
#: Loading that waits on something other than a core (storage, network,
#: a lock) at least this share of its time is waiting, not computing.
WAITING_OFF_CPU = 0.50
#: Loading that waits for a free core at least this share of its time
#: runs on a machine whose cores are all taken.
CONTENDED_CPU = 0.25
#: Workers busy less than this share of the time in a compute-bound run are more than needed.
IDLE_BUSY = 0.30
#: Start-up taking at least this share of wall time is worth a remark of its own.
STARTUP_SHARE = 0.20


@dataclass(frozen=True)
class Verdict:
    """What the stats say, in words a person can act on."""

    #: "input", "compute", or "unknown" (no batches yet).
    bound: str
    #: The share of time the loop waited for data once running (``LoaderStats.steady_wait_fraction``).
    data_wait_fraction: float
    #: The loading stage with the most time, and its share of the loading time.
    slowest_stage: Optional[str]
    slowest_share: float
    advice: str

    def __str__(self) -> str:
        if self.bound == "unknown":
            return f"verdict: {self.advice}"
        head = f"verdict: {self.bound}-bound: the loop waited for data {self.data_wait_fraction:.0%} of the time once running"
        if self.slowest_stage is not None:
            head += f"; slowest stage: {self.slowest_stage} ({self.slowest_share:.0%} of loading time)"
        return f"{head}\nadvice: {self.advice}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def judge(stats: "LoaderStats", cores: Optional[int] = None) -> Verdict:
    """The verdict on ``stats`` for a machine with ``cores`` usable cores (default: this one's)."""
    cores = cores or usable_cores()
    wait = stats.steady_wait_fraction
    if stats.batches == 0 or stats.wall_s <= 0:
        return Verdict("unknown", wait, None, 0.0, "no batches yet; iterate first")
    slowest = max(LOADING_STAGES, key=lambda name: stats.stages[name].total_s)
    share = stats.stage_share(slowest)
    if stats.stages[slowest].total_s <= 0:
        slowest, share = None, 0.0
    if wait < INPUT_BOUND_WAIT:
        bound, advice = "compute", _compute_bound_advice(stats, wait)
    else:
        bound, advice = "input", _input_bound_advice(stats, slowest, share, cores)
    startup = stats.startup_s / stats.wall_s
    if startup >= STARTUP_SHARE:
        advice += f". Start-up (iter() to each pass's first batch) took {startup:.0%} of wall time"
        if stats.worker_start_s is not None:
            advice += f" (the workers were ready after {stats.worker_start_s:.2f} s)"
        if stats.passes > 1 and stats.num_workers > 0 and stats.worker_starts >= stats.passes:
            advice += ": keep the workers between passes (persistent_workers=True)"
        elif stats.passes > 1:
            advice += ": each pass begins with no batch loaded, and the loop waits for the first ones"
        else:
            advice += "; a longer run spreads it out"
    return Verdict(bound, wait, slowest, share, advice)


def _compute_bound_advice(stats: "LoaderStats", wait: float) -> str:
    advice = (
        f"the loader keeps up (the loop waited only {wait:.0%} of the time), so a faster loader would gain at most "
        f"{wait:.0%}; speed up the training step instead"
    )
    busy = stats.workers_busy_fraction
    if stats.num_workers > 1 and busy is not None and busy < IDLE_BUSY:
        fewer = max(1, round(stats.num_workers * busy / SATURATED_BUSY + 0.5))
        advice += f"; the workers are busy only {busy:.0%} of the time, so num_workers={fewer} would do (less memory)"
    return advice


def _input_bound_advice(stats: "LoaderStats", slowest: Optional[str], share: float, cores: int) -> str:
    busy = stats.workers_busy_fraction or 0.0
    cpu = stats.loading_cpu_fraction
    workers = stats.num_workers
    p50 = _ms(stats.stages[slowest].p50_s) if slowest else "?"
    if workers == 0:
        return (
            f"load in worker processes: DataLoader(num_workers={min(cores, 8)}); the main process spent {busy:.0%} of "
            f"wall time loading ({slowest} {p50} per batch at the median) while the loop waited"
        )
    if slowest == "sampler":
        return (
            f"the sampler takes {share:.0%} of loading time ({p50} per batch, in the main process): precompute its "
            f"indices or use a cheaper sampler"
        )
    if slowest == "transport":
        return (
            f"moving batches between processes takes {share:.0%} of loading time ({p50} per batch): send smaller "
            f"dtypes (uint8 images, normalised on the accelerator), fewer and larger arrays, and keep conveyor's "
            f"default_collate, which writes straight into shared memory"
        )
    if slowest == "pin":
        return (
            f"pinning takes {share:.0%} of loading time ({p50} per batch): pin fewer, larger tensors, or turn "
            f"pin_memory off when not training on an accelerator"
        )
    cpu_wait = stats.loading_cpu_wait_fraction or 0.0
    if cpu_wait >= CONTENDED_CPU:
        return (
            f"the loaders waited for a free core {cpu_wait:.0%} of their loading time: all {cores} cores are taken "
            f"(the workers and the training process beside them), so more workers will not help; make {slowest} "
            f"cheaper ({p50} per batch), or give the training process fewer threads (torch.set_num_threads)"
        )
    if cpu is not None and 1.0 - cpu - cpu_wait >= WAITING_OFF_CPU:
        return (
            f"loading mostly waits (on a CPU only {cpu:.0%} of its time, the rest on storage, the network, a lock "
            f"or a sleep): more workers than cores help here, and worker threads cost no memory or start-up, e.g. "
            f"num_workers={max(16, 2 * workers)}, worker_method=\"thread\"; also read each batch's samples "
            f"concurrently (reads_in_flight=8), or pack small files into shards (conveyor pack, docs/data.md)"
        )
    if busy >= SATURATED_BUSY:
        if workers < cores:
            return f"more workers: num_workers={cores} (the {workers} workers are busy {busy:.0%}; this machine has {cores} cores)"
        what = {
            "fetch": "make __getitem__ cheaper: faster decoding (a faster JPEG decoder, decoding at a lower "
            "resolution), a packed record format instead of many small files, or augmentations on the accelerator",
            "collate": "make collate cheaper: keep conveyor's default_collate (it writes into shared memory) and "
            "return numpy arrays from __getitem__, not lists",
        }.get(slowest or "", "make the slowest stage cheaper")
        advice = (
            f"the {workers} workers are busy {busy:.0%} on {cores} cores, so more workers will not help; "
            f"{slowest} takes {share:.0%} of loading time ({p50} per batch): {what}"
        )
        stage = stats.stages[slowest] if slowest else None
        if stage is not None and stage.p50_s > 0 and stage.p99_s > 10 * stage.p50_s:
            advice += f"; a few batches are much slower (p99 {_ms(stage.p99_s)} against p50 {p50}): look for slow samples"
        return advice
    return (
        f"the workers are busy only {busy:.0%} of the time while the loop waits {stats.steady_wait_fraction:.0%}: keep "
        f"more batches in flight (raise prefetch_factor), and check that the main process is not the bottleneck "
        f"(its stages: sampler, transport, queue, pin)"
    )
