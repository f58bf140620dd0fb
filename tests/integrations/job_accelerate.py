"""A training job with Hugging Face Accelerate and conveyor loaders, run by
tests/integrations/test_accelerate.py on one process and under torchrun on 2 ranks
(gloo, CPU). Each rank writes what it saw to ``OUT/rank-<r>.json``.

    python tests/integrations/job_accelerate.py OUT
    python -m torch.distributed.run --nproc-per-node 2 tests/integrations/job_accelerate.py OUT
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import threading

import torch
import torch.utils.data as tud
from accelerate.data_loader import prepare_data_loader as accelerate_prepare

import conveyor.torch as data
from conveyor.integrations.accelerate import AcceleratedDataLoader, Accelerator


class Augmented(data.Dataset):
    """Sample i: its index and a random "augmentation" from the generators
    conveyor seeds for the batch (torch's global one in process workers;
    conveyor.sample_rng() wherever the sample is loaded)."""

    def __init__(self, size: int, threads: bool):
        self.size, self.threads = size, threads

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        noise = data.sample_rng().numpy_generator.random() if self.threads else float(torch.rand(()))
        return {"index": torch.tensor(i), "noise": torch.tensor(noise), "thread": threading.current_thread().name}


def seen(batches) -> dict:
    return {
        "index": [batch["index"].tolist() for batch in batches],
        "noise": [batch["noise"].tolist() for batch in batches],
    }


def main(out: str) -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)  # (cpu=True: gloo between CPU processes)
    ranks, rank = accelerator.num_processes, accelerator.process_index
    result: dict = {"ranks": ranks}

    # 1. Thread workers: conveyor loads, on this rank's share, with gradient accumulation tracked.
    loader = data.DataLoader(
        Augmented(40, True), batch_size=4, shuffle=True, seed=5, num_workers=2, worker_method="thread"
    )
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, prepared = accelerator.prepare(model, optimizer, loader)
    result["prepared_type"] = type(prepared).__name__
    batches, steps = [], []
    for batch in prepared:
        with accelerator.accumulate(model):
            batches.append(batch)
            steps.append(
                {
                    "sync": accelerator.sync_gradients,
                    "end": accelerator.gradient_state.end_of_dataloader,
                    "device": batch["index"].device.type == accelerator.device.type,  # (on CPU: "cpu" and "cpu:0")
                    "children": len(multiprocessing.active_children()),
                    "loaded_in": batch["thread"][0],
                }
            )
    result["threads"] = {
        **seen(batches),
        "steps": steps,
        "stats": loader.stats().batches,
        "prepared_stats": prepared.stats().batches,
    }
    shard = data.ShardedSampler(data.BatchSampler(data.RandomSampler(range(40), seed=5), 4, False), ranks, rank)
    alone = data.DataLoader(Augmented(40, True), batch_sampler=shard, seed=5, num_workers=2, worker_method="thread")
    result["threads_alone"] = seen(list(alone))  # the same loader outside accelerate, this rank's batches

    # 2. Each rank's share is the one accelerate gives a torch loader (42 samples: the last round is padded).
    ours = accelerator.prepare(data.DataLoader(list(range(42)), batch_size=4))
    torch_share = accelerate_prepare(
        tud.DataLoader(list(range(42)), batch_size=4), num_processes=ranks, process_index=rank
    )
    gathered = [accelerator.gather_for_metrics(batch) for batch in ours]  # (drops the last round's padding)
    result["share"] = {
        "conveyor": [b.tolist() for b in ours],
        "torch": [b.tolist() for b in torch_share],
        "gathered": torch.cat(gathered).tolist(),
    }

    # 3. save_state / load_state mid-epoch, process workers, augmentations from torch's global generator.
    def process_loader() -> AcceleratedDataLoader:
        made = data.DataLoader(Augmented(40, False), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
        return accelerator.prepare(made)

    accelerator.free_memory()
    torch.manual_seed(100 + rank)  # (no seed=: the shuffle and the batch seeds come from torch's generator)
    uninterrupted = process_loader()
    epochs = [list(uninterrupted), list(uninterrupted)]
    accelerator.free_memory()
    torch.manual_seed(100 + rank)
    interrupted = process_loader()
    for number, _ in enumerate(interrupted):
        if number == 1:
            accelerator.save_state(os.path.join(out, "checkpoint"))
            break
    accelerator.free_memory()
    torch.manual_seed(7)  # a new run: another global generator
    resumed = process_loader()
    accelerator.load_state(os.path.join(out, "checkpoint"))
    skipped = accelerator.skip_first_batches(resumed, 2)
    result["resume"] = {
        "skip_returns_loader": skipped is resumed,
        "uninterrupted": [seen(epochs[0][2:]), seen(epochs[1])],
        "resumed": [seen(list(skipped)), seen(list(resumed))],
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
