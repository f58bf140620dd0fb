"""PyTorch Lightning accepts a conveyor.torch loader as its own: under the DDP
strategy (2 CPU processes, gloo) it injects its DistributedSampler, so each
rank trains on its own half of the data, exactly as with torch.utils.data.

The training runs in a script of its own: Lightning's DDP launcher starts
the other rank by running the script again, which it cannot do with pytest.
One launch trains twice, with conveyor's loader and then torch's (the
second Trainer finds the ranks started and their process group made).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

# (found, not imported: the training runs in a script of its own, and importing Lightning here
# would cost every pytest process that collects this module seconds)
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None, reason="lightning is not installed (pip install -e '.[dev]')"
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import lightning as L

    import torch.utils.data
    import conveyor.torch

    class Indexed(torch.utils.data.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            return torch.tensor([float(i)]), i

    class Model(L.LightningModule):
        def __init__(self, name):
            super().__init__()
            self.name = name
            self.layer = torch.nn.Linear(1, 1)
            self.seen = []

        def training_step(self, batch, batch_idx):
            x, index = batch
            self.seen += [int(i) for i in index]
            return self.layer(x).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_end(self):
            with open(os.path.join(sys.argv[1], f"{{self.name}}-rank-{{self.global_rank}}.json"), "w") as f:
                json.dump(self.seen, f)

    if __name__ == "__main__":
        for data in (conveyor.torch, torch.utils.data):
            loader = data.DataLoader(Indexed(), batch_size=4, shuffle=False, num_workers={num_workers})
            trainer = L.Trainer(
                accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            )
            trainer.fit(Model(data.__name__), loader)
    """
)


def _ranks_saw(tmp_path, num_workers) -> dict:
    """{module: [the indices rank 0 saw, rank 1's]}, for conveyor.torch's loader and torch's."""
    out = tmp_path
    script = out / "train.py"
    script.write_text(SCRIPT.format(num_workers=num_workers))
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "MASTER_ADDR": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, cwd=out, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    modules = ("conveyor.torch", "torch.utils.data")
    return {m: [json.loads((out / f"{m}-rank-{rank}.json").read_text()) for rank in range(2)] for m in modules}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_workers", [1])
def test_ddp_gives_each_rank_its_own_half_as_with_torch(tmp_path, num_workers):
    saw = _ranks_saw(tmp_path, num_workers)
    ours, theirs = saw["conveyor.torch"], saw["torch.utils.data"]
    assert ours == theirs
    assert sorted(ours[0] + ours[1]) == list(range(20)) and not set(ours[0]) & set(ours[1])
