"""One rank's share of a conveyor loader's batches under accelerate, and the
per-rank loader states written beside ``accelerator.save_state``.

    loader.batch_sampler ──▶ RankShare (accelerate's BatchSamplerShard: the same
                             batches per rank as accelerate gives a torch loader)
                         ──▶ conveyor's plan, workers, seeds (unchanged)

    accelerator.save_state(dir) ──pre-hook──▶ dir/conveyor_loader_{i}_rank{r}.json (each rank its own)
    accelerator.load_state(dir) ──pre-hook──▶ loader.load_state_dict(...) (each rank its own)

Each rank saves its own file because its state is its own (the batches it
was dealt, and, without ``seed=``, its base seed). accelerate's own path
for stateful loaders writes one ``dl_state_dict.bin`` from every rank, so
conveyor's loaders leave it alone (``use_stateful_dataloader`` is False).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Mapping
from typing import Any

from accelerate.data_loader import BatchSamplerShard

from conveyor.sampler.replay import replay_point, replay_point_problem, restore_replay_point

__all__ = ["RankShare", "SavesPerRank", "install_checkpoint_hooks", "load_states", "save_states", "state_file"]


class RankShare(BatchSamplerShard):
    """accelerate's ``BatchSamplerShard`` (this rank's batches of the
    loader's batch sampler: the same split, padding and ``split_batches``)
    with the state conveyor's loader resumes it by.

    Its state is what replays the wrapped batch sampler's draw of the epoch
    (taken by the loader before the epoch's first batch). It has no position:
    a resumed loader draws the share's first batches again, without loading
    them, to stand where the saved run stood.
    """

    _KIND = "RankShare"

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "kind": self._KIND,
            "num_processes": self.num_processes,
            "split_batches": self.split_batches,
            "even_batches": self.even_batches,
            "batches": replay_point(self.batch_sampler, "torch"),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        problem = _state_problem(self, state)
        if problem is not None:
            raise ValueError(
                f"RankShare.load_state_dict: the state {problem}; load the state saved by the same rank of a job "
                f"with as many processes and the same split_batches/even_batches"
            )
        restore_replay_point(self.batch_sampler, state["batches"], "torch")

    def set_epoch(self, epoch: int) -> None:
        """Tell the wrapped batch sampler (and, through it, its sampler)."""
        target = self.batch_sampler
        if not hasattr(target, "set_epoch"):
            target = getattr(target, "sampler", None)
        if hasattr(target, "set_epoch"):
            target.set_epoch(epoch)


def _state_problem(share: RankShare, state: Any) -> Any:
    """What is wrong with ``state`` for ``share`` (None: nothing)."""
    if not isinstance(state, Mapping) or state.get("kind") != RankShare._KIND or state.get("version") != 1:
        return f"is {state!r}, where a RankShare state (version 1) belongs"
    for key in ("num_processes", "split_batches", "even_batches"):
        if state.get(key) != getattr(share, key):
            return f"has {key}={state.get(key)!r}, where this loader has {getattr(share, key)!r}"
    return replay_point_problem(share.batch_sampler, state.get("batches"), "torch")


def state_file(folder: str, index: int, rank: int) -> str:
    """Where rank ``rank`` keeps the state of the ``index``-th conveyor loader of an accelerator."""
    return os.path.join(folder, f"conveyor_loader_{index}_rank{rank}.json")


#: Accelerators whose save_state/load_state already carry conveyor's loaders.
_hooked: "weakref.WeakSet[Any]" = weakref.WeakSet()


def install_checkpoint_hooks(accelerator: Any) -> None:
    """Make ``accelerator.save_state`` write, and ``load_state`` read, the
    state of every conveyor loader it prepared, one file per rank (once per
    accelerator; accelerate's public pre-hooks)."""
    if accelerator in _hooked:
        return
    _hooked.add(accelerator)
    accelerator.register_save_state_pre_hook(lambda models, weights, folder: save_states(accelerator, folder))
    accelerator.register_load_state_pre_hook(lambda models, folder: load_states(accelerator, folder))


class SavesPerRank:
    """A loader whose state each rank saves in a file of its own beside
    ``accelerator.save_state`` (by the hooks above): ``AcceleratedDataLoader``
    (accelerate.py) is one. The hooks find the loaders to save by this class."""

    __slots__ = ()


def _conveyor_loaders(accelerator: Any) -> list:
    return [loader for loader in accelerator._dataloaders if isinstance(loader, SavesPerRank)]


def save_states(accelerator: Any, folder: str) -> None:
    """Write the state of each conveyor loader ``accelerator`` prepared into ``folder``, this rank's own file."""
    os.makedirs(folder, exist_ok=True)
    for index, loader in enumerate(_conveyor_loaders(accelerator)):
        path = state_file(folder, index, accelerator.process_index)
        state = loader.state_dict()
        try:
            text = json.dumps(state)
        except TypeError:  # a dataset's or sampler's own state that JSON does not take
            path, text = path[: -len(".json")] + ".pt", None
        with open(path + ".tmp", "w" if text is not None else "wb") as out:
            if text is not None:
                out.write(text)
            else:
                import torch

                torch.save(state, out)
        os.replace(path + ".tmp", path)  # (a reader never sees half a file)


def load_states(accelerator: Any, folder: str, required: bool = True) -> bool:
    """Load each conveyor loader's state from ``folder``; without its file:
    an error, or (``required`` false) False and nothing loaded."""
    loaders = _conveyor_loaders(accelerator)
    paths = [state_file(folder, index, accelerator.process_index) for index in range(len(loaders))]
    if not required and not all(os.path.exists(p) or os.path.exists(p[: -len(".json")] + ".pt") for p in paths):
        return False
    for index, loader in enumerate(loaders):
        path = state_file(folder, index, accelerator.process_index)
        pickled = path[: -len(".json")] + ".pt"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as source:
                state = json.load(source)
        elif os.path.exists(pickled):
            import torch

            state = torch.load(
                pickled, weights_only=False
            )  # (written by save_states beside the checkpoint's own pickles)
        else:
            raise FileNotFoundError(
                f"accelerator.load_state({folder!r}): there is no {os.path.basename(path)}, the state of conveyor "
                f"loader {index} on rank {accelerator.process_index}; load a checkpoint that "
                f"accelerator.save_state wrote with as many conveyor loaders prepared, on as many processes"
            )
        loader.load_state_dict(state)
    return True
