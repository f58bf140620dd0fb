"""transformers.Trainer through conveyor (conveyor.integrations.transformers).

tests/integrations/job_trainer.py trains a tiny GPT-2 (built from a config) under
torchrun on 2 ranks (gloo, CPU) with ConveyorTrainer: each rank trains on
its own share, loaded by conveyor, and a run resumed from a checkpoint in
the middle of an epoch trains on the same next batches, with the same
losses, as the run that never stopped, without loading the batches before
the checkpoint. A plain Trainer handed a conveyor loader through
accelerate warns, naming the Trainer and the fix.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[dev]')")
pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e '.[dev]')")

JOB = Path(__file__).with_name("job_trainer.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_trainer_trains_each_rank_s_share_through_conveyor_and_resumes_mid_epoch_exactly(tmp_path):
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
        "--monitor-interval",
        "0.2",
        str(JOB),
        str(tmp_path),
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for rank in ranks:
        assert rank["ranks"] == 2 and rank["loader_type"] == "AcceleratedDataLoader"
        whole, stopped, resumed = rank["whole"], rank["stopped"], rank["resumed"]
        assert len(whole) == 12 and len(stopped) == 8  # 6 micro-batches an epoch, stopped 2 into epoch 1
        assert stopped == whole[:8]
        assert resumed == whole[8:]  # the same samples, augmentations and losses after the checkpoint
        assert rank["saved_state"] and rank["stats"] == 4  # the 2 batches before it were not loaded again
    for epoch in range(2):
        mine = [
            sorted(i for batch in rank["whole"][6 * epoch : 6 * epoch + 6] for i in batch["index"]) for rank in ranks
        ]
        assert sorted(mine[0] + mine[1]) == list(range(48))  # each rank its own half of every epoch


@pytest.mark.timeout(120)
def test_a_plain_trainer_that_prepares_a_conveyor_loader_warns_with_the_fix(tmp_path):
    import torch
    from transformers import Trainer, TrainingArguments

    import conveyor.torch as data
    from conveyor.integrations import RebuiltLoaderWarning

    class Plain(Trainer):
        def get_train_dataloader(self):
            return self.accelerator.prepare(data.DataLoader([{"x": torch.ones(2)}] * 4, batch_size=2))

    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], disable_tqdm=True)
    trainer = Plain(model=torch.nn.Linear(2, 1), args=args, train_dataset=[{"x": torch.ones(2)}] * 4)
    with pytest.warns(RebuiltLoaderWarning, match="transformers' Trainer") as caught:
        trainer.get_train_dataloader()
    assert "ConveyorTrainer" in str(caught[0].message)
