"""How ``conveyor tune`` picks a setting from its measurements, and keeps its advice in line with the pick.

    every setting's rounds ──noise()──▶ tolerance() ──ties()──▶ the settings as fast as the fastest
                                                              ──recommend()──▶ the leanest of them
    the verdict on the recommended setting ──advise()──▶ advice that never asks for a setting the
                                                         sweep measured and did not recommend

Settings are compared by their best round. Other programs on the machine can only slow a round
down, never speed it up, so a setting's fastest round is the nearest to what it can do; the
rounds take turns, so each setting has its chances at the machine's quieter moments. (The
median, what the machine gave during the sweep, is reported beside it.) The noise is how far
that best stands above the setting's next round: how much one lucky round could have lifted it.

Pure functions of the numbers: the tests feed them made-up measurements.
"""

from __future__ import annotations

import statistics
from typing import Optional

from ..stats.verdict import MIN_BATCHES, MIN_STEADY_S
from .tune_measure import Result, Round

#: Settings whose best rates differ by less than this share always tie, however quiet the
#: machine: a round begins with about one batch per extra worker already loaded, which lifts
#: the rates of more workers by a few percent; and a smaller gain is not worth a worker's memory.
NEAR_BEST = 0.10


def measured(results: list[Result]) -> list[Result]:
    """The settings that were measured and fit the memory budget."""
    return [r for r in results if r.status == "measured" and r.samples_per_s]


def rate_range(r: Result) -> tuple[float, float]:
    """(slowest, fastest) round's samples/s of a measured setting (one with rounds, as measured() keeps)."""
    if r.rate_range is None:
        raise ValueError(f"{r.label()} has no rounds")
    return r.rate_range


def best_rate(r: Result) -> float:
    """The best round's samples/s of a measured setting: settings are compared by it."""
    return rate_range(r)[1]


def median_wait(r: Result) -> float:
    """The data wait at the median round of a measured setting."""
    if r.data_wait_fraction is None:
        raise ValueError(f"{r.label()} has no rounds")
    return r.data_wait_fraction


def noise(results: list[Result]) -> float:
    """How far a setting's best round typically stands above its next best: the median, over the
    settings measured in at least two rounds, of (best - second best) / best; 0 without such a setting.

    >>> from conveyor.cli.tune_measure import Round
    >>> def setting(workers, *rates):
    ...     return Result(workers, 2, None, rounds=tuple(Round(rate) for rate in rates))
    >>> noise([setting(1, 50, 90, 100), setting(2, 150, 200, 200), setting(3, 100, 180, 200)])
    0.1
    """
    gaps = []
    for r in measured(results):
        if len(r.rounds) >= 2:
            *_, second, best = sorted(x.samples_per_s for x in r.rounds)
            gaps.append((best - second) / best)
    return statistics.median(gaps) if gaps else 0.0


def tolerance(results: list[Result]) -> float:
    """The share of the fastest best rate within which settings tie: the noise, and at least NEAR_BEST."""
    return max(NEAR_BEST, noise(results))


def tie_rule(results: list[Result]) -> str:
    """The tie rule in force, in words, e.g. "settings within 12% of the fastest tie (the noise)"."""
    tol = tolerance(results)
    why = "the noise" if tol > NEAR_BEST else f"{NEAR_BEST:.0%} at least, more than the noise"
    return f"settings whose best round is within {tol:.0%} of the fastest tie ({why})"


def ties(results: list[Result]) -> list[Result]:
    """The measured settings whose best rate is within :func:`tolerance` of the fastest one's, fastest first."""
    candidates = sorted(measured(results), key=lambda r: -best_rate(r))
    if not candidates:
        return []
    floor = (1 - tolerance(results)) * best_rate(candidates[0])
    return [r for r in candidates if best_rate(r) >= floor]


def leanness(r: Result) -> tuple:
    """What a tie is decided by: fewer workers, then a smaller prefetch, then a smaller batch, then less memory."""
    return (r.workers, r.prefetch or 0, r.batch_size or 0, r.peak_memory_mb or 0.0)


def recommend(results: list[Result]) -> Optional[Result]:
    """The leanest of the settings that tie with the fastest (None when nothing was measured)."""
    tied = ties(results)
    return min(tied, key=leanness) if tied else None


# ------------------------------------------------------------------ advice
def contradicted(rec: Result, results: list[Result], asked_workers: Optional[int], prefetch: bool) -> list[Result]:
    """The measured settings that advice on ``rec`` asks for although the sweep did not recommend them:
    another worker count it names (``asked_workers``); when it tells to raise prefetch_factor, a larger
    prefetch at rec's worker count (or, with no workers, any setting with workers: only they prefetch)."""
    same_batch = [r for r in measured(results) if r.batch_size == rec.batch_size and r is not rec]
    asked = {asked_workers} - {rec.workers, None}
    if prefetch:
        return [r for r in same_batch if r.workers in asked or _more_in_flight(r, rec)]
    return [r for r in same_batch if r.workers in asked]


def _more_in_flight(r: Result, rec: Result) -> bool:
    """Whether ``r`` is ``rec`` with a larger prefetch (with workers where rec has none)."""
    if not rec.workers:
        return r.workers > 0
    return r.workers == rec.workers and (r.prefetch or 0) > (rec.prefetch or 0)


def _setting_words(r: Result) -> str:
    """A setting in words ("2 workers, prefetch 4"), not as the arguments that advice names."""
    text = f"{r.workers} worker{'s' * (r.workers != 1)}" + (f", prefetch {r.prefetch}" if r.workers else "")
    return text + (f", batch {r.batch_size}" if r.batch_size is not None else "")


def advise(rec: Result, results: list[Result], judged: Optional[Round] = None) -> str:
    """The verdict's advice on ``rec`` (on ``judged``, a round long enough for one, else on its median
    round), unless it asks for settings the sweep measured and did not recommend: then what the
    sweep found for each of them instead."""
    judged_round = judged or rec.median_round  # the round whose verdict speaks
    if judged_round is not None and judged_round.bound == "unknown":
        return (
            f"none: no round of this setting was long enough for the stats to judge (a verdict needs "
            f"{MIN_BATCHES} batches and {MIN_STEADY_S:g} s once running); raise --max-seconds or --seconds"
        )
    advice = judged_round.advice if judged_round else ""
    asked_workers = judged_round.advised_workers if judged_round else None
    prefetch = judged_round.advises_prefetch if judged_round else False
    against = contradicted(rec, results, asked_workers, prefetch)
    tried = {r.workers for r in measured(results)}
    if not against:  # what it asks for, if anything, the sweep never tried: not a contradiction
        if asked_workers is not None and asked_workers not in tried:
            counts = ",".join(map(str, sorted(tried | {asked_workers})))
            advice += f" (not measured here: conveyor tune ... --workers {counts} to compare)"
        elif prefetch and rec.workers:
            advice += " (not measured here: add larger values to conveyor tune's --prefetch to compare)"
        return advice
    tied = ties(results)

    def rates(r: Result) -> str:
        low, high = rate_range(r)
        return f"best round {high:,.0f} samples/s, median {r.samples_per_s:,.0f}, slowest {low:,.0f}"

    def finding(r: Result) -> str:
        how = "as fast within the noise" if r in tied else "slower than the fastest beyond the noise"
        return f"{_setting_words(r)}: {rates(r)}, {how}"

    fastest_two = sorted(against, key=lambda r: -best_rate(r))[:2]  # evidence enough
    text = (
        "the stats of this setting alone suggest another, but the sweep measured it: "
        + "; ".join(map(finding, fastest_two))
        + f" (this one: {rates(rec)})"
    )
    stage = judged_round.slowest_stage if judged_round is not None else None
    if any(r in tied for r in against) and judged_round is not None and stage is not None:
        text += (
            f". More workers or batches in flight did not measurably help: the time goes to {stage} "
            f"({judged_round.slowest_share:.0%} of loading time); make it cheaper, or check what else uses the cores"
        )
    return text
