"""conveyor: a data loader for training loops, with torch.utils.data's API.

The core speaks numpy and imports no framework; ``conveyor.torch`` is the
same API returning torch tensors::

    import conveyor                     # numpy batches
    import conveyor.torch as data       # drop-in for torch.utils.data
"""

# The names below are imported when first used (``__getattr__``), not with the
# package: a worker process imports ``conveyor._engine.workers`` and what its
# dataset needs, and so starts in about half the time a whole
# ``import conveyor`` takes (a spawn or forkserver worker, a script run by
# ``python -c``). The modules' names before the loader, state and dataset
# packages are found the same way, on import (``_former_names``).

from typing import TYPE_CHECKING, Any

from . import _former_names

if TYPE_CHECKING:
    from ._engine.errors import TransportError, WorkerDiedError
    from ._engine.executor.watchdog import StallWarning
    from ._engine.info import WorkerInfo, get_worker_info
    from .collate import PadCollate, default_collate, default_convert, register_collate
    from .dataset import (
        ChainDataset,
        CompactList,
        ConcatDataset,
        Dataset,
        IterableDataset,
        ShardedIterable,
        StackDataset,
        Subset,
        TensorDataset,
        random_split,
    )
    from .loader import DataLoader
    from .mix import IterableMix, Mix
    from .packing import Pack
    from .ray_options import RayWorkers
    from .rng import SampleRandom, derive_seed, sample_rng
    from .sampler import (
        BatchSampler,
        DistributedSampler,
        RandomSampler,
        Sampler,
        SequentialSampler,
        ShardBlockSampler,
        ShardedSampler,
        SubsetRandomSampler,
        TokenBudgetBatchSampler,
        WeightedRandomSampler,
    )
    from .skips import BadSampleBudgetExceeded, SkipBudget, SkippedSample
    from .state import Stateful
    from .text import TokenFiles

__version__ = "0.1.0"

#: Public name -> the module (relative to this package) that defines it.
_EXPORTS = {
    "TransportError": "._engine.errors",
    "WorkerDiedError": "._engine.errors",
    "StallWarning": "._engine.executor.watchdog",
    "WorkerInfo": "._engine.info",
    "get_worker_info": "._engine.info",
    "PadCollate": ".collate",
    "default_collate": ".collate",
    "default_convert": ".collate",
    "register_collate": ".collate",
    "ChainDataset": ".dataset",
    "CompactList": ".dataset",
    "ConcatDataset": ".dataset",
    "Dataset": ".dataset",
    "IterableDataset": ".dataset",
    "ShardedIterable": ".dataset",
    "StackDataset": ".dataset",
    "Subset": ".dataset",
    "TensorDataset": ".dataset",
    "random_split": ".dataset",
    "DataLoader": ".loader",
    "IterableMix": ".mix",
    "Mix": ".mix",
    "Pack": ".packing",
    "RayWorkers": ".ray_options",
    "SampleRandom": ".rng",
    "derive_seed": ".rng",
    "sample_rng": ".rng",
    "BatchSampler": ".sampler",
    "DistributedSampler": ".sampler",
    "RandomSampler": ".sampler",
    "Sampler": ".sampler",
    "SequentialSampler": ".sampler",
    "ShardBlockSampler": ".sampler",
    "ShardedSampler": ".sampler",
    "SubsetRandomSampler": ".sampler",
    "TokenBudgetBatchSampler": ".sampler",
    "WeightedRandomSampler": ".sampler",
    "BadSampleBudgetExceeded": ".skips",
    "SkipBudget": ".skips",
    "SkippedSample": ".skips",
    "Stateful": ".state",
    "TokenFiles": ".text",
}

_former_names.install()


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (then kept as a module attribute)."""
    import importlib
    import importlib.util

    home = _EXPORTS.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # (a subpackage: conveyor.stats, conveyor.store)
    raise AttributeError(f"module 'conveyor' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "BadSampleBudgetExceeded",
    "BatchSampler",
    "ChainDataset",
    "CompactList",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "IterableMix",
    "Mix",
    "Pack",
    "PadCollate",
    "RandomSampler",
    "RayWorkers",
    "SampleRandom",
    "Sampler",
    "SequentialSampler",
    "ShardBlockSampler",
    "ShardedIterable",
    "ShardedSampler",
    "SkipBudget",
    "SkippedSample",
    "StackDataset",
    "StallWarning",
    "Stateful",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "TokenBudgetBatchSampler",
    "TokenFiles",
    "TransportError",
    "WeightedRandomSampler",
    "WorkerDiedError",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "derive_seed",
    "get_worker_info",
    "random_split",
    "register_collate",
    "sample_rng",
]
