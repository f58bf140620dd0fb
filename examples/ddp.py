"""Data-parallel training input with conveyor under torchrun (CPU, gloo).

    torchrun --nproc-per-node 2 examples/ddp.py            # 2 ranks on this machine
    torchrun --nproc-per-node 2 examples/ddp.py --resume   # and resume from the saved state

Each rank builds the same loaders; conveyor shares the data out:

* training (map-style): ``DistributedSampler`` gives rank r every R-th index
  of the epoch's shuffle (torch's order for the same seed); ``set_epoch``
  reshuffles; each rank saves ``loader.state_dict()`` and can resume.
* a stream (iterable): ``ShardedIterable`` reads RANK and WORLD_SIZE itself
  and splits items over ranks x workers; ``even="pad"`` gives every rank as
  many batches, so no rank waits in an all-reduce for one that ran out.
* evaluation: ``DistributedSampler(even=False)``: every sample exactly
  once, no padded duplicates; results are gathered with all_gather_object.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

import conveyor.torch as data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true", help="continue from the state saved by a run that stopped")
    parser.add_argument("--out", default=".", help="where each rank writes its state")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    state_path = os.path.join(args.out, f"loader-state-rank{rank}.json")

    dataset = data.TensorDataset(torch.arange(64).float().unsqueeze(1), torch.arange(64))
    sampler = data.DistributedSampler(dataset, shuffle=True, seed=0)
    train = data.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2, persistent_workers=True)
    first_epoch = 0
    if args.resume:  # each rank loads its own state: same epoch, same position
        with open(state_path) as f:
            saved = json.load(f)
        first_epoch = saved["epoch"]
        train.load_state_dict(saved["loader"])
    seen = []
    for epoch in range(first_epoch, 2):
        sampler.set_epoch(epoch)
        for step, (x, index) in enumerate(train):
            seen += index.tolist()
            dist.all_reduce(x.sum())  # stands for DDP's gradient all-reduce
            if not args.resume and epoch == 1 and step == 3:
                with open(state_path, "w") as f:  # as a checkpoint would, with the model's state
                    json.dump({"epoch": epoch, "loader": train.state_dict()}, f)
    stream = data.DataLoader(data.ShardedIterable(list(range(30)), even="pad"), batch_size=4, num_workers=2)
    stream_batches = 0
    for batch in stream:
        dist.all_reduce(batch.sum())
        stream_batches += 1

    evaluation = data.DataLoader(
        dataset, batch_size=8, sampler=data.DistributedSampler(dataset, shuffle=False, even=False)
    )
    evaluated = [i for _, index in evaluation for i in index.tolist()]
    everything = [None] * world
    dist.all_gather_object(everything, evaluated)
    if rank == 0:
        flat = sorted(i for part in everything for i in part)
        print(
            f"{world} ranks; training batches on rank 0: {len(seen) // 4}; stream: {stream_batches} batches a rank; "
            f"evaluation covered {len(flat)} samples, each once: {flat == list(range(64))}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
