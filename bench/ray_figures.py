"""The figures docs/scale-out.md and the README quote from
bench/results-ray-workers.json (bench/ray_workers.py), each a function of
that file's data; bench/docs_figures.py writes them between ``ray:`` markers."""

from __future__ import annotations

from typing import Callable


def _ms(seconds: float) -> str:
    """Milliseconds, to two significant figures at most (1.5 ms, 10 ms)."""
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def _s(seconds: float) -> str:
    return f"{seconds:.4f}" if seconds < 0.001 else f"{seconds:.2g}"


def overhead_table(data: dict) -> str:
    """Per workload: seconds per batch with processes and with Ray, Ray's extra, and the first batch."""
    rows = [
        "| batch | processes, s/batch | Ray actors, s/batch | Ray's extra per batch | first batch (start-up), "
        "processes / Ray |",
        "|---|---|---|---|---|",
    ]
    for entry in data["workloads"].values():
        procs, ray = entry["multiprocessing"], entry["ray"]
        rows.append(
            f"| {entry['batch']} | {_s(procs['per_batch_s'])} | {_s(ray['per_batch_s'])} | "
            f"{_ms(entry['ray_extra_per_batch_s'])} | {procs['first_batch_s']:.2f} s / {ray['first_batch_s']:.1f} s |"
        )
    return "\n".join(rows)


def setup(data: dict) -> str:
    machine = data["machine"]
    return (
        f"{machine['cpus']} cores, {data['workers']} workers, Ray {machine['ray']}, medians of {data['rounds']} rounds"
    )


RAY: dict[str, Callable[[dict], str]] = {
    "table": overhead_table,
    "setup": setup,
    "small.extra": lambda data: _ms(data["workloads"]["small"]["ray_extra_per_batch_s"]),
    "big.extra": lambda data: _ms(data["workloads"]["big"]["ray_extra_per_batch_s"]),
}
