"""The figures docs/scale.md quotes from bench/results-mix.json
(bench/mix.py), each a function of that file's data; bench/docs_figures.py
writes them between ``mix:`` markers."""

from __future__ import annotations

from typing import Callable


def _rate(value: float) -> str:
    return f"{value / 1000:.0f}k"


def _peer(row: dict, name: str) -> str:
    rate = row.get(f"{name}_samples_per_s")
    if rate is None:
        return "not run"
    return f"{_rate(rate)} ({row[f'ratio_conveyor_over_{name}']:.2f}x)"


def rates_table(data: dict) -> str:
    """Samples/s per library for tiny and 4 KiB samples; in brackets conveyor's in-order mix over the peer."""
    rows = [
        "| samples | conveyor.Mix, shuffled sources | conveyor.Mix, sources in order | Grain MapDataset.mix | "
        "HF interleave_datasets | litdata CombinedStreamingDataset |",
        "|---|---|---|---|---|---|",
    ]
    for kind, label in (("tiny", "tiny (an int)"), ("4k", "4 KiB arrays")):
        row = data[kind]
        rows.append(
            f"| {label} | {_rate(row['conveyor_samples_per_s'])} | {_rate(row['conveyor_in_order_samples_per_s'])} "
            f"| {_peer(row, 'grain')} | {_peer(row, 'hf')} | {_peer(row, 'litdata')} |"
        )
    return "\n".join(rows)


MIX: dict[str, Callable[[dict], str]] = {
    "rates": rates_table,
    "memory": lambda data: f"{data['memory']['peak_rss_added_mib']:.1f} MiB",
    "flat": lambda data: f"{data['memory']['rss_added_first_vs_last_checkpoint_mib']:.1f} MiB",
    "positions": lambda data: f"{data['memory']['positions']:.0e}".replace("e+0", "e"),
    "resume": lambda data: f"{data['resume']['resume_at_90pct_s'] * 1000:.0f} ms",
    "fresh": lambda data: f"{data['resume']['fresh_first_batch_s'] * 1000:.0f} ms",
}
