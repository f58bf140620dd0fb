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
* ``random_split``        — non-overlapping random subsets (in splits.py).

Where torch raises ``AssertionError`` for bad arguments, conveyor raises an
error that is both the ``ValueError``/``TypeError`` its own convention asks for
and an ``AssertionError``, so ``except`` clauses written for either keep working.

This module names them all; they live by concept in dataset_protocol.py (the
base classes, what their ``+`` makes, telling styles apart, reading a batch)
and dataset_views.py (the datasets read through an index).
"""

from __future__ import annotations

from .dataset_protocol import (
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    fetch_many,
    is_iterable_dataset,
    is_map_dataset,
)
from .dataset_views import StackDataset, Subset, TensorDataset

__all__ = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
    "is_iterable_dataset",
    "is_map_dataset",
    "fetch_many",
]
