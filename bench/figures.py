"""The figures the docs quote, each a function of its source.

``BENCH`` computes each from bench/results-latest.json (a :class:`Results`);
``REPO`` from other files of this repository (pyproject.toml's development
extras, an example's defaults). bench/docs_figures.py writes them into the
docs and checks them; a new figure in a doc starts with a new entry here.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path
from typing import Any, Callable


# ------------------------------------------------------------- formatting
def times(x: float) -> str:
    """A ratio: two decimals below 2 (1.22×), one above (4.6×)."""
    return f"{x:.2f}×" if x < 2 else f"{x:.1f}×"


def count(x: float) -> str:
    return f"{x:,.0f}"


def percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%" if fraction < 0.095 else f"{100 * fraction:.0f}%"


def seconds(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f} s"


# ------------------------------------------------------------- the results
class Results:
    """bench/results-latest.json, with the derived values the docs quote."""

    def __init__(self, data: dict):
        self.data = data
        self.work = data["workloads"]

    def rounds(self, samples: dict) -> int:
        return len(next(iter(samples.values())))

    def ranks(self) -> dict:
        """Workload i per rank: the mean over ranks of each rank's median."""
        ranks = self.data["distributed"]["ranks"]
        conveyor = statistics.mean(r["conveyor"] for r in ranks)
        torch = statistics.mean(r["torch"] for r in ranks)
        return {"conveyor": conveyor, "torch": torch, "ratio": conveyor / torch}

    def resume(self, at: str) -> dict:
        return self.data["resume"]["results"][f"resume_at_{at}pct"]

    def cpu_bound_batches_per_s(self) -> float:
        """(b)'s ceiling from its CPU per batch (stats off) on every core."""
        return self.data["machine"]["cpus"] / (self.work["h_stats_overhead_cpu_us_per_batch"]["stats_off"] * 1e-6)


def _pair(entry: dict, ours: str = "conveyor", theirs: str = "torch") -> tuple[float, float, float]:
    return entry[ours], entry[theirs], entry["ratio"]


def loaders_table(r: Results) -> str:
    """The README's table: each workload, conveyor against torch.utils.data."""
    w, shards, store, memory = r.work, r.data["shards"], r.data["store"], r.data["list_memory"]["results"]
    rate, rates = shards["samples_per_s"], store["samples_per_s"]
    i = r.ranks()
    rows = [
        (
            "(a) big batches, 64×3×224×224 uint8 made fresh, 2 workers, consumer copies every byte",
            *(f"{v:.2f} GB/s" for v in _pair(w["a_big_batches_GBps"])[:2]),
            times(w["a_big_batches_GBps"]["ratio"]),
        ),
        (
            "(b) small batches, 32 ints, 2 workers",
            *(f"{count(v)} batches/s" for v in _pair(w["b_small_batches_per_s"])[:2]),
            times(w["b_small_batches_per_s"]["ratio"]),
        ),
        (
            "(c) JPEG decode + random crop + flip (Pillow), batch 32, 2 workers",
            *(f"{count(v)} samples/s" for v in _pair(w["c_image_samples_per_s"])[:2]),
            times(w["c_image_samples_per_s"]["ratio"]),
        ),
        (
            "(d) time to the first batch under spawn, script that imports torch",
            *(seconds(v) for v in _pair(w["d_first_batch_spawn_s"])[:2]),
            times(w["d_first_batch_spawn_s"]["ratio"]),
        ),
        (
            "(e) peak resident memory of (a), main + workers (RSS summed)",
            *(f"{count(v)} MB" for v in _pair(w["e_peak_memory_MB"])[:2]),
            times(w["e_peak_memory_MB"]["ratio"]),
        ),
        (
            "(e') the same as PSS (shared pages counted once)",
            *(f"{count(v)} MB" for v in _pair(w["e_peak_memory_pss_MB"])[:2]),
            times(w["e_peak_memory_pss_MB"]["ratio"]),
        ),
        (
            "(g) torch-op augmentations (random resized crop, flip, normalize), batch 32, 2 workers",
            *(f"{count(v)} samples/s" for v in _pair(w["g_torch_aug_samples_per_s"])[:2]),
            times(w["g_torch_aug_samples_per_s"]["ratio"]),
        ),
        (
            "(i) data-parallel: 2 ranks (torchrun, gloo), 1 worker each, (b)'s batches, an all-reduce after each; "
            "per rank",
            f"{count(i['conveyor'])} batches/s",
            f"{count(i['torch'])} batches/s",
            times(i["ratio"]),
        ),
    ]
    for label, key, ours in (
        (
            "(j) samples that each wait 20 ms (a remote read), batch 32, 2 workers, `reads_in_flight=8`",
            "j_waiting_samples_per_s",
            "conveyor",
        ),
        (
            "(j') the same, one read at a time (processes only)",
            "j_waiting_processes_only_samples_per_s",
            "conveyor_processes",
        ),
        (
            "(j'') the same with 8 worker threads (`worker_method=\"thread\"`), 4 reads in flight each",
            "j_waiting_thread_workers_samples_per_s",
            "conveyor_threads",
        ),
    ):
        c, t, ratio = _pair(w[key], ours)
        rows.append((label, f"{count(c)} samples/s", f"{count(t)} samples/s", times(ratio)))
    for label, ours, theirs in (
        (
            "(k) memory growth over an epoch: 5M file names in a Python list, 2 forked workers (PSS, main + workers)",
            "conveyor_list",
            "torch_list",
        ),
        ("(k') the same names in a `conveyor.CompactList`", "conveyor_compact", "torch_compact"),
    ):
        c, t = memory[ours]["growth_MB"], memory[theirs]["growth_MB"]
        rows.append((label, f"+{count(c)} MB", f"+{count(t)} MB", times(c / t)))
    c, t, ratio = _pair(w["l_huge_sample_s"])
    rows.append(
        (
            "(l) one 2 GB sample per batch, 4 batches, 2 workers: seconds to the end",
            seconds(c, 1),
            seconds(t, 1),
            times(ratio),
        )
    )
    for label, ours in (
        (
            "(m) 20,000 files of 8 KB, cold page cache, shuffled, 2 workers: conveyor over `ShardDataset`, torch "
            "over the loose files",
            "conveyor_shards",
        ),
        ("(m') the shards streamed whole (`ShardDataset.stream()`)", "conveyor_stream"),
        ("(m'') conveyor over the same loose files", "conveyor_files"),
    ):
        rows.append(
            (
                label,
                f"{count(rate[ours])} samples/s",
                f"{count(rate['torch_files'])} samples/s",
                times(rate[ours] / rate["torch_files"]),
            )
        )
    for label, ours in (
        (
            "(n) 600 objects of 4 KB in an S3 store (moto, 20 ms a request), through s3fs: 8 worker threads × 4 reads",
            "conveyor_threads",
        ),
        ("(n') the same with 2 worker processes × 8 reads", "conveyor_processes"),
    ):
        rows.append(
            (
                label,
                f"{count(rates[ours])} samples/s",
                f"{count(rates['torch'])} samples/s",
                times(store["ratios"][ours]),
            )
        )
    for at in ("10", "90"):
        res = r.resume(at)
        torch_text = seconds(res["torch_s"]) + (" (iterate and discard)" if at == "10" else "")
        label = "resume at 10% of a 100,000-sample epoch: time to the first batch" if at == "10" else "resume at 90%"
        rows.append((label, seconds(res["conveyor_s"], 3), torch_text, f"{res['torch_over_conveyor']:.0f}× faster"))
    lines = ["| workload | conveyor | torch.utils.data | ratio |", "|---|---|---|---|"]
    lines += [f"| {' | '.join(row)} |" for row in rows]
    return "\n".join(lines)


def stats_table(r: Results) -> str:
    """The cost of stats (workload h), stats on against off."""
    rate, cpu = r.work["h_stats_overhead_small_batches_per_s"], r.work["h_stats_overhead_cpu_us_per_batch"]
    rounds = r.rounds(rate["samples"])
    return "\n".join(
        [
            "| the cost of stats (h): (b) through conveyor, `collect_stats` on | on | off | cost |",
            "|---|---|---|---|",
            f"| batches/s (median of each round's on/off, {rounds} rounds) | {count(rate['stats_on'])} | "
            f"{count(rate['stats_off'])} | {percent(rate['overhead'])} |",
            f"| CPU per batch, main process and workers together | {cpu['stats_on']:.1f} µs | {cpu['stats_off']:.1f} "
            "µs | "
            f"{percent(cpu['overhead'])} |",
        ]
    )


def threads_table(r: Results) -> str:
    """docs/threads.md: workload j against its limits."""
    w = r.work
    rows = [
        (
            "conveyor, 8 worker threads × 4 reads in flight",
            w["j_waiting_thread_workers_samples_per_s"],
            "conveyor_threads",
        ),
        ("conveyor, 2 worker processes × 8 reads in flight", w["j_waiting_samples_per_s"], "conveyor"),
        (
            "conveyor, 2 worker processes, one read at a time",
            w["j_waiting_processes_only_samples_per_s"],
            "conveyor_processes",
        ),
    ]
    lines = ["| set-up | samples/s | limit | torch (2 worker processes) |", "|---|---|---|---|"]
    lines += [f"| {label} | {count(e[key])} | {count(e['limit'])} | {count(e['torch'])} |" for label, e, key in rows]
    return "\n".join(lines)


def shards_table(r: Results) -> str:
    """docs/data.md: workload m, samples/s over loose files and shards."""
    rate = r.data["shards"]["samples_per_s"]
    base = rate["torch_files"]
    return "\n".join(
        [
            "| | samples/s |",
            "|---|---|",
            f"| torch.utils.data over the loose files | {count(base)} |",
            f"| conveyor over the loose files | {count(rate['conveyor_files'])} |",
            f"| conveyor over `ShardDataset` (random access) | {count(rate['conveyor_shards'])} "
            f"({times(rate['conveyor_shards'] / base)}) |",
            f"| conveyor over `ShardDataset.stream()` | {count(rate['conveyor_stream'])} "
            f"({times(rate['conveyor_stream'] / base)}) |",
        ]
    )


def _j(r: Results, key: str) -> dict:
    return r.work[key]


#: Every bench: figure, by name: a function of the results.
BENCH: dict[str, Callable[[Results], str]] = {
    "table.loaders": loaders_table,
    "table.stats": stats_table,
    "table.threads": threads_table,
    "table.shards": shards_table,
    "machine.cpus": lambda r: str(r.data["machine"]["cpus"]),
    "machine.python": lambda r: r.data["machine"]["python"],
    "machine.numpy": lambda r: ".".join(r.data["machine"]["numpy"].split(".")[:2]),
    "machine.torch": lambda r: r.data["machine"]["torch"],
    "machine.os": lambda r: " ".join(r.data["machine"]["platform"].split("-")[:2]).rsplit(".", 1)[0],
    "rounds": lambda r: str(r.rounds(r.work["a_big_batches_GBps"]["samples"])),
    "rounds.memory": lambda r: str(r.rounds(r.work["e_peak_memory_MB"]["samples"])),
    "rounds.n": lambda r: str(r.rounds(r.data["store"]["samples"])),
    "rounds.l": lambda r: str(r.rounds(r.work["l_huge_sample_s"]["samples"])),
    "rounds.m": lambda r: str(r.rounds(r.data["shards"]["samples"])),
    "limits.memcpy": lambda r: f"{r.data['limits']['memcpy_GBps']:.0f} GB/s",
    "limits.memcpy_previous": lambda r: f"{r.data['previous_run']['limits']['memcpy_GBps']:.0f} GB/s",
    "limits.stack_warm": lambda r: f"{r.data['limits']['stack_into_warm_buffer_GBps']:.0f} GB/s",
    "limits.stack_slot": lambda r: f"{r.data['limits']['stack_into_slot_GBps']:.0f} GB/s",
    "limits.in_process": lambda r: f"{count(r.data['limits']['in_process_small_batches_per_s'])} batches/s",
    "b.vs_in_process": lambda r: times(r.work["b_small_batches_per_s"]["fraction_of_in_process"]),
    "b.cpu_bound": lambda r: f"~{round(r.cpu_bound_batches_per_s(), -3):,.0f} batches/s",
    "c.ceiling": lambda r: f"{count(r.work['c_image_samples_per_s']['ceiling'])} samples/s",
    "c.vs_ceiling": lambda r: percent(r.work["c_image_samples_per_s"]["fraction_of_ceiling"]),
    "h.cost": lambda r: percent(r.work["h_stats_overhead_small_batches_per_s"]["overhead"]),
    "h.cpu_cost": lambda r: percent(r.work["h_stats_overhead_cpu_us_per_batch"]["overhead"]),
    "h.cpu_on": lambda r: f"{r.work['h_stats_overhead_cpu_us_per_batch']['stats_on']:.1f} µs",
    "h.cpu_off": lambda r: f"{r.work['h_stats_overhead_cpu_us_per_batch']['stats_off']:.1f} µs",
    "h.cpu_delta": lambda r: "{:.1f} µs".format(
        r.work["h_stats_overhead_cpu_us_per_batch"]["stats_on"]
        - r.work["h_stats_overhead_cpu_us_per_batch"]["stats_off"]
    ),
    "h.rounds": lambda r: str(r.rounds(r.work["h_stats_overhead_small_batches_per_s"]["samples"])),
    "i.conveyor": lambda r: count(r.ranks()["conveyor"]),
    "i.torch": lambda r: count(r.ranks()["torch"]),
    "i.ratio": lambda r: times(r.ranks()["ratio"]),
    "j.limit": lambda r: count(_j(r, "j_waiting_samples_per_s")["limit"]),
    "j.of_limit": lambda r: percent(
        _j(r, "j_waiting_samples_per_s")["conveyor"] / _j(r, "j_waiting_samples_per_s")["limit"]
    ),
    "j.threads_limit": lambda r: count(_j(r, "j_waiting_thread_workers_samples_per_s")["limit"]),
    "j.threads_of_limit": lambda r: percent(
        _j(r, "j_waiting_thread_workers_samples_per_s")["conveyor_threads"]
        / _j(r, "j_waiting_thread_workers_samples_per_s")["limit"]
    ),
    "j.one_read_limit": lambda r: count(_j(r, "j_waiting_processes_only_samples_per_s")["limit"]),
    "m.pack_s": lambda r: f"{r.data['shards']['pack_s']:.0f} s",
    "m.check_us": lambda r: f"{r.data['shards']['checks']['check_us_per_member']:.1f} µs",
    "m.raw_us": lambda r: f"{r.data['shards']['checks']['raw_us_per_sample']:.1f} µs",
    "m.raw_unchecked_us": lambda r: f"{r.data['shards']['checks']['raw_unchecked_us_per_sample']:.1f} µs",
    "m.check_share": lambda r: percent(
        (r.data["shards"]["checks"]["raw_us_per_sample"] - r.data["shards"]["checks"]["raw_unchecked_us_per_sample"])
        / (1e6 * r.data["machine"]["cpus"] / r.data["shards"]["samples_per_s"]["conveyor_shards"])
    ),
    "n.threads": lambda r: count(r.data["store"]["samples_per_s"]["conveyor_threads"]),
    "n.processes": lambda r: count(r.data["store"]["samples_per_s"]["conveyor_processes"]),
    "n.torch": lambda r: count(r.data["store"]["samples_per_s"]["torch"]),
    "n.threads_ratio": lambda r: times(r.data["store"]["ratios"]["conveyor_threads"]),
    "n.processes_ratio": lambda r: times(r.data["store"]["ratios"]["conveyor_processes"]),
    "f.torchdata_10": lambda r: seconds(r.resume("10")["torchdata_s"], 3),
    "f.torchdata_90": lambda r: seconds(r.resume("90")["torchdata_s"], 3),
    "f.fresh": lambda r: seconds(r.resume("10")["fresh_s"], 3),
    "f.conveyor_90": lambda r: seconds(r.resume("90")["conveyor_s"], 3),
    "f.fresh_90": lambda r: seconds(r.resume("90")["fresh_s"], 3),
}


# ------------------------------------------------------------- the repository
def dev_extras(root: Path) -> str:
    """pyproject.toml's development extras, as the README lists them."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(root / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
    return ", ".join(f"`{requirement}`" for requirement in extras)


def argument_default(script: Path, option: str) -> Any:
    """The default of ``parser.add_argument(option, ..., default=...)`` in ``script``, read without running it."""
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            if any(isinstance(a, ast.Constant) and a.value == option for a in node.args):
                for keyword in node.keywords:
                    if keyword.arg == "default":
                        return ast.literal_eval(keyword.value)
    raise LookupError(f"{script}: no {option} with a default")


def _ms(value: float) -> str:
    return f"{value:g} ms"


#: Every repo: figure, by name: a function of the repository's root.
REPO: dict[str, Callable[[Path], str]] = {
    "dev-extras": dev_extras,
    "images.step-ms": lambda root: _ms(argument_default(root / "examples" / "images.py", "--step-ms")),
    "images.workers": lambda root: str(argument_default(root / "examples" / "images.py", "--workers")),
}
