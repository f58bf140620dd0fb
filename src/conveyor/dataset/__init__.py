"""Datasets: the protocol conveyor reads, and helpers that compose datasets.

A dataset is any object with one of two shapes; nothing requires subclassing,
so ``torch.utils.data`` datasets work as they are::

    map-style       dataset[i] -> sample      (+ len(dataset), optional __getitems__)
    iterable-style  iter(dataset) -> samples  (a stream; it shards itself per worker)

:func:`is_map_dataset` and :func:`is_iterable_dataset` tell the two apart
without importing torch; :func:`fetch_many` is how the loader reads one batch
of a map-style dataset.

The helpers keep ``torch.utils.data``'s names and behaviour (same samples,
lengths and error types) and accept numpy arrays wherever torch takes tensors:

* :class:`TensorDataset`  — rows of equally long arrays or tensors;
* :class:`StackDataset`   — samples of several datasets side by side;
* :class:`ConcatDataset`  — map-style datasets one after another;
* :class:`ChainDataset`   — iterable datasets one after another;
* :class:`Subset`         — a dataset seen through a list of indices;
* ``random_split``        — non-overlapping random subsets;
* :class:`ShardedIterable` — an iterable shared out over workers and ranks;
* :class:`CompactList`    — a list that forked workers read without copying it.

Where torch raises ``AssertionError`` for bad arguments, conveyor raises an
error that is both the ``ValueError``/``TypeError`` its own convention asks for
and an ``AssertionError``, so ``except`` clauses written for either keep working.

This package names them all; they live by concept in _protocol.py (the
base classes, what their ``+`` makes, telling styles apart, reading a batch),
_views.py (the datasets read through an index), _splits.py, _sharding.py
and _compact.py.
"""

from __future__ import annotations

import sys

from . import _compact, _protocol, _sharding, _splits, _views
from ._compact import CompactList
from ._protocol import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    fetch_many,
    is_iterable_dataset,
    is_map_dataset,
)
from ._protocol import epoch_of as epoch_of  # (not public: the loader's _dataset_epoch.py reads a dataset's epoch)
from ._sharding import ShardedIterable
from ._sharding import distributed_world as distributed_world  # (not public: shards/stream.py shards by them too)
from ._sharding import torch_worker_info as torch_worker_info
from ._splits import random_split
from ._views import StackDataset, Subset, TensorDataset

#: The modules' names before this package: a pickle names a class by its module
#: (``conveyor.dataset_views.Subset``), so old pickles load through these aliases.
_FORMER_NAMES = {
    "conveyor.dataset_protocol": _protocol,
    "conveyor.dataset_views": _views,
    "conveyor.splits": _splits,
    "conveyor.sharding": _sharding,
    "conveyor.compact": _compact,
}
for _name, _module in _FORMER_NAMES.items():
    sys.modules.setdefault(_name, _module)

__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
    "random_split",
    "ShardedIterable",
    "CompactList",
    "is_iterable_dataset",
    "is_map_dataset",
    "fetch_many",
]
