"""Hugging Face Accelerate keeps conveyor loaders (conveyor.integrations.accelerate).

tests/integrations/job_accelerate.py runs as one process and under torchrun on 2 ranks
(gloo, CPU). On each rank, after ``accelerator.prepare``: conveyor loads the
batches (its stats count them, thread workers stay threads) and they equal
the same conveyor loader's outside accelerate, augmentations included; each
rank gets the share accelerate gives a torch loader; batches are on
``accelerator.device``; gradient accumulation syncs at the end of the
epoch; and ``save_state``/``load_state`` mid-epoch resume exactly.
Accelerate's own Accelerator rebuilds a conveyor loader as torch's: that
warns, naming accelerate and the fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e '.[dev]')")

JOB = Path(__file__).with_name("job_accelerate.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(tmp_path: Path, ranks: int) -> list[dict]:
    out = tmp_path / f"ranks-{ranks}"
    out.mkdir()
    launch = [sys.executable]
    if ranks > 1:
        launch += [
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
        ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run([*launch, str(JOB), str(out)], env=env, cwd=out, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in range(ranks)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ranks", [1, 2])
def test_prepare_keeps_conveyor_per_rank_and_save_state_resumes_exactly(tmp_path, ranks):
    results = _run(tmp_path, ranks)
    per_rank = 10 // ranks
    for result in results:
        assert result["ranks"] == ranks and result["prepared_type"] == "AcceleratedDataLoader"
        threads = result["threads"]
        # Conveyor loaded every batch, in its thread workers, as the same loader does outside accelerate.
        assert threads["stats"] == threads["prepared_stats"] == per_rank
        assert {"index": threads["index"], "noise": threads["noise"]} == result["threads_alone"]
        assert all(step["children"] == 0 and step["loaded_in"] != "MainThread" for step in threads["steps"])
        assert all(step["device"] for step in threads["steps"])
        # Gradient accumulation over 3 batches: a sync every third batch and at the end of the epoch.
        assert [step["end"] for step in threads["steps"]] == [False] * (per_rank - 1) + [True]
        assert [step["sync"] for step in threads["steps"]] == [
            (n + 1) % 3 == 0 or n + 1 == per_rank for n in range(per_rank)
        ]
        # This rank's share is the one accelerate gives torch's loader (padding included).
        assert result["share"]["conveyor"] == result["share"]["torch"]
        assert result["share"]["gathered"] == list(range(42))  # gather_for_metrics: every sample once, in order
        resume = result["resume"]
        assert resume["skip_returns_loader"]
        assert resume["resumed"] == resume["uninterrupted"]
        assert len(resume["resumed"][0]["index"]) == per_rank - 2
    everyone = sorted(i for result in results for batch in result["threads"]["index"] for i in batch)
    assert everyone == list(range(40))  # each rank its own share, together all of it
    if ranks == 2:
        assert results[0]["resume"]["resumed"] != results[1]["resume"]["resumed"]


def test_accelerates_own_accelerator_warns_that_it_rebuilds_a_conveyor_loader():
    import accelerate
    import torch.utils.data as tud

    import conveyor.torch as data
    from conveyor.integrations import RebuiltLoaderWarning

    loader = data.DataLoader(list(range(8)), batch_size=2)
    with pytest.warns(RebuiltLoaderWarning, match=r"accelerate's Accelerator\.prepare rebuilds") as caught:
        prepared = accelerate.Accelerator(cpu=True).prepare(loader)
    assert "from conveyor.integrations.accelerate import Accelerator" in str(caught[0].message)
    assert caught[0].filename == __file__  # it points at the line that called prepare
    assert isinstance(prepared.base_dataloader, tud.DataLoader) and not isinstance(
        prepared.base_dataloader, data.DataLoader
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerate.Accelerator(cpu=True).prepare(tud.DataLoader(list(range(8))))  # torch's own loader: no warning


def test_skip_first_batches_resumes_a_loaded_state_or_loads_and_drops_and_refuses_another_count():
    import torch.utils.data as tud

    import conveyor.torch as data
    from conveyor.integrations.accelerate import Accelerator

    accelerator = Accelerator(cpu=True)

    def prepared():
        return accelerator.prepare(data.DataLoader(list(range(12)), batch_size=2, shuffle=True, seed=0))

    whole = [batch.tolist() for batch in prepared()]
    with pytest.warns(UserWarning, match="loads and drops its first 2 batches"):
        skipped = accelerator.skip_first_batches(prepared(), 2)
    assert len(skipped) == 4 and [batch.tolist() for batch in skipped] == whole[2:]

    saving = prepared()
    batches = iter(saving)
    next(batches), next(batches)
    resumed = prepared()
    resumed.load_state_dict(saving.state_dict())
    with pytest.raises(ValueError, match="resumes after batch 2, not 3"):
        accelerator.skip_first_batches(resumed, 3)
    assert accelerator.skip_first_batches(resumed, 2) is resumed
    assert [batch.tolist() for batch in resumed] == whole[2:]
    assert resumed.stats().batches == 4  # the two before were not loaded

    torch_loader = accelerator.skip_first_batches(tud.DataLoader(list(range(4))), 1)  # accelerate's, as before
    assert [batch.tolist() for batch in torch_loader] == [[1], [2], [3]]


def test_prepare_data_loader_refuses_what_it_cannot_prepare():
    import torch.utils.data as tud

    import conveyor.torch as data
    from conveyor.integrations.accelerate import Accelerator, prepare_data_loader

    accelerator = Accelerator(cpu=True)
    with pytest.raises(TypeError, match="conveyor.torch.DataLoader"):
        prepare_data_loader(tud.DataLoader(list(range(4))), accelerator)
    with pytest.raises(ValueError, match="batch_size=None"):
        prepare_data_loader(data.DataLoader(list(range(4)), batch_size=None), accelerator)


def test_import_conveyor_imports_no_framework():
    code = (
        "import sys, conveyor, conveyor.torch, conveyor.integrations; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('accelerate', 'transformers', 'tensorboard')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.timeout(120)
def test_an_iterable_loader_sees_its_end_coming_and_its_state_is_the_loop_s():
    import conveyor.torch as data
    from conveyor.integrations.accelerate import Accelerator

    accelerator = Accelerator(cpu=True)

    def prepared():
        return accelerator.prepare(data.DataLoader(data.ShardedIterable(list(range(10))), batch_size=4, num_workers=2))

    loader = prepared()
    ends = [(batch.tolist(), accelerator.gradient_state.end_of_dataloader) for batch in loader]
    assert [end for _, end in ends] == [False, False, False, True]  # (2 workers: 2 batches each, the last short)
    batches = iter(loader)
    next(batches)  # the next batch is held to see the end coming; the state is still after the first
    resumed = prepared()
    with pytest.warns(UserWarning, match="reads again"):  # (ShardedIterable has no state of its own)
        resumed.load_state_dict(loader.state_dict())
    assert [batch.tolist() for batch in resumed] == [batch for batch, _ in ends[1:]]
