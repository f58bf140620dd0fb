"""Shard reads of this tree against another commit's, alternating runs of
bench/shards.py (the same script for both), so that a shared machine's
drifting load falls on both sides alike.

    python bench/shard_reads_ab.py BASE [--pairs 8] [--files 4000] [--rounds 5] [--out FILE]
    python bench/shard_reads_ab.py --summarize RUNS_DIR [--base-name NAME] [--out FILE]

BASE is checked out in a temporary git worktree; this tree's bench/shards.py
is copied into it, so each side runs the same workload over its own
``src/``. Each pair runs the base, then this tree, each with ``--rounds``
rounds of every kind (page cache dropped before each). The result: for
each kind, the median samples/s over every round of every pair, and the
ratio this/base; for the checks, the median warm-cache CPU µs per
``ShardDataset.raw``. Runs are kept in RUNS_DIR (``base-N.json``,
``this-N.json``), which ``--summarize`` reads again.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("conveyor_shards", "conveyor_stream", "conveyor_files", "torch_files")


def summarize(runs: str, base_name: str, what: str) -> dict:
    """Medians and ratios of the pairs' runs in ``runs``."""
    sides = {
        side: [json.loads(Path(p).read_text()) for p in sorted(glob.glob(os.path.join(runs, f"{side}-*.json")))]
        for side in ("base", "this")
    }
    if not sides["base"] or len(sides["base"]) != len(sides["this"]):
        raise SystemExit(f"{runs}: {len(sides['base'])} base and {len(sides['this'])} runs of this tree; want pairs")
    report: dict = {"what": what, "base": base_name, "pairs": len(sides["base"])}
    for kind in KINDS:
        rounds = {side: [v for run in runs_ for v in run["samples"][kind]] for side, runs_ in sides.items()}
        base, this = statistics.median(rounds["base"]), statistics.median(rounds["this"])
        report[kind] = {
            "base_samples_per_s": round(base, 1),
            "this_samples_per_s": round(this, 1),
            "ratio_this_over_base": round(this / base, 3),
            "rounds": len(rounds["this"]),
        }
    checks = {side: [run["checks"]["raw_us_per_sample"] for run in runs_] for side, runs_ in sides.items()}
    base, this = statistics.median(checks["base"]), statistics.median(checks["this"])
    report["checks_raw_us_per_sample"] = {
        "what": "CPU µs per ShardDataset.raw, page cache warm, median over the runs",
        "base": round(base, 2),
        "this": round(this, 2),
        "ratio_this_over_base": round(this / base, 3),
    }
    return report


def run_pairs(base: str, pairs: int, files: int, rounds: int, runs: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "base")
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", "-q", tree, base], check=True)
        try:
            shutil.copy(HERE / "shards.py", os.path.join(tree, "bench", "shards.py"))
            scripts = {"base": os.path.join(tree, "bench", "shards.py"), "this": str(HERE / "shards.py")}
            for n in range(pairs):
                for side, script in scripts.items():
                    args = [sys.executable, script, "--files", str(files), "--rounds", str(rounds), "--json"]
                    out = subprocess.run(args, check=True, capture_output=True, text=True).stdout
                    Path(runs, f"{side}-{n:03d}.json").write_text(out)
                    print(f"pair {n + 1}/{pairs}: {side} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "-C", str(HERE.parent), "worktree", "remove", "--force", tree], check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", help="the commit to compare with")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--files", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", help="folder for the runs (default: a new temporary folder)")
    parser.add_argument("--summarize", metavar="RUNS_DIR", help="only summarize the runs in RUNS_DIR")
    parser.add_argument("--base-name", help="what the base is, for the report")
    parser.add_argument("--out", help="write the report here too")
    args = parser.parse_args()
    if args.summarize:
        runs = args.summarize
    elif args.base:
        runs = args.runs or tempfile.mkdtemp(prefix="shard-reads-")
        os.makedirs(runs, exist_ok=True)
        run_pairs(args.base, args.pairs, args.files, args.rounds, runs)
    else:
        parser.error("give BASE, or --summarize RUNS_DIR")
    what = (
        f"bench/shards.py --files {args.files} --rounds {args.rounds} for the base and this tree in turn, "
        f"pairs of runs alternating; medians over every round (page cache dropped before each)"
    )
    report = summarize(runs, args.base_name or args.base or "base", what)
    text = json.dumps(report, indent=1, ensure_ascii=False)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
