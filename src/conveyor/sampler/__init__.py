"""Samplers: the order in which a loader visits a dataset, resumable at any item.

::

    (seed, epoch) or generator ──▶ sampler.__iter__ ──▶ indices ──▶ BatchSampler ──▶ batches
                                        │ draws chunks (a permutation, 32 random ints, ...)
                                        └─ _Cursor: epoch, replay record, items yielded so far

The samplers carry torch.utils.data's names, arguments, lengths and error
messages; every one can report and restore its position (``state_dict``).

* ``resumable``    the cursor, the resume point, the state dict and its checks
* ``draws``        where random draws come from (``_flavor``, generators, seeds)
* ``fingerprint``  the arguments that shape an order, as a state records them (weights' CRC-32, ...)
* ``samplers``     Sampler, SequentialSampler, RandomSampler, SubsetRandomSampler, WeightedRandomSampler
* ``batch``        BatchSampler
* ``replay``       resuming a sampler that is not conveyor's, by replaying its iteration
* ``distributed``  DistributedSampler (a stored or a computed order)
* ``sharded``      ShardedSampler
* ``sharding``     the sharding they and TokenBudgetBatchSampler share (pad or cut, every n-th)
* ``permutation``  KeyedPermutation: a keyed permutation of [0, n), computed per position
* ``order``        order="stored" | "computed" | "auto": the choice, the threshold, computed blocks
* ``token_budget`` TokenBudgetBatchSampler
* ``permutation``  KeyedPermutation: a keyed permutation of [0, n), computed per position
* ``block_order``  the block order over shards (shards shuffled, samples within windows of shards)
* ``shard_blocks`` ShardBlockSampler: a ShardDataset's indices in the block order
* ``arguments``    the argument checks they share
"""

from .batch import BatchSampler
from .distributed import DistributedSampler
from .replay import (  # noqa: F401  (used by loader, state)
    batch_fingerprint,
    fingerprint_problem,
    replay,
    replay_point,
    replay_point_problem,
    restore_replay_point,
)
from .resumable import _has_position  # noqa: F401  (used by state)
from .samplers import RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler
from .shard_blocks import ShardBlockSampler
from .sharded import ShardedSampler
from .token_budget import TokenBudgetBatchSampler

__all__ = [
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "ShardedSampler",
    "ShardBlockSampler",
    "TokenBudgetBatchSampler",
]
