"""What a dataset is to conveyor: the two styles, their base classes, and
how the loader tells them apart and reads a batch.

    map-style       dataset[i] -> sample      (+ len(dataset), optional __getitems__)
    iterable-style  iter(dataset) -> samples  (a stream; it shards itself per worker)

:class:`Dataset` and :class:`IterableDataset` are the base classes, and
what their ``+`` makes lives here with them: :class:`ConcatDataset`
(map-style datasets one after another) and :class:`ChainDataset` (iterable
ones). :func:`is_map_dataset` and :func:`is_iterable_dataset` tell the
styles apart by duck typing, torch never imported; :func:`fetch_many` is how
the loader reads one batch of a map-style dataset, and :func:`epoch_of` the
epoch an iterable one says it is at. The datasets read through
an index (TensorDataset, StackDataset, Subset) are in _views.py;
conveyor.dataset names them all.
"""

from __future__ import annotations

import bisect
import itertools
import numbers
import operator
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar
from typing import Iterable as _IterableBase  # noqa: UP035  (same MRO as torch's IterableDataset, so the façade can inherit both)

__all__ = [
    "Dataset",
    "IterableDataset",
    "ConcatDataset",
    "ChainDataset",
    "is_iterable_dataset",
    "is_map_dataset",
    "fetch_many",
    "epoch_of",
]

T_co = TypeVar("T_co", covariant=True)


class InvalidDatasetArgument(ValueError, AssertionError):
    """A bad value where torch raises ``AssertionError`` (caught by either name)."""


class UnsupportedDatasetKind(TypeError, AssertionError):
    """A dataset of the wrong style where torch raises ``AssertionError``."""


# ---------------------------------------------------------------------------
# Base classes
# ---------------------------------------------------------------------------


class Dataset(Generic[T_co]):
    """Base class of map-style datasets: ``dataset[key]`` returns one sample.

    Subclasses implement ``__getitem__`` and usually ``__len__`` (samplers need
    it). They may add ``__getitems__(indices) -> list`` to read a whole batch
    at once; the loader then calls it instead of ``__getitem__`` per index.
    ``a + b`` concatenates two datasets (:class:`ConcatDataset`)::

        >>> class Squares(Dataset):
        ...     def __getitem__(self, i): return i * i
        ...     def __len__(self): return 4
        >>> (Squares() + Squares())[5]
        1
    """

    # No __getitems__ here on purpose: its presence is what tells the loader
    # that a dataset reads batches natively (see fetch_many).

    def __getitem__(self, index: Any) -> T_co:
        raise NotImplementedError(
            f"Subclasses of Dataset should implement __getitem__. {type(self).__name__} does not."
        )

    def __add__(self, other: Dataset[T_co]) -> ConcatDataset[T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[T_co], _IterableBase[T_co]):
    """Base class of iterable-style datasets: ``iter(dataset)`` yields samples.

    Subclasses implement ``__iter__`` (the class is abstract until they do).
    With worker processes every worker iterates its own copy, so the dataset
    should shard itself, e.g. with ``get_worker_info()``. ``a + b`` chains two
    streams (:class:`ChainDataset`)::

        >>> class Count(IterableDataset):
        ...     def __init__(self, n): self.n = n
        ...     def __iter__(self): return iter(range(self.n))
        >>> list(Count(2) + Count(3))
        [0, 1, 0, 1, 2]
    """

    def __add__(self, other: Dataset[T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


# ---------------------------------------------------------------------------
# Telling dataset styles apart (duck typing, torch never imported)
# ---------------------------------------------------------------------------


def _type_defines(obj: Any, method: str) -> bool:
    # Special methods are looked up on the type, and `__iter__ = None` is
    # Python's way of saying "not iterable", hence callable() on the type.
    return callable(getattr(type(obj), method, None))


def _torch_iterable_dataset_class() -> type | None:
    module = sys.modules.get("torch.utils.data")
    return getattr(module, "IterableDataset", None) if module is not None else None


def is_iterable_dataset(obj: Any) -> bool:
    """True when the loader should read ``obj`` by iterating it.

    That is: an :class:`IterableDataset`, a ``torch.utils.data.IterableDataset``
    (checked only when torch is already loaded: otherwise no object can be
    one), or any object with ``__iter__`` but no ``__getitem__`` (a generator,
    a custom stream). Objects with both, such as lists and arrays, are
    map-style::

        >>> is_iterable_dataset(x for x in range(3)), is_iterable_dataset([1, 2])
        (True, False)
    """
    if isinstance(obj, IterableDataset):
        return True
    torch_iterable = _torch_iterable_dataset_class()
    if torch_iterable is not None and isinstance(obj, torch_iterable):
        return True
    return _type_defines(obj, "__iter__") and not _type_defines(obj, "__getitem__")


def is_map_dataset(obj: Any) -> bool:
    """True when the loader should read ``obj`` by index: it has
    ``__getitem__`` and is not iterable-style by :func:`is_iterable_dataset`.

    ``__len__`` is not required (a custom sampler may supply the keys)::

        >>> is_map_dataset([1, 2]), is_map_dataset({"a": 1}), is_map_dataset(iter([1]))
        (True, True, False)
    """
    return _type_defines(obj, "__getitem__") and not is_iterable_dataset(obj)


def epoch_of(dataset: Any) -> int | None:
    """The epoch an iterable dataset says it is at: its ``epoch`` attribute
    when that is an int (not a bool), as ``ShardedIterable``'s and
    ``ShardDataset.stream()``'s are; None when it has none."""
    epoch = getattr(dataset, "epoch", None)
    return int(epoch) if isinstance(epoch, numbers.Integral) and not isinstance(epoch, bool) else None


def _is_batch_sequence(items: Any) -> bool:
    """A sequence of samples: list, tuple, any Sequence, an array or a tensor."""
    if isinstance(items, (str, bytes, Mapping)):
        return False
    if isinstance(items, Sequence):
        return True
    # ndarrays and tensors index and measure like sequences without registering.
    return _type_defines(items, "__len__") and _type_defines(items, "__getitem__")


def read_batch(dataset: Any, indices: Sequence[Any], mismatch: str) -> list[Any]:
    """Samples at ``indices``, through ``__getitems__`` when ``dataset`` has it.

    ``mismatch`` opens the error raised when ``__getitems__`` does not return
    one sample per index.
    """
    getitems = getattr(dataset, "__getitems__", None)
    if not callable(getitems):
        return [dataset[i] for i in indices]
    items = getitems(indices)
    name = type(dataset).__name__
    if not _is_batch_sequence(items):
        raise TypeError(
            f"{name}.__getitems__ returned {type(items).__name__}; it must return a "
            f"sequence (e.g. a list) with one sample per index, in order"
        )
    if len(items) != len(indices):
        raise ValueError(
            f"{mismatch} Expected {len(indices)}, got {len(items)}: {name}.__getitems__ "
            f"must return one sample per index, in order"
        )
    return items if isinstance(items, list) else list(items)


def fetch_many(dataset: Any, indices: Sequence[Any]) -> Any:
    """The samples of a map-style ``dataset`` at ``indices``.

    Calls ``dataset.__getitems__(indices)`` when the dataset defines it (one
    call per batch, as torch's fetcher does) and returns its result as it is,
    so a ``__getitems__`` that returns an already-batched object (a dict of
    columns, say) can pair with a ``collate_fn`` that expects it, as in torch.
    Otherwise ``[dataset[i] for i in indices]``::

        >>> fetch_many(["a", "b", "c"], [2, 0])
        ['c', 'a']
    """
    getitems = getattr(dataset, "__getitems__", None)
    if callable(getitems):
        return getitems(indices)
    return [dataset[i] for i in indices]


# ---------------------------------------------------------------------------
# What `+` makes: datasets one after another
# ---------------------------------------------------------------------------


class ConcatDataset(Dataset[T_co]):
    """Map-style datasets one after another.

    ``cumulative_sizes[k]`` is the total length of the first ``k + 1``
    datasets; negative indices count from the end::

        >>> ds = ConcatDataset([[0, 1, 2], [3, 4]])
        >>> ds.cumulative_sizes, ds[3], ds[-1]
        ([3, 5], 3, 4)
    """

    datasets: list
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        """Running totals of the lengths of ``sequence``'s items."""
        return list(itertools.accumulate(len(d) for d in sequence))

    def __init__(self, datasets: Iterable[Any]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise InvalidDatasetArgument("datasets should not be an empty iterable")
        for position, dataset in enumerate(self.datasets):
            if is_iterable_dataset(dataset):
                raise UnsupportedDatasetKind(
                    f"ConcatDataset does not support IterableDataset: datasets[{position}] "
                    f"is a {type(dataset).__name__}; use ChainDataset to chain streams"
                )
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: Any) -> T_co:
        idx = self._absolute(operator.index(idx))
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        start = self.cumulative_sizes[dataset_idx - 1] if dataset_idx > 0 else 0
        return self.datasets[dataset_idx][idx - start]

    def _absolute(self, idx: int) -> int:
        length = len(self)
        if idx < 0:
            if -idx > length:
                raise ValueError(
                    f"absolute value of index should not exceed dataset length: index {idx}, length {length}"
                )
            return length + idx
        if idx >= length:
            # IndexError, as torch's list lookup gives: it ends old-style iteration.
            raise IndexError(f"index {idx} is out of range for a ConcatDataset of length {length}")
        return idx

    @property
    def cummulative_sizes(self) -> list[int]:
        """Deprecated misspelling of :attr:`cumulative_sizes`, kept for torch code."""
        warnings.warn("`cummulative_sizes` attribute is renamed to `cumulative_sizes`", FutureWarning, stacklevel=2)
        return self.cumulative_sizes


def _require_iterable(dataset: Any) -> None:
    if not is_iterable_dataset(dataset):
        raise UnsupportedDatasetKind(
            f"ChainDataset only supports IterableDataset, got {type(dataset).__name__}; "
            f"use ConcatDataset for map-style datasets"
        )


class ChainDataset(IterableDataset):
    """Iterable datasets one after another, chained as they are iterated.

    ``len()`` is the sum of the members' lengths (each must define it)::

        >>> list(ChainDataset([iter([1, 2]), iter([3])]))
        [1, 2, 3]
    """

    def __init__(self, datasets: Iterable[Any]) -> None:
        # A list, not the iterable itself: a generator argument would chain
        # only once and could not be pickled to workers.
        self.datasets = list(datasets)

    def __iter__(self) -> Iterator[Any]:
        for dataset in self.datasets:
            _require_iterable(dataset)
            yield from dataset

    def __len__(self) -> int:
        for dataset in self.datasets:
            _require_iterable(dataset)
        return sum(len(dataset) for dataset in self.datasets)
