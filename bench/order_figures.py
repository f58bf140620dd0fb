"""The figures docs/scale.md quotes from bench/results-scale-order.json
(bench/scale_order.py), each a function of that file's data;
bench/docs_figures.py writes them between ``order:`` markers."""

from __future__ import annotations

from typing import Callable, Optional

#: Rows of the table: subject in the JSON -> its label.
LABELS = {
    "conveyor_computed": 'conveyor `RandomSampler`, `order="computed"`',
    "conveyor_stored": 'conveyor `RandomSampler`, `order="stored"`',
    "conveyor_distributed_computed": 'conveyor `DistributedSampler`, `order="computed"`',
    "conveyor_distributed_stored": 'conveyor `DistributedSampler`, `order="stored"`',
    "torch_random": "torch `RandomSampler`",
    "torch_distributed": "torch `DistributedSampler`",
    "grain_index_shuffle": "Grain `index_shuffle`",
    "streaming_py1e": "Streaming `get_shuffle_py1e`",
}

#: The sizes as the docs write them.
SIZES = {"1000000": "10**6", "100000000": "10**8", "10000000000": "10**10"}


def _mb(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value:.1f} MB" if value < 100 else f"{value:,.0f} MB"


def _s(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.1f} s"


def _rate(value: Optional[float]) -> str:
    if value is None:
        return "–"
    return f"{value / 1e6:.2f} M/s" if value >= 1e6 else f"{value / 1e3:.0f} k/s"


def _bytes(value: Optional[int]) -> str:
    return "–" if value is None else f"{value} B"


def table(data: dict) -> str:
    """Per size and subject: memory added, first batch, resume at 90%, state, indices/s."""
    rows = [
        "| n | sampler | memory added | first batch (2 workers) | resume at 90% | state (JSON) | indices/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, label in SIZES.items():
        for subject, name in LABELS.items():
            entry = data["results"].get(subject, {}).get(size)
            if entry is None:
                if size in data["skipped"].get(subject, {}):
                    rows.append(f"| {label} | {name} | skipped: {data['skipped'][subject][size]} | | | | |")
                continue
            if "error" in entry:
                rows.append(f"| {label} | {name} | failed: {entry['error']} | | | | |")
                continue
            first = entry.get("first_batch_s")
            rows.append(
                f"| {label} | {name} | {_mb(entry['memory_mb'])} | {_s(first) if first is not None else '–'} | "
                f"{_s(entry.get('resume_s'))} | {_bytes(entry.get('loader_state_bytes'))} | "
                f"{_rate(entry['indices_per_s'])} |"
            )
    return "\n".join(rows)


def _at(data: dict, subject: str, size: str, key: str) -> float:
    return data["results"][subject][size][key]


def setup(data: dict) -> str:
    machine = data["machine"]
    load = machine.get("load_average")
    busy = f", load average {load[0]} before and {load[1]} after" if load else ""
    return (
        f"{machine['cpus']} cores, {machine['memory_gib']} GiB, Python {machine['python']}, "
        f"numpy {machine['numpy']}, torch {machine['torch']}; one run of {data['run_s']:.0f} s{busy}"
    )


ORDER: dict[str, Callable[[dict], str]] = {
    "table": table,
    "setup": setup,
    "memory-1e10": lambda d: _mb(_at(d, "conveyor_computed", "10000000000", "memory_mb")),
    "first-batch-1e10": lambda d: _s(_at(d, "conveyor_computed", "10000000000", "first_batch_s")),
    "resume-1e10": lambda d: _s(_at(d, "conveyor_computed", "10000000000", "resume_s")),
    "state-1e10": lambda d: _bytes(_at(d, "conveyor_computed", "10000000000", "loader_state_bytes")),
    "rate-1e10": lambda d: _rate(_at(d, "conveyor_computed", "10000000000", "indices_per_s")),
    "block-rate-1e10": lambda d: _rate(_at(d, "conveyor_computed", "10000000000", "block_indices_per_s")),
    "vs-grain-1e10": lambda d: f"{d['ratios']['10000000000']['grain_index_shuffle']['indices_per_s']:.0f}×",
    "stored-memory-1e8": lambda d: _mb(_at(d, "conveyor_stored", "100000000", "memory_mb")),
    "stored-first-1e8": lambda d: _s(_at(d, "conveyor_stored", "100000000", "first_indices_s")),
}
