"""The loader state's encoding: version, named keys, checksum, and the checks
that refuse a state that does not fit (showing both sides and the fix).

    {version, kind, settings, epoch, in_epoch, base_seed, position,
     delivered_ahead, sampler, generator_state, dataset_state, copies,
     replay, first_batch, [skipped], checksum}

* ``settings``: what must be the same in the loader that loads the state.
* ``copies``: iterable datasets: where each copy stood (one per worker, or
  the one of ``num_workers=0``), as ``_engine.executor.progress.IterableProgress``
  snapshots: ``{"states": [...], "retired": [...], "next": n}``
  (``state_records.Copies``).
* ``skipped``: present when samples were skipped this epoch
  (``skip_bad_samples``): one dict per ``skips.SkippedSample``.
* ``checksum``: the CRC-32 of the canonical JSON of everything else, so a
  truncated or hand-edited state is refused instead of yielding other data.

The typed records of these keys, and the one place a state is decoded and
checked, are in state_records.py (``LoaderState``); the checks of header and
settings are here, those of every other field in state_checks.py.

:func:`mismatch_error` is the one "does not fit" error of the project:
samplers and the loader both raise it.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..rng import derive_seed, is_torch_generator, source_for
from ..sampler.fingerprint import describe_arguments, torch_sampler_arguments

#: Version of the loader state layout; a state of another version is refused.
#: 2: the copies of an iterable dataset (workers, or the one in-process) are
#: saved alike, and one without state resumes by fast-forward in its process.
#: (Version 2's first layout, before ``copies``, is upgraded: state_upgrade.py.)
STATE_VERSION = 2
KIND = "DataLoader"
LOADER_FIX = (
    "Fix: build the DataLoader (and its sampler) with the same dataset and arguments as the run that saved the state "
    "(num_workers may differ for map-style datasets), or start without load_state_dict."
)
#: Keys of a loader state besides the header; all must be present.
KEYS = (
    "settings",
    "epoch",
    "in_epoch",
    "base_seed",
    "position",
    "delivered_ahead",
    "sampler",
    "generator_state",
    "dataset_state",
    "copies",
    "replay",
    "first_batch",
)
#: Keys of torchdata's StatefulDataLoader states, to name them in the error.
_TORCHDATA_KEYS = ("_snapshot", "_num_yielded", "_sampler_iter_yielded", "_index_sampler_state")


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def mismatch_error(owner: str, what: str, saved: Mapping[str, Any], mine: Mapping[str, Any], fix: str) -> ValueError:
    """``owner.load_state_dict: what`` with both sides and the fix."""
    width = max(len("saved state"), len(f"this {owner_noun(owner)}"))
    return ValueError(
        f"{owner}.load_state_dict: {what}\n"
        f"  {'saved state:'.ljust(width + 1)} {_describe(saved)}\n"
        f"  {f'this {owner_noun(owner)}:'.ljust(width + 1)} {_describe(mine)}\n"
        f"{fix}"
    )


def owner_noun(owner: str) -> str:
    """ "loader" for a DataLoader's state, "sampler" for a sampler's."""
    return "loader" if owner.endswith("DataLoader") else "sampler"


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
    persistent_workers: bool
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
            persistent_workers=running.persistent,
            seed=sampling.seed,
            generator=sampling.generator,
            flavor=sampling.flavor,
        )

    @property
    def keeps_base_seed(self) -> bool:
        """Whether iterations after the first draw no base seed (persistent workers, as torch)."""
        return self.persistent_workers and self.num_workers > 0


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


# ------------------------------------------------------------------ sealing


def _plain(value: Any) -> Any:
    """JSON stand-in for a leaf json cannot write (arrays, tensors, bytes)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    return repr(value)


def checksum(state: Mapping[str, Any]) -> str:
    """The CRC-32 of ``state``'s canonical JSON (its ``checksum`` left out)."""
    body = {key: value for key, value in state.items() if key != "checksum"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=_plain)
    return f"{zlib.crc32(canonical.encode('utf-8')):08x}"


def check_checksum(state: Mapping[str, Any]) -> None:
    """``state``'s saved checksum matches its contents, or a ValueError saying so."""
    expected = checksum(state)
    if state.get("checksum") != expected:
        raise ValueError(
            f"DataLoader.load_state_dict: the state was changed after it was saved (checksum "
            f"{state.get('checksum')!r} does not match its contents, which give {expected!r}). A changed state "
            f"could yield other batches than the saved run; pass the dict exactly as state_dict() returned "
            f"it (JSON, pickle and torch.save keep it intact)."
        )


# ------------------------------------------------------------------ checks


def check_header(state: Any) -> None:
    """A DataLoader state of this version, whole and unchanged."""
    if not isinstance(state, Mapping):
        raise TypeError(
            f"DataLoader.load_state_dict expects the dict returned by DataLoader.state_dict(), "
            f"got {type(state).__name__}"
        )
    if state.get("kind") != KIND and any(key in state for key in _TORCHDATA_KEYS):
        raise ValueError(
            "DataLoader.load_state_dict: this state was saved by torchdata's StatefulDataLoader, whose "
            "layout conveyor does not read. Resume that run with torchdata, or start the conveyor run "
            "from the start of an epoch (set_epoch) and save conveyor states from then on."
        )
    header = {"version": STATE_VERSION, "kind": KIND}
    saved = {key: state.get(key, "<missing>") for key in header}
    if saved != header:
        raise mismatch_error(
            "DataLoader",
            "the state is not a DataLoader state of this version.",
            saved,
            header,
            "Fix: pass the dict returned by DataLoader.state_dict() of this conveyor version (or of a "
            "version that reads it), or start without load_state_dict.",
        )
    missing = [key for key in (*KEYS, "checksum") if key not in state]
    if missing:
        raise ValueError(
            f"DataLoader.load_state_dict: the state lacks {missing} (truncated or edited?); pass the "
            f"whole dict returned by DataLoader.state_dict()"
        )
    check_checksum(state)


def check_settings(view: LoaderView, saved: Any) -> None:
    mine = settings(view)
    if not isinstance(saved, Mapping):
        raise ValueError(f"DataLoader.load_state_dict: the state's settings are not a dict: {saved!r}")
    # A state saved before a torch sampler's arguments were recorded lacks them: accepted (nothing to check them by).
    differing = [key for key in mine if saved.get(key, "<missing>") != mine[key] and (key in saved or "." not in key)]
    if differing:
        arguments = [key for key in differing if "." in key]
        others = "with other settings" if len(arguments) < len(differing) else ""
        whose = f"whose sampler has other arguments: {describe_arguments(arguments)}" if arguments else ""
        raise mismatch_error(
            "DataLoader",
            f"the state was saved by a loader {' and '.join(part for part in (others, whose) if part)}.",
            {key: saved.get(key, "<missing>") for key in differing},
            {key: mine[key] for key in differing},
            LOADER_FIX,
        )


def check_base_seed(view: LoaderView, epoch: int, in_epoch: bool, base_seed: Any) -> None:
    """Inside an epoch, a loader with ``seed=`` derives the base seed from
    it: the state's must be that one."""
    if in_epoch and view.seed is not None and base_seed != derive_seed(view.seed, epoch):
        raise mismatch_error(
            "DataLoader",
            "the base seed does not follow from seed= and the epoch.",
            {"base_seed": base_seed},
            {"seed": view.seed},
            LOADER_FIX,
        )
