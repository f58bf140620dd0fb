"""The main benchmark (bench/run.py) of this tree against another commit's,
in alternating runs, so that a shared machine's drifting load falls on both
sides alike: the before/after table of a change that should change no speed.

    python bench/house_ab.py BASE [--pairs 3] [--rounds 3] [--only a,b,c,d,f,j] [--out FILE]
    python bench/house_ab.py --summarize RUNS_DIR [--base-name NAME] [--out FILE]

BASE is checked out in a temporary git worktree and runs its own
bench/run.py over its own ``src/`` (the workloads are the same script on
both sides when the change left bench/run.py's workloads alone). Each pair
runs the base, then this tree. For each workload: conveyor's median over
every round of every pair on each side, the ratio this/base, and each
side's ratio against torch.utils.data measured in the same runs (the
paired ratios' median), which drift in the machine's load hits least.
Runs are kept in RUNS_DIR (``base-N.json``, ``this-N.json``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def summarize(runs: str, base_name: str) -> dict:
    """Medians and ratios of the pairs' runs in ``runs``."""
    sides = {
        side: [json.loads(Path(p).read_text()) for p in sorted(glob.glob(os.path.join(runs, f"{side}-*.json")))]
        for side in ("base", "this")
    }
    if not sides["base"] or len(sides["base"]) != len(sides["this"]):
        raise SystemExit(f"{runs}: {len(sides['base'])} base and {len(sides['this'])} runs of this tree; want pairs")
    report: dict = {
        "what": "bench/run.py of this tree against the base commit's, alternating runs (bench/house_ab.py)",
        "base": base_name,
        "pairs": len(sides["base"]),
        "workloads": {},
    }
    names = sorted(set.intersection(*(set(run["workloads"]) for runs_ in sides.values() for run in runs_)))
    for name in names:
        entry: dict = {}
        for side, runs_ in sides.items():
            results = [run["workloads"][name] for run in runs_]
            if not all(isinstance(r, dict) and "samples" in r and "conveyor" in r["samples"] for r in results):
                break
            entry[f"{side}_conveyor"] = round(
                statistics.median(v for r in results for v in r["samples"]["conveyor"]), 4
            )
            entry[f"{side}_vs_torch"] = round(statistics.median(r["paired_ratio"] for r in results), 3)
        else:
            entry["this_over_base"] = round(entry["this_conveyor"] / entry["base_conveyor"], 3)
            report["workloads"][name] = entry
    # f (resume): seconds to the first batch after a resume, lower is better.
    if all("resume" in run for runs_ in sides.values() for run in runs_):
        for point in sides["this"][0]["resume"]["results"]:
            entry = {
                f"{side}_conveyor_s": round(
                    statistics.median(run["resume"]["results"][point]["conveyor_s"] for run in runs_), 4
                )
                for side, runs_ in sides.items()
            }
            entry["this_over_base"] = round(entry["this_conveyor_s"] / entry["base_conveyor_s"], 3)
            report["workloads"][f"f_{point}_s"] = entry
    return report


def run_side(tree: Path, out: Path, rounds: int, only: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / "run.py"), "--json", "--rounds", str(rounds), "--only", only],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"bench/run.py in {tree} failed:\n{done.stderr[-3000:]}")
    report = json.loads(done.stdout[done.stdout.index("{") :])
    out.write_text(json.dumps(report, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", nargs="?", help="the commit to compare this tree with")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="bench/run.py's A B rounds per workload")
    parser.add_argument("--only", default="a,b,c,d,f,j", help="bench/run.py's workloads")
    parser.add_argument("--summarize", metavar="RUNS_DIR", help="only summarize the runs kept there")
    parser.add_argument("--base-name", default=None)
    parser.add_argument("--runs", default=None, help="where to keep the runs (default: a temporary folder)")
    parser.add_argument("--out", default=str(HERE / "results-house-ab.json"))
    args = parser.parse_args()
    if args.summarize:
        report = summarize(args.summarize, args.base_name or "base")
    else:
        if not args.base:
            parser.error("give BASE, or --summarize RUNS_DIR")
        runs = Path(args.runs or tempfile.mkdtemp(prefix="house-ab-"))
        runs.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as where:
            base_tree = Path(where) / "base"
            subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base], cwd=ROOT, check=True)
            try:
                for pair in range(args.pairs):
                    run_side(base_tree, runs / f"base-{pair}.json", args.rounds, args.only)
                    run_side(ROOT, runs / f"this-{pair}.json", args.rounds, args.only)
                    print(f"pair {pair + 1} of {args.pairs} done ({runs})", file=sys.stderr, flush=True)
            finally:
                subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False)
        report = summarize(str(runs), args.base_name or args.base)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
