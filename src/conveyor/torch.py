"""The torch façade: ``import conveyor.torch as data`` in place of
``import torch.utils.data as data``.

Same names, same arguments, same results as torch.utils.data:

* batches are torch tensors (numpy arrays made by the core are handed over
  zero-copy with ``torch.from_numpy``);
* samplers, ``random_split`` and the DataLoader accept ``torch.Generator`` and,
  without one, draw from torch's global generator exactly as torch does, so
  ``torch.manual_seed(s)`` gives the same order as torch.utils.data;
* datasets and samplers are also instances of torch's base classes, so code
  that checks ``isinstance(x, torch.utils.data.Dataset)`` keeps working.
* ``TokenFiles`` hands out each document as a ``torch.int64`` tensor (what
  embeddings and losses take), where the core gives the file's uint16/uint32.

Example::

    import conveyor.torch as data

    loader = data.DataLoader(data.TensorDataset(torch.arange(10)), batch_size=4, shuffle=True)
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any, Generic, Optional, Sequence, TypeVar, Union, overload

import numpy as _np
import torch as _torch
import torch.utils.data as _tud
from torch.utils.data.dataloader import _DatasetKind

from . import __all__ as _core_names
from . import collate as _collate
from . import dataset as _dataset
from . import loader as _loader
from . import mix as _mix
from . import packing as _packing
from . import sampler as _sampler
from . import text as _text
from ._engine.errors import TransportError, WorkerDiedError  # noqa: F401  (re-exported)
from ._engine.executor.watchdog import StallWarning  # noqa: F401  (re-exported)
from ._engine.info import WorkerInfo, get_worker_info  # noqa: F401  (re-exported)
from .dataset import CompactList  # noqa: F401  (re-exported)
from .ray_options import RayWorkers  # noqa: F401  (re-exported)
from .rng import GeneratorLike, SampleRandom, sample_rng  # noqa: F401  (re-exported)
from .skips import BadSampleBudgetExceeded, SkipBudget, SkippedSample  # noqa: F401  (re-exported)
from .state import Stateful  # noqa: F401  (re-exported)

#: The core's public names (each given its torch flavour below), less the
#: core-only seed helper, plus torchdata's loader name.
__all__ = sorted({name for name in _core_names if name != "derive_seed"} | {"StatefulDataLoader"})


def _torch_flavoured(core: type, torch_base: type) -> type:
    """A subclass of a core class that is also a ``torch_base`` and draws
    from torch's generators when none is given; generic (``Dataset[int]``)
    where the core class is."""
    namespace = {"_flavor": "torch", "__module__": __name__, "__doc__": core.__doc__, "__qualname__": core.__name__}
    parameters = getattr(core, "__parameters__", ())
    # (the ignore: Generic over the core class's parameters, known at run time only)
    bases = (core, torch_base, Generic[parameters]) if parameters else (core, torch_base)  # type: ignore[index]
    return types.new_class(core.__name__, bases, exec_body=lambda ns: ns.update(namespace))


_T_co = TypeVar("_T_co", covariant=True)
_Stacked = TypeVar("_Stacked", bound="tuple[Any, ...] | dict[str, Any]")

if TYPE_CHECKING:
    # What a type checker sees: each name a class with both bases, as _torch_flavoured makes it
    # below, so that code can subclass them and annotate with them. Where the two bases annotate a
    # method or attribute differently (__add__'s result, ChainDataset.datasets, ...), conveyor's
    # comes first in the MRO and is the one used: the ignores say so.
    class Dataset(_dataset.Dataset[_T_co], _tud.Dataset[_T_co]): ...  # type: ignore[misc]

    class IterableDataset(_dataset.IterableDataset[_T_co], _tud.IterableDataset[_T_co]): ...  # type: ignore[misc]

    class TensorDataset(_dataset.TensorDataset, _tud.TensorDataset): ...  # type: ignore[misc]

    class StackDataset(_dataset.StackDataset[_Stacked], _tud.StackDataset):  # type: ignore[misc]
        @overload
        def __init__(self: StackDataset[tuple[Any, ...]], *args: Any) -> None: ...
        @overload
        def __init__(self: StackDataset[dict[str, Any]], **kwargs: Any) -> None: ...
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    class ConcatDataset(_dataset.ConcatDataset[_T_co], _tud.ConcatDataset[_T_co]): ...  # type: ignore[misc]

    class ChainDataset(_dataset.ChainDataset, _tud.ChainDataset): ...  # type: ignore[misc]

    class Subset(_dataset.Subset[_T_co], _tud.Subset[_T_co]): ...  # type: ignore[misc]

    class ShardedIterable(_dataset.ShardedIterable, _tud.IterableDataset): ...  # type: ignore[misc]

    class Mix(_mix.Mix, _tud.Dataset[Any]): ...  # type: ignore[misc]

    class IterableMix(_mix.IterableMix, _tud.IterableDataset[Any]): ...  # type: ignore[misc]

    class Pack(_packing.Pack, _tud.Dataset[dict[str, Any]]): ...  # type: ignore[misc]

    class Sampler(_sampler.Sampler[_T_co], _tud.Sampler[_T_co]): ...

    class SequentialSampler(_sampler.SequentialSampler, _tud.SequentialSampler): ...

    class RandomSampler(_sampler.RandomSampler, _tud.RandomSampler): ...

    class SubsetRandomSampler(_sampler.SubsetRandomSampler, _tud.SubsetRandomSampler): ...

    class WeightedRandomSampler(_sampler.WeightedRandomSampler, _tud.WeightedRandomSampler): ...  # type: ignore[misc]

    class BatchSampler(_sampler.BatchSampler, _tud.BatchSampler): ...

    class DistributedSampler(_sampler.DistributedSampler, _tud.DistributedSampler): ...  # type: ignore[misc]

    class ShardedSampler(_sampler.ShardedSampler, _tud.Sampler): ...

    class TokenBudgetBatchSampler(_sampler.TokenBudgetBatchSampler, _tud.Sampler): ...

    class ShardBlockSampler(_sampler.ShardBlockSampler, _tud.Sampler): ...
else:
    # Datasets: conveyor's behaviour; instances of torch's class of the same name.
    Dataset = _torch_flavoured(_dataset.Dataset, _tud.Dataset)
    IterableDataset = _torch_flavoured(_dataset.IterableDataset, _tud.IterableDataset)
    TensorDataset = _torch_flavoured(_dataset.TensorDataset, _tud.TensorDataset)
    StackDataset = _torch_flavoured(_dataset.StackDataset, _tud.StackDataset)
    ConcatDataset = _torch_flavoured(_dataset.ConcatDataset, _tud.ConcatDataset)
    ChainDataset = _torch_flavoured(_dataset.ChainDataset, _tud.ChainDataset)
    Subset = _torch_flavoured(_dataset.Subset, _tud.Subset)
    ShardedIterable = _torch_flavoured(_dataset.ShardedIterable, _tud.IterableDataset)
    Mix = _torch_flavoured(_mix.Mix, _tud.Dataset)
    IterableMix = _torch_flavoured(_mix.IterableMix, _tud.IterableDataset)
    Pack = _torch_flavoured(_packing.Pack, _tud.Dataset)

    # Samplers: torch's draws; instances of torch's class of the same name, so
    # frameworks that look for torch's samplers (Lightning, Accelerate) find them.
    Sampler = _torch_flavoured(_sampler.Sampler, _tud.Sampler)
    SequentialSampler = _torch_flavoured(_sampler.SequentialSampler, _tud.SequentialSampler)
    RandomSampler = _torch_flavoured(_sampler.RandomSampler, _tud.RandomSampler)
    SubsetRandomSampler = _torch_flavoured(_sampler.SubsetRandomSampler, _tud.SubsetRandomSampler)
    WeightedRandomSampler = _torch_flavoured(_sampler.WeightedRandomSampler, _tud.WeightedRandomSampler)
    BatchSampler = _torch_flavoured(_sampler.BatchSampler, _tud.BatchSampler)
    DistributedSampler = _torch_flavoured(_sampler.DistributedSampler, _tud.DistributedSampler)
    ShardedSampler = _torch_flavoured(_sampler.ShardedSampler, _tud.Sampler)
    TokenBudgetBatchSampler = _torch_flavoured(_sampler.TokenBudgetBatchSampler, _tud.Sampler)
    ShardBlockSampler = _torch_flavoured(_sampler.ShardBlockSampler, _tud.Sampler)


class TokenFiles(_text.TokenFiles, _tud.Dataset[_torch.Tensor]):  # type: ignore[misc]  # (conveyor's __getitem__ and __add__ first)
    """conveyor's TokenFiles whose documents are ``torch.int64`` tensors (what
    embeddings and losses take; ``.dtype`` still says the file's ``uint16`` or
    ``uint32``), an instance of ``torch.utils.data.Dataset`` too."""

    def _deliver(self, tokens: Any) -> _torch.Tensor:
        return _torch.from_numpy(tokens.astype(_np.int64))


# Collation: torch tensors out.
default_collate = _collate.torch_default_collate
default_convert = _collate.torch_default_convert
register_collate = _collate.register_collate
PadCollate = _collate.TorchPadCollate


def random_split(
    dataset: Any, lengths: Sequence[Union[int, float]], generator: GeneratorLike = None
) -> list[Subset[Any]]:
    """Split ``dataset`` into non-overlapping subsets, as torch.utils.data does.

    Without ``generator`` it draws from ``torch.default_generator``, as torch,
    so ``torch.manual_seed(s)`` gives torch's split.
    """
    if generator is None:
        generator = _torch.default_generator
    return [Subset(part.dataset, part.indices) for part in _dataset.random_split(dataset, lengths, generator=generator)]


class DataLoader(_loader.DataLoader[_T_co], _tud.DataLoader[_T_co]):  # type: ignore[misc]  # (conveyor's __iter__ and attributes come first)
    """conveyor's DataLoader, an instance of ``torch.utils.data.DataLoader``
    too (frameworks that check for torch's loader accept it; every method is
    conveyor's)."""

    __doc__ = _loader.DataLoader.__doc__
    _flavor = "torch"
    _RandomSampler = RandomSampler
    _SequentialSampler = SequentialSampler
    _BatchSampler = BatchSampler
    _default_collate = staticmethod(default_collate)
    _default_convert = staticmethod(default_convert)
    #: Read by code written against torch's loader; conveyor's iterators are not kept here.
    _iterator = None

    @property
    def _dataset_kind(self) -> int:  # type: ignore[override]  # (torch's loader sets it in __init__, conveyor's does not)
        """torch's ``_DatasetKind`` of the dataset (Map or Iterable), for code that reads it."""
        return _DatasetKind.Iterable if self._iterable else _DatasetKind.Map

    @property
    def _is_accelerate_prepared(self) -> bool:
        """False. accelerate's ``Accelerator.prepare_data_loader`` reads this
        just before it rebuilds a loader as torch's own; conveyor then warns
        (``conveyor.integrations.RebuiltLoaderWarning``) with what keeps it."""
        from .integrations._rebuild import warn_accelerate_rebuild

        warn_accelerate_rebuild(self)
        return False


class StatefulDataLoader(DataLoader[_T_co], Generic[_T_co]):
    """The DataLoader under torchdata's name: code written for
    ``torchdata.stateful_dataloader.StatefulDataLoader`` runs by changing
    its import to ``from conveyor.torch import StatefulDataLoader, Stateful``.

    Every conveyor DataLoader has ``state_dict()`` / ``load_state_dict()``;
    this class only adds torchdata's ``snapshot_every_n_steps`` argument, which
    is checked and kept but changes nothing: conveyor's state is exact after
    every batch, for any ``num_workers``, at no cost per batch.

    Example::

        from conveyor.torch import StatefulDataLoader

        loader = StatefulDataLoader(dataset, batch_size=32, shuffle=True, num_workers=4)
        state = loader.state_dict()          # into the checkpoint
        loader.load_state_dict(state)        # the next iter(loader) resumes there
    """

    def __init__(self, *args: Any, snapshot_every_n_steps: Optional[int] = 1, **kwargs: Any) -> None:
        if snapshot_every_n_steps is not None and (
            not isinstance(snapshot_every_n_steps, int)
            or isinstance(snapshot_every_n_steps, bool)
            or snapshot_every_n_steps < 0
        ):
            raise ValueError(
                f"snapshot_every_n_steps should be a non-negative int or None (0 and None: no periodic "
                f"snapshots, as in torchdata), got {snapshot_every_n_steps!r} (conveyor: it changes nothing "
                f"here, every step can be saved exactly)"
            )
        self.snapshot_every_n_steps = snapshot_every_n_steps
        super().__init__(*args, **kwargs)
