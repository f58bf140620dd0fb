"""The verdict on a loader's stats: input- or compute-bound, the slowest
stage, and the change most likely to help, with the number that shows why.

    LoaderFigures ──judge()──▶ Verdict(bound, slowest stage, its share, advice)

The rules, in order (each names its evidence):

1. No batches yet, or too few to judge (under ``MIN_BATCHES`` batches or
   ``MIN_STEADY_S`` seconds once running): say so, and nothing else.
2. Once running (start-up, the wait for each pass's first batch, left
   out), the loop waited for data less than ``INPUT_BOUND_WAIT`` of the
   time: compute-bound; a faster loader would not speed the run up (and
   idle workers could be fewer).
3. Otherwise input-bound, and the advice follows the evidence:
   no workers → use workers; a main-process stage is the slowest (sampler,
   transport, pin) → fix that stage; Ray workers (other machines' cores)
   saturated or short of cores → add CPU nodes, a core per actor; loading
   waits for a free core → name
   who takes the cores (other processes, this job, or a CPU quota when
   cores sit idle) and what would help;
   loading mostly waits on something else (storage, network) → more
   workers than cores (threads), concurrent reads, packed shards; workers
   saturated → more workers if cores are free, else make the slowest stage
   cheaper; workers idle while the loop waits → more batches in flight.

Waiting for a free core names who takes the cores: other processes on the
machine (``cores_others_fraction``) or this job itself. Advice names torch
settings only when torch is imported in this process.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import NamedTuple, Optional

from .._engine.cpu import usable_cores
from .figures import LOADING_STAGES, NOT_MEASURED, LoaderFigures, share_of

#: Fewer batches than this, or fewer seconds once running, are too little to
#: judge: start-up and the first batches' jitter would decide the verdict.
MIN_BATCHES = 20
MIN_STEADY_S = 0.5
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
#: Other processes using at least this share of the usable cores take them
#: from the loader (cores_others_fraction).
OTHERS_TAKE_CORES = 0.25
#: Cores idle at least this share of the time while the loaders waited for
#: one point at a limit other than busy cores (a CPU quota).
IDLE_WHILE_WAITING = 0.25
#: Workers busy less than this share of the time in a compute-bound run are more than needed.
IDLE_BUSY = 0.30
#: Start-up taking at least this share of wall time is worth a remark of its own.
STARTUP_SHARE = 0.20


class Advice(NamedTuple):
    """Advice in words and the settings the words name (see Verdict)."""

    text: str
    workers: Optional[int] = None
    prefetch: bool = False


@dataclass(frozen=True)
class Verdict:
    """What the stats say, in words a person can act on."""

    #: "input", "compute", or "unknown" (no batches yet, or too few to judge).
    bound: str
    #: The share of time the loop waited for data once running (``LoaderStats.steady_wait_fraction``).
    data_wait_fraction: float
    #: The loading stage with the most time, and its share of the loading time.
    slowest_stage: Optional[str]
    slowest_share: float
    advice: str
    #: Why there is no verdict ("unknown" only): no batches, or too little to judge.
    reason: str = ""
    #: The settings the advice names, for tools that act on it (conveyor tune), so
    #: that none parses the words: the num_workers it tells the user to set, and
    #: whether it tells them to raise prefetch_factor.
    advised_workers: Optional[int] = None
    advises_prefetch: bool = False

    def __str__(self) -> str:
        if self.bound == "unknown":
            return f"verdict: {self.reason}\nadvice: {self.advice}"
        waited = self.data_wait_fraction
        head = f"verdict: {self.bound}-bound: the loop waited for data {waited:.0%} of the time once running"
        if self.slowest_stage is not None:
            head += f"; slowest stage: {self.slowest_stage} ({self.slowest_share:.0%} of loading time)"
        return f"{head}\nadvice: {self.advice}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def judge(stats: LoaderFigures, cores: Optional[int] = None) -> Verdict:
    """The verdict on ``stats`` for a machine with ``cores`` usable cores (default: this one's)."""
    cores = cores or usable_cores()
    wait = stats.steady_wait_fraction
    if stats.batches == 0 or stats.wall_s <= 0:
        return Verdict("unknown", wait, None, 0.0, "iterate first", reason="no batches yet")
    steady_s = stats.wall_s - stats.startup_s
    if stats.batches < MIN_BATCHES or steady_s < MIN_STEADY_S:
        return Verdict(
            "unknown",
            wait,
            None,
            0.0,
            f"iterate longer and ask again: a verdict needs {MIN_BATCHES} batches and {MIN_STEADY_S} s once "
            f"running (after each pass's first batch)",
            reason=f"too little to judge: {stats.batches} batch{'es' if stats.batches != 1 else ''} in "
            f"{stats.wall_s:.3f} s, {max(0.0, steady_s):.3f} s of it after the first batch",
        )
    busiest = max(LOADING_STAGES, key=lambda name: stats.stages[name].total_s)
    slowest: Optional[str] = busiest
    share = stats.stage_share(busiest)
    if stats.stages[busiest].total_s <= 0:
        slowest, share = None, 0.0
    if wait < INPUT_BOUND_WAIT:
        bound, told = "compute", _compute_bound_advice(stats, wait)
    else:
        bound, told = "input", _input_bound_advice(stats, slowest, share, cores)
    advice = told.text
    startup = share_of(stats.startup_s, stats.wall_s) or 0.0
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
    return Verdict(bound, wait, slowest, share, advice, advised_workers=told.workers, advises_prefetch=told.prefetch)


def _compute_bound_advice(stats: LoaderFigures, wait: float) -> Advice:
    advice = (
        f"the loader keeps up (the loop waited only {wait:.0%} of the time), so a faster loader would gain at most "
        f"{wait:.0%}; speed up the training step instead"
    )
    busy = stats.workers_busy_fraction
    if stats.num_workers > 1 and busy is not None and busy < IDLE_BUSY:
        fewer = max(1, round(stats.num_workers * busy / SATURATED_BUSY + 0.5))
        advice += f"; the workers are busy only {busy:.0%} of the time, so num_workers={fewer} would do (less memory)"
        return Advice(advice, workers=fewer)
    return Advice(advice)


def _input_bound_advice(stats: LoaderFigures, slowest: Optional[str], share: float, cores: int) -> Advice:
    busy = stats.workers_busy_fraction or 0.0
    cpu = stats.loading_cpu_fraction
    workers = stats.num_workers
    p50 = _ms(stats.stages[slowest].p50_s) if slowest else "?"
    if workers == 0:
        return Advice(
            f"load in worker processes: DataLoader(num_workers={min(cores, 8)}); the main process spent {busy:.0%} of "
            f"wall time loading ({slowest} {p50} per batch at the median) while the loop waited",
            workers=min(cores, 8),
        )
    if slowest == "sampler":
        return Advice(
            f"the sampler takes {share:.0%} of loading time ({p50} per batch, in the main process): precompute its "
            f"indices or use a cheaper sampler"
        )
    if slowest == "transport":
        return Advice(
            f"moving batches between processes takes {share:.0%} of loading time ({p50} per batch): send smaller "
            f"dtypes (uint8 images, normalised on the accelerator), fewer and larger arrays, and keep conveyor's "
            f"default_collate, which writes straight into shared memory"
        )
    if slowest == "pin":
        return Advice(
            f"pinning takes {share:.0%} of loading time ({p50} per batch): pin fewer, larger tensors, or turn "
            f"pin_memory off when not training on an accelerator"
        )
    cpu_wait = stats.loading_cpu_wait_fraction
    if stats.worker_method == "ray" and (busy >= SATURATED_BUSY or (cpu_wait or 0.0) >= CONTENDED_CPU):
        return Advice(_ray_advice(stats, busy, cpu_wait, slowest, share, p50))
    if cpu_wait is not None and cpu_wait >= CONTENDED_CPU:
        return _contended_advice(stats, cpu_wait, slowest, p50, cores)
    off_cpu = stats.loading_off_cpu_fraction if cpu_wait is not None else (None if cpu is None else 1.0 - cpu)
    if off_cpu is not None and off_cpu >= WAITING_OFF_CPU:
        what = "on storage, the network, a lock or a sleep"
        if cpu_wait is None:
            what += f"; waiting for a free core is {NOT_MEASURED}, so part of it may be that"
        return Advice(
            f"loading mostly waits (on a CPU only {cpu:.0%} of its time, waiting {off_cpu:.0%} {what}): more "
            f"workers than cores help here, and worker threads cost no memory or start-up, e.g. "
            f'num_workers={max(16, 2 * workers)}, worker_method="thread"; also read each batch\'s samples '
            f"concurrently (reads_in_flight=8), or pack small files into shards (conveyor pack, docs/data.md)",
            workers=max(16, 2 * workers),
        )
    if busy >= SATURATED_BUSY:
        if workers < cores:
            advice = (
                f"more workers: num_workers={cores} (the {workers} workers are busy {busy:.0%}; this machine has "
                f"{cores} cores)"
            )
            others = stats.cores_others_fraction
            if others is not None and others >= OTHERS_TAKE_CORES:
                advice += f"; but other processes on this machine use {others:.0%} of its cores, so expect less"
            return Advice(advice, workers=cores)
        what = {
            "fetch": "make __getitem__ cheaper: faster decoding (for JPEG images with a random resized crop, "
            "conveyor.images decodes only the crop box, straight into the batch: docs/images.md gives its measured "
            "gain; a faster JPEG decoder, decoding at a lower resolution, conveyor pack --max-side for large photos), "
            "a packed record format instead of many small files, or augmentations on the accelerator",
            "collate": "make collate cheaper: keep conveyor's default_collate (it writes into shared memory) and "
            "return numpy arrays from __getitem__, not lists",
        }.get(slowest or "", "make the slowest stage cheaper")
        advice = (
            f"the {workers} workers are busy {busy:.0%} on {cores} cores, so more workers will not help; "
            f"{slowest} takes {share:.0%} of loading time ({p50} per batch): {what}"
        )
        stage = stats.stages[slowest] if slowest else None
        if stage is not None and stage.p50_s > 0 and stage.p99_s > 10 * stage.p50_s:
            advice += (
                f"; a few batches are much slower (p99 {_ms(stage.p99_s)} against p50 {p50}): look for slow samples"
            )
        return Advice(advice)
    return Advice(
        f"the workers are busy only {busy:.0%} of the time while the loop waits {stats.steady_wait_fraction:.0%}: keep "
        f"more batches in flight (raise prefetch_factor), and check that the main process is not the bottleneck "
        f"(its stages: sampler, transport, queue, pin)",
        prefetch=True,
    )


def _ray_advice(
    stats: LoaderFigures, busy: float, cpu_wait: Optional[float], slowest: Optional[str], share: float, p50: str
) -> str:
    """Ray workers, saturated or short of cores on their nodes: this machine's cores are not theirs
    (with workers on more than one node, the busiest node is named)."""
    workers = stats.num_workers
    busy_text = f"{busy:.0%}"
    busiest = max(stats.nodes, key=lambda node: node.busy_fraction, default=None)
    if busiest is not None and len(stats.nodes) > 1:
        busy_text += f" (the busiest node, {busiest.node}, {busiest.busy_fraction:.0%})"
    if cpu_wait is not None and cpu_wait >= CONTENDED_CPU:
        return (
            f"the {workers} Ray workers wait for a free core on their nodes {cpu_wait:.0%} of their loading time "
            f"({slowest} {p50} per batch at the median): give each actor a core of its own "
            f"(RayWorkers(num_cpus=1), the default) on nodes with cores to spare, or add CPU nodes to the cluster"
        )
    return (
        f"the {workers} Ray workers are busy {busy_text}: add CPU nodes to the cluster and raise num_workers to match "
        f"(each worker is one actor; docs/scale-out.md models how many nodes feed this loop), or make {slowest} "
        f"cheaper ({share:.0%} of loading time, {p50} per batch)"
    )


def _contended_advice(stats: LoaderFigures, cpu_wait: float, slowest: Optional[str], p50: str, cores: int) -> Advice:
    """Loading waits for a free core: name who takes the cores, from what the machine reports."""
    waited = f"the loaders waited for a free core {cpu_wait:.0%} of their loading time"
    cheaper = f"make {slowest} cheaper ({p50} per batch)"
    others, job = stats.cores_others_fraction, stats.cores_job_fraction
    if others is None or job is None:
        return Advice(
            f"{waited}: all {cores} cores are taken (by which processes is {NOT_MEASURED}), so more workers will "
            f"not help; {cheaper}, or free the cores"
        )
    used = (
        f"while the loader ran, other processes used {others:.0%} of the {stats.cores} usable cores and this job "
        f"{job:.0%}"
    )
    idle = stats.cores_idle_fraction or 0.0
    if idle >= IDLE_WHILE_WAITING and others < OTHERS_TAKE_CORES:
        return Advice(
            f"{waited}, yet the {stats.cores} usable cores were idle {idle:.0%} of the time ({used}): something "
            f"other than busy cores holds the loaders back, most likely a CPU quota (a container's or cgroup's "
            f"limit: /sys/fs/cgroup/cpu.max); fewer workers, or a larger quota"
        )
    if others >= OTHERS_TAKE_CORES:
        return Advice(
            f"other processes on this machine take the cores: {waited}; {used}. More workers will not help: run "
            f"where the cores are free, or stop, pause or renice the other processes; or {cheaper}"
        )
    lighter = "give the training process fewer threads" + (" (torch.set_num_threads)" if torch_in_use() else "")
    fewer = None
    if stats.num_workers >= cores:
        fewer = max(1, cores - 1)
        lighter = f"use fewer workers (num_workers={fewer}: the training loop needs a core too), or {lighter}"
    return Advice(
        f"this job takes the cores: {waited}; {used}. More workers will not help; {cheaper}, or {lighter}",
        workers=fewer,
    )


def torch_in_use() -> bool:
    """Whether torch is imported in this process (only then is torch advice any use)."""
    return "torch" in sys.modules
