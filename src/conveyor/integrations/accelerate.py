"""Hugging Face Accelerate with conveyor loaders: ``accelerator.prepare`` keeps conveyor.

::

    from conveyor.integrations.accelerate import Accelerator   # was: from accelerate import Accelerator
    import conveyor.torch as data                              # was: import torch.utils.data as data

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, data.DataLoader(...))

``Accelerator`` is accelerate's with one change: a conveyor loader is
prepared by :func:`prepare_data_loader` (any other loader goes to
accelerate as before). For an accelerator made elsewhere (transformers'
Trainer makes its own), call :func:`prepare_data_loader` yourself.

    conveyor loader ──▶ prepare_data_loader(loader, accelerator)
                          └─ AcceleratedDataLoader: the same loader rebuilt (_rebuild.py) with
                             RankShare(its batches) on 2+ processes (_accelerate_share.py), its stats shared
    iter(prepared)  ──▶ sync the sampler's generator across ranks (as accelerate does)
                    ──▶ conveyor's pass ──▶ batch on accelerator.device ──▶ end_of_dataloader ──▶ the loop
    accelerator.save_state / load_state ──▶ each rank's loader state in its own file (_accelerate_share.py)

What accelerate does to a torch loader, and what conveyor does instead:
each rank gets the batches accelerate's ``BatchSamplerShard`` deals it; the
synchronised generator, ``even_batches``, ``split_batches``, device
placement, ``non_blocking`` and ``GradientState`` (``end_of_dataloader``,
``remainder``) behave as for accelerate's ``DataLoaderShard``. Workers,
seeds, stats and resume are conveyor's. An iterable dataset is not
dispatched from rank 0: each rank reads its own part, so it must shard
itself by rank (``conveyor.torch.ShardedIterable`` does). accelerate's
``use_seedable_sampler`` and ``use_stateful_dataloader`` change nothing
for conveyor's loaders (``seed=`` fixes the order; every conveyor loader
resumes exactly).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Iterator, Optional

import accelerate as _accelerate
import torch
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState
from accelerate.utils import send_to_device, synchronize_rng_states

import conveyor.torch as _ctorch
from conveyor.dataset import ShardedIterable

from ._accelerate_share import RankShare, SavesPerRank, install_checkpoint_hooks
from ._rebuild import rebuilt

__all__ = ["Accelerator", "AcceleratedDataLoader", "prepare_data_loader", "skip_first_batches"]


# (ignore[misc]: mypy compares the bases once one of them is typed, and finds what the torch façade's
# classes already carry: conveyor's DataLoader and torch's each define _IterableDataset_len_called)
class AcceleratedDataLoader(DataLoaderStateMixin, _ctorch.DataLoader, SavesPerRank):  # type: ignore[misc]
    """A conveyor loader prepared for accelerate: this rank's batches, on
    the accelerator's device, tracked by accelerate's ``GradientState``.

    It is a ``conveyor.torch.DataLoader`` (``stats()``, ``on_stats``,
    ``state_dict``, ``trace`` work as on any) and records into the stats of
    the loader it was prepared from. Made by :func:`prepare_data_loader`.
    """

    #: Read by accelerate: keep this loader as it is when it comes back to prepare().
    _is_accelerate_prepared = True
    #: Read by accelerate's save_state: not its one-file path (each rank saves its own, _accelerate_share.py).
    use_stateful_dataloader = False
    device: Optional[torch.device] = None
    rng_types: Optional[list] = None
    synchronized_generator: Optional[torch.Generator] = None
    _non_blocking = False
    _drop_last = False
    #: While an iterable's next batch is held to see the end coming: the state before it (see _looking_ahead).
    _held_state: Optional[dict] = None

    @property
    def total_batch_size(self) -> int:
        """Samples in one step across all processes (accelerate's meaning)."""
        share = self.batch_sampler
        if isinstance(share, RankShare):
            return share.batch_size if share.split_batches else share.batch_size * share.num_processes
        return self.batch_size if self.batch_size is not None else getattr(share, "batch_size", 1)

    @property
    def total_dataset_length(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # (a generator, as accelerate's DataLoaderShard)
        if self.rng_types:
            synchronize_rng_states(self.rng_types, self.synchronized_generator)
        self.begin()
        try:
            batches = super().__iter__()
            if self._iterable:
                yield from self._looking_ahead(batches)
            else:
                yield from self._counted(batches)
        finally:
            self._held_state = None
            self.end()

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """A map-style pass: its length is known, so the last batch is known
        without loading the next one (the loader's state stays exact)."""
        total = len(self)
        progress = self._tracker._progress  # (counts a resumed pass's earlier batches too)
        assert progress is not None  # (made by the pass that yields `batches`)
        for batch in batches:
            self.end_of_dataloader = progress.count >= total
            yield self._placed(batch)

    def _looking_ahead(self, batches: Iterator[Any]) -> Iterator[Any]:
        """An iterable's pass: hold the next batch to know the current one is
        the last (as accelerate's DataLoaderShard does); meanwhile the state
        reported is the one before the held batch."""
        try:
            current = next(batches)
        except StopIteration:
            return
        while True:
            self._held_state = super().state_dict()
            try:
                following = next(batches)
            except StopIteration:
                self.end_of_dataloader = True
                yield self._placed(current)
                return
            yield self._placed(current)
            current = following

    def _placed(self, batch: Any) -> Any:
        if self.device is None:
            return batch
        return send_to_device(batch, self.device, non_blocking=self._non_blocking)

    def state_dict(self) -> dict[str, Any]:
        """As ``conveyor.DataLoader.state_dict``: where the training loop stands."""
        if self._held_state is not None:
            return copy.deepcopy(self._held_state)
        return super().state_dict()


def prepare_data_loader(
    loader: Any, accelerator: Any, device_placement: Optional[bool] = None
) -> AcceleratedDataLoader:
    """``loader`` (a ``conveyor.torch.DataLoader``) prepared for
    ``accelerator`` (accelerate's ``Accelerator``, or conveyor's), as
    ``accelerator.prepare`` prepares a torch loader, but loaded by conveyor.

    The result is registered with ``accelerator``, so ``save_state`` and
    ``load_state`` carry its state (one file per rank), and
    ``accelerator.prepare`` returns it unchanged. ``device_placement``:
    None takes the accelerator's.

    Example::

        loader = prepare_data_loader(data.DataLoader(dataset, batch_size=32, shuffle=True, seed=0), accelerator)
    """
    if isinstance(loader, AcceleratedDataLoader):
        prepared = loader
    elif not isinstance(loader, _ctorch.DataLoader):
        raise TypeError(
            f"prepare_data_loader takes a conveyor.torch.DataLoader, got {type(loader).__name__}; "
            f"prepare other loaders with accelerator.prepare"
        )
    else:
        prepared = _prepared(loader, accelerator, device_placement)
    if prepared not in accelerator._dataloaders:
        accelerator._dataloaders.append(prepared)
    install_checkpoint_hooks(accelerator)
    return prepared


def _prepared(loader: Any, accelerator: Any, device_placement: Optional[bool]) -> AcceleratedDataLoader:
    processes, rank = accelerator.num_processes, accelerator.process_index
    rng_types = list(accelerator.rng_types or [])
    generator = None
    share = None
    if loader._iterable:
        if processes > 1 and not isinstance(loader.dataset, ShardedIterable):
            warnings.warn(
                f"accelerate with conveyor: every rank iterates its own {type(loader.dataset).__name__}, so unless "
                f"it shards itself by rank each rank reads every item; wrap the source in "
                f"conveyor.torch.ShardedIterable (accelerate's dispatch_batches is not used with conveyor)",
                stacklevel=4,
            )
    elif loader.batch_sampler is None:
        raise ValueError(
            "prepare_data_loader: this loader has batch_size=None (no batches to share out across processes); "
            "give it a batch_size or a batch_sampler"
        )
    elif processes > 1:
        share = RankShare(
            loader.batch_sampler,
            num_processes=processes,
            process_index=rank,
            split_batches=accelerator.split_batches,
            even_batches=accelerator.even_batches,
        )
        generator = _synchronized_generator(getattr(loader.batch_sampler, "sampler", None))
    if generator is None and "generator" in rng_types:
        rng_types.remove("generator")
    keep = None if loader._iterable else loader.batch_sampler  # (an iterable's batches come from batch_size)
    prepared = rebuilt(loader, AcceleratedDataLoader, share if share is not None else keep)
    if device_placement is None:
        device_placement = accelerator.device_placement
    prepared.device = accelerator.device if device_placement else None
    prepared.rng_types = rng_types
    prepared.synchronized_generator = generator
    prepared._non_blocking = accelerator.non_blocking
    prepared._drop_last = loader.drop_last
    prepared.gradient_state = GradientState()
    return prepared


def _synchronized_generator(sampler: Any) -> Optional[torch.Generator]:
    """The generator every rank's sampler must draw alike, as accelerate
    finds it: the sampler's own, or a new one (seeded from torch's global
    generator) given to a sampler that has none and no ``seed=``. With
    ``seed=`` the ranks agree already."""
    if sampler is None or not hasattr(sampler, "generator") or getattr(sampler, "seed", None) is not None:
        return None
    if sampler.generator is None:
        sampler.generator = torch.Generator()
        sampler.generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return sampler.generator if isinstance(sampler.generator, torch.Generator) else None


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """accelerate's ``skip_first_batches`` for conveyor loaders too.

    A conveyor loader that has just loaded a state ``num_batches`` into an
    epoch (``accelerator.load_state``, or ``load_state_dict``) resumes there
    by itself, without loading those batches: it is returned as it is.
    Without such a state its first ``num_batches`` batches are loaded and
    dropped (exact, not fast; a warning says so). Other loaders go to
    accelerate's ``skip_first_batches``."""
    if not isinstance(dataloader, _ctorch.DataLoader):
        return _accelerate.skip_first_batches(dataloader, num_batches=num_batches)
    resume = dataloader.resumes_at()
    if num_batches == 0 or (resume is not None and resume[1] == num_batches):
        return dataloader
    if resume is not None:
        epoch, count = resume
        raise ValueError(
            f"skip_first_batches({num_batches}): this conveyor loader has loaded a state {count} batches into "
            f"epoch {epoch}, so it resumes after batch {count}, not {num_batches}; load the state saved "
            f"with the checkpoint you resume from, or skip {count}"
        )
    warnings.warn(
        f"skip_first_batches({num_batches}): no saved state was loaded into this conveyor loader, so it loads and "
        f"drops its first {num_batches} batches; with a state loaded (accelerator.load_state) it resumes without "
        f"loading them",
        stacklevel=2,
    )
    return _Skipped(dataloader, num_batches)


class _Skipped:
    """One pass of a conveyor loader without its first ``skip`` batches;
    everything else is the loader's."""

    def __init__(self, loader: Any, skip: int):
        self._loader = loader
        self._skip = skip

    def __iter__(self) -> Iterator[Any]:
        for number, batch in enumerate(self._loader):
            if number >= self._skip:
                yield batch

    def __len__(self) -> int:
        return max(len(self._loader) - self._skip, 0)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class Accelerator(_accelerate.Accelerator):
    """accelerate's ``Accelerator``, which prepares conveyor loaders as
    conveyor (:func:`prepare_data_loader`) and skips their batches with
    conveyor's state (:func:`skip_first_batches`); everything else is
    accelerate's. Takes accelerate's arguments."""

    def prepare_data_loader(
        self, data_loader: Any, device_placement: Optional[bool] = None, slice_fn_for_dispatch: Any = None
    ) -> Any:
        if isinstance(data_loader, _ctorch.DataLoader):
            return prepare_data_loader(data_loader, self, device_placement=device_placement)
        return super().prepare_data_loader(
            data_loader, device_placement=device_placement, slice_fn_for_dispatch=slice_fn_for_dispatch
        )

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        return skip_first_batches(dataloader, num_batches)
