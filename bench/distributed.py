"""Per-rank throughput of a data-parallel job: 2 ranks under torchrun (gloo,
CPU), each with its own loader, conveyor against torch.utils.data.

    python bench/distributed.py [--rounds 5] [--batches 2000] [--num-workers 1]

Every rank iterates a DistributedSampler's share of small-batch data (32
ints a batch, as workload b) and follows each batch with an all-reduce, as
DDP's backward does, so the slowest rank sets the pace. Rounds alternate
conveyor (``conveyor.torch``) and torch, each with fresh loaders; the JSON on
stdout gives each rank's median batches per second and the ratios. On two
cores, 2 ranks with 1 worker each already fill the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap

RANK_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import torch.utils.data as tud
    sys.path.insert(0, {bench!r})
    import workloads
    import conveyor.torch as ct

    rounds, batches, workers, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    dataset = workloads.Ints(32 * (batches + 1) * world)
    rates = {{"conveyor": [], "torch": []}}
    for _ in range(rounds):
        for kind, module in (("conveyor", ct), ("torch", tud)):
            sampler = module.DistributedSampler(dataset, shuffle=False)
            loader = module.DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=workers)
            it = iter(loader)
            next(it)
            dist.barrier()
            start, count = time.perf_counter(), 0
            for batch in it:
                dist.all_reduce(torch.ones(1))
                count += 1
            rates[kind].append(count / (time.perf_counter() - start))
            del it, loader
    with open(os.path.join(out, f"rank-{{rank}}.json"), "w") as f:
        json.dump(rates, f)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> dict:
    bench = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as out:
        script = os.path.join(out, "rank.py")
        with open(script, "w") as f:
            f.write(RANK_SCRIPT.format(bench=bench))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            script,
            str(args.rounds),
            str(args.batches),
            str(args.num_workers),
            out,
        ]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
        subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=1200)
        ranks = [json.load(open(os.path.join(out, f"rank-{rank}.json"))) for rank in range(2)]
    per_rank = []
    for rank, rates in enumerate(ranks):
        conveyor, torch = statistics.median(rates["conveyor"]), statistics.median(rates["torch"])
        paired = statistics.median(a / b for a, b in zip(rates["conveyor"], rates["torch"]))
        per_rank.append(
            {
                "rank": rank,
                "conveyor": round(conveyor, 1),
                "torch": round(torch, 1),
                "ratio": round(conveyor / torch, 3),
                "paired_ratio": round(paired, 3),
                "samples": {k: [round(v, 1) for v in vs] for k, vs in rates.items()},
            }
        )
    return {
        "benchmark": "distributed",
        "unit": "batches per second per rank (32 ints a batch, an all-reduce after each)",
        "config": {
            "ranks": 2,
            "num_workers": args.num_workers,
            "batches_per_rank": args.batches,
            "rounds": args.rounds,
        },
        "ranks": per_rank,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=2000, help="batches per rank per run")
    parser.add_argument("--num-workers", type=int, default=1, help="workers per rank")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(run(parse_args()), indent=2))
