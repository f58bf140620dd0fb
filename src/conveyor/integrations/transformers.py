"""transformers' Trainer training through conveyor.

::

    from conveyor.integrations.transformers import ConveyorTrainer   # was: from transformers import Trainer

    trainer = ConveyorTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator)
    trainer.train()                                   # conveyor loads every training batch, on each rank its share
    trainer.train(resume_from_checkpoint=True)        # mid-epoch: the same next batches as the run that saved

For a Trainer subclass of your own, mix ``ConveyorTrainerMixin`` in before
it: ``class MyTrainer(ConveyorTrainerMixin, MyBaseTrainer)``.

What changes in the Trainer:

    get_train_dataloader() ──▶ conveyor_train_loader()      the conveyor loader (override it for your own)
                           ──▶ accelerate.prepare_data_loader(loader, trainer.accelerator)
                               (this rank's share, as accelerate deals a torch loader; accelerate.py)
    _save_checkpoint()     ──▶ + each rank's loader state in checkpoint-N/conveyor_loader_0_rank<r>.json
    _run_epoch() resumed   ──▶ the loader loads that state, and Trainer's skip_first_batches returns
                               it as it is: the epoch goes on from there without loading the batches before

Trainer calls accelerate's ``skip_first_batches`` by its name in
``transformers.trainer``; while an epoch runs, that name points at
conveyor's (``accelerate.skip_first_batches``, which hands any other loader
to accelerate's), and is put back after. Evaluation loaders stay Trainer's.
Tested with transformers 5.24 (its private ``_run_epoch`` and
``_save_checkpoint`` are extended, not replaced).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any, Iterator

import transformers.trainer as _trainer_module
from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

import conveyor.torch as _ctorch
from conveyor.dataset import is_iterable_dataset

from ._accelerate_share import load_states, save_states
from .accelerate import prepare_data_loader, skip_first_batches

__all__ = ["ConveyorTrainer", "ConveyorTrainerMixin"]

if TYPE_CHECKING:  # (a type checker reads the mixin as the Trainer it is mixed into)
    _MixedInto = Trainer
else:
    _MixedInto = object


class ConveyorTrainerMixin(_MixedInto):
    """Makes a ``transformers.Trainer`` (sub)class train through conveyor;
    put it before the Trainer class among the bases."""

    def conveyor_train_loader(self) -> Any:
        """The training loader, before it is prepared for the ranks: a
        ``conveyor.torch.DataLoader`` built from the TrainingArguments as
        Trainer builds its own (``per_device_train_batch_size``, the
        collator without unused columns, ``dataloader_num_workers``,
        ``_pin_memory``, ``_persistent_workers``, ``_prefetch_factor``,
        ``_drop_last``, ``_multiprocessing_context``), shuffled from
        ``seed=`` (``data_seed``, else ``seed``) unless
        ``train_sampling_strategy`` asks for another sampler. Override it to
        return a loader of your own."""
        dataset = self.train_dataset
        if dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        args = self.args
        collator = self.data_collator
        datasets = sys.modules.get("datasets")
        if datasets is not None and isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        options: dict[str, Any] = {
            "batch_size": self._train_batch_size,
            "collate_fn": collator,
            "num_workers": args.dataloader_num_workers,
            "pin_memory": args.dataloader_pin_memory,
            "persistent_workers": args.dataloader_persistent_workers and args.dataloader_num_workers > 0,
            "multiprocessing_context": args.dataloader_multiprocessing_context,
            "prefetch_factor": args.dataloader_prefetch_factor,
            "in_order": getattr(args, "dataloader_in_order", True),
        }
        if is_iterable_dataset(dataset):
            return _ctorch.DataLoader(dataset, **options)
        seed = args.data_seed if args.data_seed is not None else args.seed
        return _ctorch.DataLoader(
            dataset, **options, drop_last=args.dataloader_drop_last, seed=seed, **self._conveyor_order(dataset)
        )

    def _conveyor_order(self, dataset: Any) -> dict[str, Any]:
        """How the training loader orders ``dataset``: conveyor's shuffle
        for Trainer's RandomSampler, its order for a SequentialSampler,
        Trainer's sampler for any other strategy."""
        import torch.utils.data as tud

        sampler = self._get_train_sampler(dataset)
        if sampler is None or type(sampler) is tud.RandomSampler:
            return {"shuffle": sampler is not None}
        if type(sampler) is tud.SequentialSampler:
            return {"shuffle": False}
        if getattr(sampler, "dp_size", 1) > 1 or type(sampler).__name__ == "BatchRebalanceSampler":
            raise ValueError(
                f"ConveyorTrainer: train_sampling_strategy={self.args.train_sampling_strategy!r} gives a sampler that "
                f"shares batches out over the ranks itself; return a loader of your own from conveyor_train_loader()"
            )
        return {"sampler": sampler}

    def get_train_dataloader(self) -> Any:
        """:meth:`conveyor_train_loader`, prepared for this rank by conveyor."""
        loader = self.conveyor_train_loader()
        if not isinstance(loader, _ctorch.DataLoader):
            raise TypeError(
                f"conveyor_train_loader() must return a conveyor.torch.DataLoader, got {type(loader).__name__}"
            )
        return prepare_data_loader(loader, self.accelerator)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        save_states(self.accelerator, folder)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        checkpoint = kwargs.get("resume_from_checkpoint")
        if checkpoint is not None and kwargs.get("epoch") == kwargs.get("epochs_trained"):
            load_states(self.accelerator, checkpoint, required=False)  # (without one, skip_first_batches re-reads)
        with _skips_through_conveyor():
            return super()._run_epoch(*args, **kwargs)  # type: ignore[no-untyped-call]  # (transformers does not annotate it)


@contextlib.contextmanager
def _skips_through_conveyor() -> Iterator[None]:
    """While the block runs, ``transformers.trainer.skip_first_batches`` is conveyor's."""
    original = getattr(_trainer_module, "skip_first_batches", None)
    if original is None:
        yield
        return
    setattr(_trainer_module, "skip_first_batches", skip_first_batches)  # (a name it imports, not one it exports)
    try:
        yield
    finally:
        setattr(_trainer_module, "skip_first_batches", original)


class ConveyorTrainer(ConveyorTrainerMixin, Trainer):
    """``transformers.Trainer`` training through conveyor (see the module
    docstring); takes Trainer's arguments."""
