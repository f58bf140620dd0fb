"""conveyor: a data loader for training loops, with torch.utils.data's API.

The core speaks numpy and imports no framework; ``conveyor.torch`` is the
same API returning torch tensors::

    import conveyor                     # numpy batches
    import conveyor.torch as data       # drop-in for torch.utils.data
"""

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

__version__ = "0.1.0"

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
