"""The sharding DistributedSampler, ShardedSampler and TokenBudgetBatchSampler
share: one replica's count (padded or cut to divide evenly), its share of a
list (every ``num_replicas``-th item), and the world's size and rank checked
or read from torch.distributed."""

from __future__ import annotations

import math
import sys
from typing import Any

from .arguments import _check_positive_int, _is_int


def _per_replica(total: int, num_replicas: int, drop_last: bool, rank: int = 0, even: bool = True) -> int:
    """Items replica ``rank`` gets: all of them, padded, or (drop_last) the
    even part; with ``even=False``, its share as it falls (no padding)."""
    if not even:
        return len(range(rank, total, num_replicas))
    if drop_last and total % num_replicas != 0:
        return math.ceil((total - num_replicas) / num_replicas)
    return math.ceil(total / num_replicas)


def _shard(items: list[Any], num_replicas: int, rank: int, drop_last: bool, even: bool = True) -> list[Any]:
    """``rank``'s share of ``items``: padded by repeating from the start, or
    cut, to divide evenly; with ``even=False``, every ``num_replicas``-th as they fall."""
    if not even:
        return items[rank::num_replicas]
    total = _per_replica(len(items), num_replicas, drop_last) * num_replicas
    padding = total - len(items)
    if padding > 0:
        items = items + (items * math.ceil(padding / len(items)))[:padding]
    else:
        items = items[:total]
    return items[rank:total:num_replicas]


def _world_from_torch(name: str, kind: str = "DistributedSampler") -> int:
    """``num_replicas`` or ``rank`` from torch.distributed, only when the user's program initialised it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"{kind}: {name} was not given and torch.distributed is not initialized; "
            f"pass num_replicas=<world size> and rank=<this process's rank>, "
            f"or call torch.distributed.init_process_group() first"
        )
    return dist.get_world_size() if name == "num_replicas" else dist.get_rank()


def _check_rank(num_replicas: Any, rank: Any) -> tuple[int, int]:
    num_replicas = _check_positive_int("num_replicas", num_replicas)
    if not _is_int(rank) or rank >= num_replicas or rank < 0:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
    return num_replicas, int(rank)
