"""Real process groups: torchrun starts 2 ranks (gloo on 127.0.0.1, CPU),
each iterating a conveyor.torch loader with 2 workers, as a DDP job does.

Each scenario is a script run under ``python -m torch.distributed.run``; its
ranks write what they saw to JSON files that the test compares: every sample
once per epoch across ranks, each rank's order equal to torch's
DistributedSampler for the same seed and epoch, every rank as many batches
(each batch is followed by an all-reduce, so a rank that ran out first would
leave the other waiting), and a rank that fails ending the job with a report
naming it rather than a hang.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import procutil  # noqa: E402

#: The module's job of the scenarios that end well is run once (``together``): one xdist worker takes
#: its tests, or each worker that took one would run it again.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("torch_distributed")]

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.utils.data as tud

    import conveyor.torch as data

    out, scenarios = sys.argv[1], sys.argv[2].split(",")
    saved_state = sys.argv[3] if len(sys.argv) > 3 else None
    # Built before the process group: ShardedIterable reads torchrun's RANK and WORLD_SIZE itself.
    sharded = {
        "even-pad": data.ShardedIterable(list(range(23)), even="pad"),
        "even-drop": data.ShardedIterable(list(range(23)), even="drop"),
    }
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    def step():  # what DDP's backward does each batch: wait for every rank
        dist.all_reduce(torch.ones(1))

    def run(scenario):
        result = {"rank": rank, "world": world}
        if scenario == "map":
            dataset = list(range(40))
            sampler = data.DistributedSampler(dataset, shuffle=True, seed=7)
            loader = data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True)
            result["epochs"] = []
            for epoch in range(2):
                sampler.set_epoch(epoch)
                seen = []
                for batch in loader:
                    seen += batch.tolist()
                    step()
                reference = tud.DistributedSampler(dataset, shuffle=True, seed=7)
                reference.set_epoch(epoch)
                result["epochs"].append({"seen": seen, "torch": list(reference)})
        elif scenario in sharded:
            loader = data.DataLoader(sharded[scenario], batch_size=4, num_workers=2)
            seen = []
            for batch in loader:
                seen += batch.tolist()
                step()
            result["seen"] = seen
        elif scenario == "samplers":
            import numpy as np
            weights = [1.0 + (i % 5) for i in range(30)]
            # (the same draw on every rank)
            weighted = data.WeightedRandomSampler(weights, 30, generator=np.random.default_rng(11))
            loader = data.DataLoader(list(range(30)), batch_size=4, num_workers=2,
                                     sampler=data.ShardedSampler(weighted))
            seen = []
            for batch in loader:
                seen += batch.tolist()
                step()
            result["weighted"] = seen
            result["weighted_all"] = list(data.WeightedRandomSampler(weights, 30, generator=np.random.default_rng(11)))
            evaluation = data.DataLoader(list(range(31)), batch_size=4, num_workers=2,
                                         sampler=data.DistributedSampler(list(range(31)), shuffle=True, even=False))
            result["evaluated"] = [i for batch in evaluation for i in batch.tolist()]
        elif scenario in ("elastic-save", "elastic-resume"):
            dataset = list(range(40))
            loader = data.DataLoader(dataset, batch_size=4, num_workers=2,
                                     sampler=data.DistributedSampler(dataset, shuffle=True, seed=5))
            if saved_state:
                with open(saved_state) as f:
                    loader.load_state_dict(json.load(f))
            seen = []
            for k, batch in enumerate(loader):
                seen += batch.tolist()
                step()
                if scenario == "elastic-save" and k == 2:
                    if rank == 0:
                        with open(os.path.join(out, "state.json"), "w") as f:
                            json.dump(loader.state_dict(), f)
                    break
            result["seen"] = seen
        elif scenario in ("raise", "kill"):
            loader = data.DataLoader(list(range(400)), batch_size=4, num_workers=2,
                                     sampler=data.DistributedSampler(list(range(400)), shuffle=False))
            with open(os.path.join(out, f"workers-{rank}.json"), "w") as f:
                it = iter(loader)
                json.dump([p.pid for p in __import__("multiprocessing").active_children()], f)
            for k, batch in enumerate(it):
                if rank == 1 and k == 3:
                    if scenario == "raise":
                        raise RuntimeError("rank 1 broke on purpose")
                    os.kill(os.getpid(), signal.SIGKILL)
                step()
        return result

    for scenario in scenarios:  # (one after another, in one process group)
        result = run(scenario)
        with open(os.path.join(out, f"{scenario}-rank-{rank}.json"), "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out, scenarios, ranks=2, *args):
    """Run the scenarios one after another in one job of ``ranks`` ranks, in the folder ``out``:
    (completed process, {scenario: each rank's result, or None where it wrote none})."""
    out.mkdir()
    script = out / "job.py"
    script.write_text(SCRIPT)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        "--monitor-interval",
        "0.2",
        str(script),
        str(out),
        ",".join(scenarios),
        *args,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True, timeout=150)
    results = {}
    for scenario in scenarios:
        paths = [out / f"{scenario}-rank-{rank}.json" for rank in range(ranks)]
        results[scenario] = [json.loads(path.read_text()) if path.exists() else None for path in paths]
    return done, results


#: The scenarios that end well, run in one job (each job costs every rank seconds of imports and
#: set-up), once for the module's tests.
TOGETHER = ["map", "even-pad", "even-drop", "samplers", "elastic-save"]


@pytest.fixture(scope="module")
def together(tmp_path_factory) -> tuple:
    """(the folder, {scenario: each rank's result}) of one 2-rank job of the ``TOGETHER`` scenarios."""
    out = tmp_path_factory.mktemp("distributed") / "together"
    done, results = _torchrun(out, TOGETHER)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, results


def test_each_sample_once_per_epoch_in_torchs_order_and_set_epoch_reshuffles(together):
    results = together[1]["map"]
    assert [r["world"] for r in results] == [2, 2]
    for epoch in range(2):
        seen = [results[rank]["epochs"][epoch]["seen"] for rank in range(2)]
        assert sorted(seen[0] + seen[1]) == list(range(40))  # every sample once across ranks
        for rank in range(2):  # each rank's batches: torch's DistributedSampler partition
            assert seen[rank] == results[rank]["epochs"][epoch]["torch"]
    assert results[0]["epochs"][0]["seen"] != results[0]["epochs"][1]["seen"]  # set_epoch changed the order


@pytest.mark.parametrize("even", ["pad", "drop"])
def test_an_iterable_dataset_gives_every_rank_as_many_batches(together, even):
    # A rank with fewer batches would leave the other in its all-reduce until the 60 s timeout (the job fails).
    results = together[1][f"even-{even}"]
    seen = [results[rank]["seen"] for rank in range(2)]
    assert len(seen[0]) == len(seen[1]) == (12 if even == "pad" else 11)
    everything = sorted(seen[0] + seen[1])
    if even == "drop":
        assert everything == list(range(22))  # 23 items on 2 ranks: the last one left out
    else:
        assert set(everything) == set(range(23)) and len(everything) == 24  # one item repeated to fill up


@pytest.mark.parametrize("scenario", ["raise", "kill"])
def test_a_failing_rank_ends_the_job_with_a_report_instead_of_a_hang(tmp_path, scenario):
    out = tmp_path / scenario
    done, results = _torchrun(out, [scenario])
    assert done.returncode != 0
    assert results[scenario] == [None, None]  # neither rank finished: rank 0 did not carry on alone
    report = done.stderr
    assert "local_rank: 1" in report or "rank: 1" in report, report[-3000:]  # torchrun names the failed rank
    if scenario == "raise":
        assert "rank 1 broke on purpose" in report
    else:
        assert "Signal 9" in report or "SIGKILL" in report
    # Every rank's DataLoader workers are gone too.
    workers = [pid for rank in range(2) for pid in json.loads((out / f"workers-{rank}.json").read_text())]
    assert workers and not procutil.wait_until_gone(workers, 10.0)


def test_the_documented_example_runs_as_written_and_resumes(tmp_path):
    example = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "examples", "ddp.py")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    lines = []
    for extra in ([], ["--resume"]):
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
            example,
            "--out",
            str(tmp_path),
            *extra,
        ]
        done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
        assert done.returncode == 0, done.stderr[-3000:]
        lines.append(done.stdout.strip().splitlines()[-1])
    assert lines[0] == (
        "2 ranks; training batches on rank 0: 16; stream: 4 batches a rank; evaluation covered 64 samples, each "
        "once: True"
    )
    assert lines[1].startswith("2 ranks; training batches on rank 0: 4;")  # the rest of the epoch it stopped in


def test_any_sampler_shared_out_and_evaluation_without_duplicates(together):
    results = together[1]["samplers"]
    drawn = results[0]["weighted_all"]
    assert results[1]["weighted_all"] == drawn  # the same draw on both ranks
    assert sorted(results[0]["weighted"] + results[1]["weighted"]) == sorted(drawn)  # 30 items, 15 a rank
    assert len(results[0]["weighted"]) == len(results[1]["weighted"]) == 15
    evaluated = results[0]["evaluated"] + results[1]["evaluated"]
    assert sorted(evaluated) == list(range(31))  # every sample once: no padded duplicate


@pytest.mark.parametrize("ranks_after", [1, 3])
def test_state_saved_on_2_ranks_resumes_on_another_number_of_ranks(together, tmp_path, ranks_after):
    out, results = together
    saved = results["elastic-save"]
    consumed = saved[0]["seen"] + saved[1]["seen"]
    assert len(consumed) == 24  # 3 batches of 4 on each of 2 ranks
    done, resumed = _torchrun(tmp_path / "resumed", ["elastic-resume"], ranks_after, str(out / "state.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = resumed["elastic-resume"]
    rest = [r["seen"] for r in resumed]
    assert len({len(part) for part in rest}) == 1  # every rank as many: their all-reduces matched
    everything = consumed + [i for part in rest for i in part]
    assert set(everything) == set(range(40))
    assert len(everything) - 40 == (-16) % ranks_after  # once each, but the padding that evens the ranks out
