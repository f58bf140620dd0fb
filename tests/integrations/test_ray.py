"""Ray Train's prepare_data_loader with conveyor loaders: a local Ray
instance with 2 CPU training workers (gloo), each reading its own part.

Ray keeps a loader whose sampler is a DistributedSampler (conveyor.torch's
is one) and a loader of an iterable dataset, as they are; any other loader
it rebuilds as a torch.utils.data.DataLoader, which the last check pins
(docs/distributed.md says so). The job runs in a script of its own, so that
Ray's processes and threads end with it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

# (found, not imported: Ray Train runs in a script of its own, and importing it here would cost every
# pytest process that collects this module a second)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install -e '.[dev]')"
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer, prepare_data_loader

    def train_loop(config):
        import torch.distributed as dist
        import conveyor.torch as data

        def read(loader):
            prepared = prepare_data_loader(loader, move_to_device=False)
            return [int(i) for batch in prepared for i in batch], type(prepared).__module__

        dataset = list(range(40))
        sampled = data.DataLoader(dataset, batch_size=4, num_workers=2,
                                  sampler=data.DistributedSampler(dataset, shuffle=True, seed=3))
        stream = data.DataLoader(data.ShardedIterable(list(range(30)), even="pad"), batch_size=5, num_workers=2)
        plain = data.DataLoader(dataset, batch_size=4, num_workers=0)
        result = {name: read(loader) for name, loader in (("sampled", sampled), ("stream", stream), ("plain", plain))}
        with open(os.path.join(config["out"], f"rank-{dist.get_rank()}.json"), "w") as f:
            json.dump(result, f)

    out = sys.argv[1]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # (see ray_helpers.py)
    try:
        TorchTrainer(
            train_loop, train_loop_config={"out": out}, scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(storage_path=os.path.join(out, "ray"), name="conveyor"),
        ).fit()
    finally:
        ray.shutdown()
    """
)


# Generous: alone the job takes about 35 s here, but Ray's dozen processes
# starve on a loaded machine (it took over 280 s beside two busy loops and
# other test runs on two cores). A hang still ends here, not in CI's limit.
@pytest.mark.timeout(660)
def test_prepare_data_loader_keeps_conveyor_loaders_and_each_worker_reads_its_part(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for name, everything in (("sampled", list(range(40))), ("stream", list(range(30)))):
        parts = [rank[name][0] for rank in ranks]
        assert sorted(parts[0] + parts[1]) == everything  # each worker its own part, together all of it
        assert all(rank[name][1] == "conveyor.torch" for rank in ranks)  # Ray kept conveyor's loader
    assert all(rank["plain"][1] == "torch.utils.data.dataloader" for rank in ranks)  # Ray rebuilt it as torch's
