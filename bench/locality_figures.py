"""The figures docs/scale.md quotes from bench/results-locality.json
(bench/locality.py), each a function of that file's data;
bench/docs_figures.py writes them between ``locality:`` markers."""

from __future__ import annotations

from typing import Callable


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"


def _ratio(x: float) -> str:
    return f"{x:.2f}×"


def downloads_table(data: dict) -> str:
    """Per order: the bytes downloaded in each epoch measured, and their ratio to the data set."""
    names = {
        "block": f"`ShardBlockSampler(shards_per_window={data['shards_per_window']})`",
        "stream": f"`.stream(shuffle_shards=True, shards_per_window={data['shards_per_window']})`",
        "random": "`RandomSampler` (a fully random order)",
    }
    rows = ["| order | downloaded per epoch | × the data set |", "|---|---|---|"]
    for order, entry in data["orders"].items():
        sizes = ", ".join(_mb(epoch["downloaded_bytes"]) for epoch in entry["epochs"])
        ratios = ", ".join(_ratio(r) for r in entry["per_epoch_ratio"])
        rows.append(f"| {names.get(order, order)} | {sizes} | {ratios} |")
    return "\n".join(rows)


def setup(data: dict) -> str:
    return (
        f"{data['shards']} shards of {data['samples_per_shard']} samples of {data['sample_bytes']} bytes "
        f"({_mb(data['data_set_bytes'])}), a cache of {_mb(data['cache_bytes'])}, {data['workers']} workers"
    )


LOCALITY: dict[str, Callable[[dict], str]] = {
    "table": downloads_table,
    "setup": setup,
    "block.ratio": lambda data: _ratio(data["ratios"]["block_to_data_set"]),
    "random.ratio": lambda data: _ratio(data["ratios"]["random_to_data_set"]),
}
