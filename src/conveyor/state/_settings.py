"""What the state knows of a loader, read from the loader's plan
(``loader._plan.Plan``) itself: the settings a state records of it (which
the loader that loads the state must share), and the generator whose state
a state holds.

State code reads the loader only through its plan: ``DataLoader`` makes one
(``_plan.make_plan``) for each save, load and iteration and hands it to
the tracker; nothing here reads the loader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..rng import is_torch_generator, source_for
from ..sampler.fingerprint import torch_sampler_arguments

if TYPE_CHECKING:
    from ..loader._plan import Plan


def settings(plan: Plan) -> dict[str, Any]:
    """What must be the same in the loader that loads a state."""
    sampler = plan.sampling.index_sampler
    kind = type(sampler).__name__
    inner = getattr(sampler, "sampler", None)
    if inner is not None and plan.loading.auto_collation:
        kind = f"{kind}({type(inner).__name__})"
    return {
        "dataset": "iterable" if plan.iterable else "map",
        "dataset_length": None if plan.iterable else len(plan.loading.dataset),
        "batch_size": plan.loading.batch_size,
        "drop_last": plan.loading.drop_last,
        "sampler": kind,
        "seed": plan.sampling.seed,
        "generator": _generator_kind(plan),
        "flavor": plan.sampling.flavor,
        # Map-style batches do not depend on the workers; an iterable dataset's do.
        "num_workers": plan.running.num_workers if plan.iterable else "any",
        **_rank_layout(plan),
        # torch's own samplers have no state: the loader records what shapes their order.
        **({} if plan.iterable else torch_sampler_arguments(sampler)),
        **dataset_settings(plan.loading.dataset),
    }


def dataset_settings(dataset: Any) -> dict[str, Any]:
    """What a dataset says shapes its order (``resume_settings()``, as
    ``conveyor.Mix`` has: its sources, weights, seed): recorded, and a state
    whose differ is refused. Nothing for other datasets."""
    # (looked up on the type: a dataset that forwards every attribute with __getattr__ says nothing by it)
    if not callable(getattr(type(dataset), "resume_settings", None)):
        return {}
    recorded = dataset.resume_settings()
    if not isinstance(recorded, dict) or not all(isinstance(key, str) and "." not in key for key in recorded):
        raise TypeError(
            f"{type(dataset).__name__}.resume_settings() must return a dict with str keys (without '.'), got "
            f"{recorded!r}"
        )
    return recorded


def _rank_layout(plan: Plan) -> dict[str, Any]:
    """An iterable dataset sharded over ranks (one with ``world()``, as
    ShardedIterable): each rank's state holds where its own shard stands,
    so it loads only on the same rank of a job of as many ranks. Nothing on
    one rank (so states saved on one process are as before)."""
    world = getattr(plan.loading.dataset, "world", None)
    if not plan.iterable or not callable(world):
        return {}
    ranks, rank = world()
    return {"ranks": ranks, "rank": rank} if ranks > 1 else {}


def generator_source(plan: Plan) -> Any:
    """The RandomSource of the loader's ``generator`` whose state a state
    holds (None: no generator, or an int seed: nothing that moves)."""
    generator = plan.sampling.generator
    if isinstance(generator, np.random.Generator) or is_torch_generator(generator):
        return source_for(generator, plan.sampling.flavor)
    return None


def _generator_kind(plan: Plan) -> str:
    if plan.sampling.seed is not None:
        return "seed"
    if plan.sampling.generator is None:
        return "global"
    return "torch" if is_torch_generator(plan.sampling.generator) else type(plan.sampling.generator).__name__
