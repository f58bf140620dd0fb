"""Map-style datasets read through an index, with torch.utils.data's names
and behaviour (same samples, lengths and error types), taking numpy arrays
wherever torch takes tensors:

* :class:`TensorDataset` — rows of equally long arrays or tensors;
* :class:`StackDataset`  — samples of several datasets side by side;
* :class:`Subset`        — a dataset seen through a list of indices
  (``random_split``, in _splits.py, cuts a dataset into Subsets).

A batch of them is read through each inner dataset's ``__getitems__`` when it
has one (_protocol.py's reading), so batched readers stay batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast, overload

from ._protocol import Dataset, InvalidDatasetArgument, fetch_many, read_batch

__all__ = ["TensorDataset", "StackDataset", "Subset"]

T_co = TypeVar("T_co", covariant=True)
#: A StackDataset's sample: a tuple (datasets given positionally) or a dict (given by keyword), as torch's.
_Stacked = TypeVar("_Stacked", bound="tuple[Any, ...] | dict[str, Any]")


def _first_dim(array: Any, position: int) -> int:
    shape = getattr(array, "shape", None)
    if shape is None:
        raise TypeError(
            f"TensorDataset takes numpy arrays or torch tensors; argument {position} "
            f"is a {type(array).__name__} (wrap it with numpy.asarray)"
        )
    return shape[0]


class TensorDataset(Dataset[tuple]):
    """Rows of arrays: sample ``i`` is ``tuple(a[i] for a in tensors)``.

    Takes numpy arrays, torch tensors or a mix, all with the same first
    dimension. Torch tensors stay tensors; conveyor never converts them::

        >>> import numpy as np
        >>> ds = TensorDataset(np.arange(6).reshape(3, 2), np.array([7, 8, 9]))
        >>> len(ds), [a.tolist() for a in ds[1]]
        (3, [[2, 3], 8])
    """

    tensors: tuple

    def __init__(self, *tensors: Any) -> None:
        if not tensors:
            raise ValueError("TensorDataset needs at least one array or tensor")
        sizes = [_first_dim(t, position) for position, t in enumerate(tensors)]
        if any(size != sizes[0] for size in sizes):
            raise InvalidDatasetArgument(
                f"Size mismatch between tensors: first dimensions are {sizes}; all must be equal"
            )
        self.tensors = tensors

    def __getitem__(self, index: Any) -> tuple:
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])


def _common_length(datasets: Sequence[Any], names: Sequence[str]) -> int:
    lengths = [len(d) for d in datasets]
    if any(length != lengths[0] for length in lengths):
        listed = ", ".join(f"{name}={length}" for name, length in zip(names, lengths))
        raise ValueError(f"Size mismatch between datasets: lengths are {listed}")
    return lengths[0]


class StackDataset(Dataset[_Stacked]):
    """Several equally long datasets side by side.

    Positional datasets give tuple samples, keyword datasets dict samples::

        >>> StackDataset([1, 2], ["a", "b"])[1]
        (2, 'b')
        >>> StackDataset(x=[1, 2], y=["a", "b"])[0]
        {'x': 1, 'y': 'a'}

    ``__getitems__`` reads each child with its own ``__getitems__`` when it
    has one, so batched readers stay batched.
    """

    datasets: tuple | dict

    @overload
    def __init__(self: StackDataset[tuple[Any, ...]], *args: Any) -> None: ...

    @overload
    def __init__(self: StackDataset[dict[str, Any]], **kwargs: Any) -> None: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args and kwargs:
            raise ValueError(
                "Supported either ``tuple``- (via ``args``) or ``dict``- (via ``kwargs``) "
                "like input/output, but both types are given. Pass all datasets "
                "positionally or all by keyword."
            )
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        if args:
            self._length = _common_length(args, [f"args[{i}]" for i in range(len(args))])
            self.datasets = args
        else:
            self._length = _common_length(list(kwargs.values()), list(kwargs))
            self.datasets = kwargs

    def __getitem__(self, index: Any) -> _Stacked:
        # (the casts: a dict of datasets is what makes the sample a dict, which the checker cannot follow)
        if isinstance(self.datasets, dict):
            return cast(_Stacked, {key: dataset[index] for key, dataset in self.datasets.items()})
        return cast(_Stacked, tuple(dataset[index] for dataset in self.datasets))

    def __getitems__(self, indices: Sequence[Any]) -> list[_Stacked]:
        if isinstance(self.datasets, dict):
            by_key = {key: self._column(d, indices) for key, d in self.datasets.items()}
            return [cast(_Stacked, dict(zip(by_key, row))) for row in zip(*by_key.values())]
        columns = [self._column(d, indices) for d in self.datasets]
        return [cast(_Stacked, row) for row in zip(*columns)]

    @staticmethod
    def _column(dataset: Any, indices: Sequence[Any]) -> list:
        return read_batch(dataset, indices, "Nested dataset's output size mismatch.")

    def __len__(self) -> int:
        return self._length


class Subset(Dataset[T_co]):
    """``dataset`` seen through ``indices``: ``subset[i] == dataset[indices[i]]``.

        >>> s = Subset(["a", "b", "c", "d"], [3, 1])
        >>> len(s), s[0], s.__getitems__([1, 0])
        (2, 'd', ['b', 'd'])

    A subclass that overrides ``__getitem__`` must override ``__getitems__``
    too (the loader reads batches through it), as in torch.
    """

    dataset: Any
    indices: Sequence[int]

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        cls = type(self)
        if cls.__getitem__ is not Subset.__getitem__ and cls.__getitems__ is Subset.__getitems__:
            raise NotImplementedError(
                f"{cls.__name__} overrides __getitem__ but not __getitems__. The loader "
                f"reads a Subset's batches through __getitems__, so it would bypass your "
                f"__getitem__. Add, for example:\n\n"
                f"def __getitems__(self, indices):\n"
                f"    return [self[i] for i in indices]"
            )

    def __getitem__(self, idx: Any) -> T_co:
        if isinstance(idx, list):
            return self.dataset[[self.indices[i] for i in idx]]
        return self.dataset[self.indices[idx]]

    def __getitems__(self, indices: Sequence[int]) -> list[T_co]:
        """Samples at ``indices``, read through the dataset's ``__getitems__``
        with the mapped indices when it has one."""
        return fetch_many(self.dataset, [self.indices[i] for i in indices])

    def __len__(self) -> int:
        return len(self.indices)
