"""transformers.Trainer through conveyor, run by tests/integrations/test_transformers.py
under torchrun on 2 ranks (gloo, CPU): a tiny GPT-2 built from a config (no
download) trains 2 epochs without a stop; again, stopping after a
checkpoint in the middle of epoch 1; and once more, resumed from that
checkpoint. Each rank writes every micro-batch it trained on (indices,
tokens, loss) and its loader's stats to ``OUT/rank-<r>.json``.

    python -m torch.distributed.run --nproc-per-node 2 tests/integrations/job_trainer.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

import conveyor.torch as data
from conveyor.integrations.transformers import ConveyorTrainer

STOP_AT_STEP = 4  # 3 optimizer steps an epoch (6 batches, 2 accumulated): step 4 is 2 batches into epoch 1


class Tokens(data.Dataset):
    """48 sequences of 8 tokens; each token is shifted by a random
    "augmentation" drawn in the worker (torch's generator, seeded per batch)."""

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> dict:
        tokens = (torch.arange(8) * (i + 1) + torch.randint(0, 5, (1,))) % 32
        return {"input_ids": tokens, "labels": tokens, "index": torch.tensor(i)}


def collate(samples: list) -> dict:
    return {key: torch.stack([sample[key] for sample in samples]) for key in samples[0]}


class Recording(ConveyorTrainer):
    """Records each micro-batch the model trains on, and its loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: list = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        index = inputs.pop("index")
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.trained.append({"index": index.tolist(), "tokens": inputs["input_ids"].tolist(), "loss": float(loss)})
        return loss


class StopAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == STOP_AT_STEP:
            control.should_training_stop = True


def train(out: str, run: str, resume: str | None = None, stop: bool = False) -> Recording:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=os.path.join(out, run),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        learning_rate=1e-2,
        seed=11,
        dataloader_num_workers=2,
        remove_unused_columns=False,
        save_strategy="steps",
        save_steps=STOP_AT_STEP,
        save_only_model=False,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    trainer = Recording(
        model=model, args=args, train_dataset=Tokens(), data_collator=collate, callbacks=[StopAt()] if stop else []
    )
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def main(out: str) -> None:
    whole = train(out, "whole")
    rank = whole.args.process_index
    stopped = train(out, "stopped", stop=True)
    checkpoint = os.path.join(out, "stopped", f"checkpoint-{STOP_AT_STEP}")
    resumed = train(out, "resumed", resume=checkpoint)
    result = {
        "ranks": whole.args.world_size,
        "whole": whole.trained,
        "stopped": stopped.trained,
        "resumed": resumed.trained,
        "saved_state": os.path.exists(os.path.join(checkpoint, f"conveyor_loader_0_rank{rank}.json")),
        "loader_type": type(resumed.callback_handler.train_dataloader).__name__,
        "stats": resumed.callback_handler.train_dataloader.stats().batches,
    }
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
