"""A conveyor loader made anew with another batch sampler, and the warning
given when a framework is about to make it anew as torch's own loader.

Frameworks that shard a loader across ranks rebuild it from its arguments.
They build ``torch.utils.data.DataLoader`` unless told otherwise, and then
conveyor is silently out of the loop (no stats, process workers in place
of thread workers, no per-batch seeds, no exact resume). :func:`rebuilt`
is conveyor's own rebuild, used by the integrations: every argument kept,
the statistics shared with the loader it came from.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Optional

__all__ = ["RebuiltLoaderWarning", "rebuilt", "warn_accelerate_rebuild"]


class RebuiltLoaderWarning(UserWarning):
    """A framework is about to replace a conveyor loader with a loader that
    is not conveyor's; the message names the framework and what to use."""


_ACCELERATE_FIX = (
    "To keep conveyor, prepare it with conveyor's Accelerator: "
    "`from conveyor.integrations.accelerate import Accelerator` in place of `from accelerate import Accelerator` "
    "(or call `conveyor.integrations.accelerate.prepare_data_loader(loader, accelerator)`); docs/integrations.md."
)
_TRAINER_FIX = (
    "To keep conveyor, train with `conveyor.integrations.transformers.ConveyorTrainer` (or mix "
    "`ConveyorTrainerMixin` into your Trainer class) and return the conveyor loader from "
    "`conveyor_train_loader()`; docs/integrations.md."
)


def warn_accelerate_rebuild(loader: Any) -> None:
    """Warn that accelerate's ``Accelerator.prepare_data_loader`` is about
    to rebuild ``loader`` as a torch DataLoader, naming transformers'
    Trainer when it is the one asking (its frames are on the stack)."""
    through_trainer = _trainer_on_stack()
    who = (
        "transformers' Trainer (through accelerate's Accelerator.prepare)"
        if through_trainer
        else ("accelerate's Accelerator.prepare")
    )
    warnings.warn(
        f"{who} rebuilds this conveyor {type(loader).__name__} as a torch.utils.data.DataLoader: conveyor will not "
        f"load its batches (its stats stay at 0, thread workers become processes, per-batch seeds and exact "
        f"resume are lost). {_TRAINER_FIX if through_trainer else _ACCELERATE_FIX}",
        RebuiltLoaderWarning,
        stacklevel=_first_outside(("conveyor.", "accelerate.", "transformers.")),
    )


def _trainer_on_stack() -> bool:
    """Whether transformers' Trainer is asking: a frame of transformers, or
    a method of a Trainer (sub)class (an overridden get_train_dataloader)."""
    frame: Optional[Any] = sys._getframe(1)
    while frame is not None:
        if _module(frame).startswith("transformers.") or _is_trainer(frame.f_locals.get("self")):
            return True
        frame = frame.f_back
    return False


def _is_trainer(obj: Any) -> bool:
    return obj is not None and any(
        cls.__name__ == "Trainer" and cls.__module__.startswith("transformers.") for cls in type(obj).__mro__
    )


def _first_outside(prefixes: tuple) -> int:
    """The ``stacklevel`` that points a warning raised by this module's
    caller at the first frame outside the ``prefixes`` modules (the user's
    line that called the framework)."""
    level, frame = 1, sys._getframe(1)  # type: int, Optional[Any]
    while frame is not None and (_module(frame).startswith(prefixes) or _module(frame) == __name__):
        level, frame = level + 1, frame.f_back
    return level


def _module(frame: Any) -> str:
    return str(frame.f_globals.get("__name__", ""))


def rebuilt(loader: Any, cls: type, batch_sampler: Any = None, **extra: Any) -> Any:
    """A ``cls`` (a conveyor DataLoader class) with ``loader``'s arguments,
    ``batch_sampler`` in place of its batching (None: ``loader``'s own, for
    an iterable dataset) and ``extra`` keyword arguments for ``cls``. It
    records its statistics into ``loader``'s recorder, so that both report
    the same batches and callbacks registered with ``on_stats`` keep firing."""
    batching: dict[str, Any]
    if batch_sampler is None:
        batching = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
        if not loader._iterable:
            batching["sampler"] = loader.sampler
    else:
        batching = {"batch_sampler": batch_sampler}
    made = cls(
        loader.dataset,
        **batching,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor if loader._prefetch_given else None,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order,
        seed=loader.seed,
        stall_warning=loader.stall_warning,
        collect_stats=loader._stats is not None,
        reads_in_flight=loader.reads_in_flight,
        worker_method=loader.worker_method,
        skip_bad_samples=loader.skip_bad_samples,
        **extra,
    )
    made._stats = loader._stats  # (the progress bar, if any, lives there too)
    return made
