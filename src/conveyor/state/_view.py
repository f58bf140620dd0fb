"""What the state knows of a loader: the ``LoaderView`` taken from its plan,
the settings a state records of it (which the loader that loads the state
must share), and the generator whose state a state holds.

State code reads the loader only through its view: ``DataLoader`` makes one
(``LoaderView.of(plan)``) for each save, load and iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..rng import is_torch_generator, source_for
from ..sampler.fingerprint import torch_sampler_arguments


@dataclass(frozen=True)
class LoaderView:
    """What the state needs to know of a loader: its settings and the parts
    a state is loaded into, taken from the loader's plan (:meth:`of`);
    state code never reads the loader itself."""

    dataset: Any
    index_sampler: Any
    iterable: bool
    auto_collation: bool
    batch_size: Any
    drop_last: bool
    num_workers: int
    #: Whether passes after the first draw no base seed (persistent workers,
    #: as torch): the plan's ``keeps_base_seed``, defined there.
    keeps_base_seed: bool
    seed: Any
    generator: Any
    flavor: str

    @classmethod
    def of(cls, plan: Any) -> "LoaderView":
        """The state's view of a plan (conveyor.plan.Plan)."""
        loading, running, sampling = plan.loading, plan.running, plan.sampling
        return cls(
            dataset=loading.dataset,
            index_sampler=sampling.index_sampler,
            iterable=loading.iterable,
            auto_collation=loading.auto_collation,
            batch_size=loading.batch_size,
            drop_last=loading.drop_last,
            num_workers=running.num_workers,
            keeps_base_seed=plan.keeps_base_seed,
            seed=sampling.seed,
            generator=sampling.generator,
            flavor=sampling.flavor,
        )


def settings(view: LoaderView) -> dict[str, Any]:
    """What must be the same in the loader that loads a state."""
    sampler = view.index_sampler
    kind = type(sampler).__name__
    inner = getattr(sampler, "sampler", None)
    if inner is not None and view.auto_collation:
        kind = f"{kind}({type(inner).__name__})"
    return {
        "dataset": "iterable" if view.iterable else "map",
        "dataset_length": None if view.iterable else len(view.dataset),
        "batch_size": view.batch_size,
        "drop_last": view.drop_last,
        "sampler": kind,
        "seed": view.seed,
        "generator": _generator_kind(view),
        "flavor": view.flavor,
        # Map-style batches do not depend on the workers; an iterable dataset's do.
        "num_workers": view.num_workers if view.iterable else "any",
        **_rank_layout(view),
        # torch's own samplers have no state: the loader records what shapes their order.
        **({} if view.iterable else torch_sampler_arguments(sampler)),
    }


def _rank_layout(view: LoaderView) -> dict[str, Any]:
    """An iterable dataset sharded over ranks (one with ``world()``, as
    ShardedIterable): each rank's state holds where its own shard stands,
    so it loads only on the same rank of a job of as many ranks. Nothing on
    one rank (so states saved on one process are as before)."""
    world = getattr(view.dataset, "world", None)
    if not view.iterable or not callable(world):
        return {}
    ranks, rank = world()
    return {"ranks": ranks, "rank": rank} if ranks > 1 else {}


def generator_source(view: LoaderView) -> Any:
    """The RandomSource of the loader's ``generator`` whose state a state
    holds (None: no generator, or an int seed: nothing that moves)."""
    generator = view.generator
    if isinstance(generator, np.random.Generator) or is_torch_generator(generator):
        return source_for(generator, view.flavor)
    return None


def _generator_kind(view: LoaderView) -> str:
    if view.seed is not None:
        return "seed"
    if view.generator is None:
        return "global"
    return "torch" if is_torch_generator(view.generator) else type(view.generator).__name__
