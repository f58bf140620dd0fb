"""The checks a loader state passes before anything of it is loaded.

A state comes from disk, written by another run, maybe edited: every field
conveyor reads is checked for type and range here, against this loader,
and a state that does not fit is refused with one ValueError that names
``DataLoader.load_state_dict`` and the key, before the loader, its sampler,
its generator or its dataset change (``ResumeTracker.load`` calls these
first, through ``_records.LoaderState.from_dict``, the one place a state is
decoded). What the checks cover:

    header                            a DataLoader state of this version (the torchdata layout
                                      named), every key, its checksum (_encoding.check_checksum,
                                      the seal's check, which the upgrade of an old layout runs too)
    settings                          the loader's (_settings.settings); a mismatch shows
                                      both sides and the fix (mismatch_error)
    epoch, position, base_seed,       ints in range; batches delivered ahead after the position;
    delivered_ahead                   with seed=, the base seed derived from it
    sampler                           a conveyor sampler's position is the loader's (the sampler's
                                      own load_state_dict checks the rest, and refuses before it loads)
    replay, first_batch               a replay point that fits the sampler; a fingerprint
    generator_state                   loads into a scratch generator of the loader's kind
    dataset_state                     only for a dataset with load_state_dict, of its state's type
    copies                            one per worker (or the one of num_workers=0); the keys
                                      of _engine/loading/copies.py's records; each copy's
                                      fields typed, no copy ahead of the batches delivered
    skipped                           records as state_dict() writes them

What is inside the dataset's and its iterator's own states is theirs to
check: their ``load_state_dict`` runs when the copy starts (in its worker),
and a refusal there names the key it came from (``_engine/loading/fetch.py``).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional

from .._engine.loading.copies import COPIES_KEYS, COPY_KEYS
from ..rng import derive_seed
from ..sampler.fingerprint import describe_arguments
from ..sampler.replay import fingerprint_problem, replay_point_problem
from ..sampler.resumable import _has_position, mismatch_error
from ..skips import SkippedSample
from ._encoding import KEYS, KIND, STATE_VERSION, check_checksum
from ._settings import settings

if TYPE_CHECKING:
    from ..loader._plan import Plan

#: The end of the fix in every refusal.
_FIX = "pass a dict returned by DataLoader.state_dict() of a loader built the same way"
LOADER_FIX = (
    "Fix: build the DataLoader (and its sampler) with the same dataset and arguments as the run that saved the state "
    "(num_workers may differ for map-style datasets), or start without load_state_dict."
)
#: Keys of torchdata's StatefulDataLoader states, to name them in the error.
_TORCHDATA_KEYS = ("_snapshot", "_num_yielded", "_sampler_iter_yielded", "_index_sampler_state")


class StateError(ValueError):
    """A loader state that cannot be loaded: names the key and what is wrong with it."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"DataLoader.load_state_dict: the state's {key!r} {problem}; {_FIX}")
        self.key = key


def _is_int(value: Any, low: int = 0, high: Optional[int] = None) -> bool:
    return (
        isinstance(value, numbers.Integral)
        and not isinstance(value, bool)
        and int(value) >= low
        and (high is None or int(value) < high)
    )


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


def check_settings(plan: Plan, saved: Any) -> None:
    """The state's ``settings`` are this loader's (``_settings.settings``), or an
    error showing both sides of each that differs, and the fix."""
    mine = settings(plan)
    if not isinstance(saved, Mapping):
        raise ValueError(f"DataLoader.load_state_dict: the state's settings are not a dict: {saved!r}")
    # A state saved before a torch sampler's arguments were recorded lacks them: accepted (nothing to check them by).
    differing = [key for key in mine if saved.get(key, "<missing>") != mine[key] and (key in saved or "." not in key)]
    # A setting only some loaders record (a Mix's sources, a sharded stream's ranks) that this one does not:
    # the state was saved over another kind of dataset or layout of ranks.
    differing += [key for key in saved if key not in mine and "." not in key]
    if differing:
        arguments = [key for key in differing if "." in key]
        others = "with other settings" if len(arguments) < len(differing) else ""
        whose = f"whose sampler has other arguments: {describe_arguments(arguments)}" if arguments else ""
        raise mismatch_error(
            "DataLoader",
            f"the state was saved by a loader {' and '.join(part for part in (others, whose) if part)}.",
            {key: saved.get(key, "<missing>") for key in differing},
            {key: mine.get(key, "<not recorded by this loader>") for key in differing},
            LOADER_FIX,
        )


def check_base_seed(plan: Plan, epoch: int, in_epoch: bool, base_seed: Any) -> None:
    """Inside an epoch, a loader with ``seed=`` derives the base seed from
    it: the state's must be that one."""
    if in_epoch and plan.sampling.seed is not None and base_seed != derive_seed(plan.sampling.seed, epoch):
        raise mismatch_error(
            "DataLoader",
            "the base seed does not follow from seed= and the epoch.",
            {"base_seed": base_seed},
            {"seed": plan.sampling.seed},
            LOADER_FIX,
        )


def read_position(state: Mapping[str, Any]) -> tuple[int, bool, Any, int, tuple[int, ...]]:
    """(epoch, in_epoch, base_seed, position, delivered_ahead), checked
    (delivered_ahead in the state's order). (How
    far into the epoch a position may be is the sampler's to say: a
    DistributedSampler resumed on another number of ranks goes on counting
    from the saved position.)"""
    epoch, in_epoch, base_seed = state["epoch"], state["in_epoch"], state["base_seed"]
    position, ahead = state["position"], state["delivered_ahead"]
    if not _is_int(epoch):
        raise StateError("epoch", f"is {epoch!r}, where an int >= 0 belongs")
    if not isinstance(in_epoch, bool):
        raise StateError("in_epoch", f"is {in_epoch!r}, where True or False belongs")
    if not (_is_int(base_seed, 0, 1 << 64) or (base_seed is None and not in_epoch)):
        raise StateError("base_seed", f"is {base_seed!r}, where a seed (an int in [0, 2**64)) belongs")
    if not _is_int(position):
        raise StateError("position", f"is {position!r}, where the batches delivered (an int >= 0) belong")
    if not isinstance(ahead, list) or not all(_is_int(index, position + 1) for index in ahead):
        raise StateError(
            "delivered_ahead", f"is {ahead!r}, where a list of batch indices after the position {position} belongs"
        )
    if not in_epoch and (position != 0 or ahead):
        key = "position" if position != 0 else "delivered_ahead"
        raise StateError(key, f"is {state[key]!r} with 'in_epoch' False: between epochs no batch is delivered yet")
    return int(epoch), in_epoch, base_seed, int(position), tuple(int(index) for index in ahead)


def check_sampler(sampler: Any, saved: Any, position: int, in_epoch: bool, iterable: bool) -> None:
    """The index sampler's part: a dict, or None for a sampler without
    state; a conveyor sampler's position inside an epoch is the loader's
    (both count batches). An iterable dataset's index sampler only repeats
    one placeholder batch, so only its shape matters."""
    stateful = callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None))
    if saved is None:
        if stateful and not iterable:
            raise StateError("sampler", f"is None, but this loader's {type(sampler).__name__} has state to load")
        return
    if not isinstance(saved, Mapping):
        raise StateError("sampler", f"is {saved!r}, where the index sampler's state (a dict) or None belongs")
    if in_epoch and _has_position(saved) and saved["in_iteration"] is True and saved["position"] != position:
        raise StateError(
            "sampler",
            f"stands at batch {saved['position']!r}, but the state's position is {position}: the two move together",
        )


def check_replay(sampler: Any, point: Any, flavor: str) -> None:
    """``replay`` fits the index sampler."""
    problem = replay_point_problem(sampler, point, flavor)
    if problem is not None:
        raise StateError("replay", problem)


def check_fingerprint(first_batch: Any) -> None:
    """``first_batch`` is a batch's fingerprint, or None."""
    problem = fingerprint_problem(first_batch)
    if problem is not None:
        raise StateError("first_batch", problem)


def check_generator(source: Any, saved: Any) -> None:
    """``generator_state`` loads into a generator like the loader's
    (``source``: its RandomSource, None when it has no generator to move)."""
    if source is None or saved is None:
        return
    problem = source.state_problem(saved)
    if problem is not None:
        raise StateError("generator_state", problem)


def check_dataset_state(dataset: Any, saved: Any, key: str, loads_here: bool) -> None:
    """A dataset's state (``key``): only for a dataset with
    ``load_state_dict`` (and, with ``loads_here`` false, only where the
    saving loader would put one); of the type its own ``state_dict()`` gives."""
    if saved is None:
        return
    stateful = callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None))
    if not stateful or not loads_here:
        where = "this dataset has no state_dict/load_state_dict" if not stateful else "this loader keeps none there"
        raise StateError(key, f"holds a dataset state, but {where}")
    try:
        own = dataset.state_dict()
    except Exception:  # (a dataset that gives its state only while iterating: its load_state_dict judges)
        return
    if own is not None and not _same_kind(saved, own):
        raise StateError(
            key, f"is a {type(saved).__name__}, but {type(dataset).__name__}.state_dict() gives a {type(own).__name__}"
        )


def _same_kind(saved: Any, own: Any) -> bool:
    """Whether a saved state could be one ``own``'s maker wrote (after a JSON round trip)."""
    for kind in (Mapping, (list, tuple), str, bytes, bool, numbers.Number):
        if isinstance(own, kind):
            return isinstance(saved, kind)
    return True  # (another type: its load_state_dict is the judge)


def check_copies(plan: Plan, saved: Any, delivered: Optional[int]) -> None:
    """The saved copies of an iterable dataset (None: none), checked against
    this loader's worker count and dataset; ``delivered``: the batches the
    state delivered in its epoch (None between epochs)."""
    if saved is None:
        return
    count = max(1, plan.running.num_workers)
    if not isinstance(saved, Mapping) or set(saved) != set(COPIES_KEYS):
        *first, last = (repr(key) for key in COPIES_KEYS)
        raise StateError("copies", f"is {saved!r}, where a dict of {', '.join(first)} and {last} belongs")
    states, retired, turn = (saved[key] for key in COPIES_KEYS)
    if not isinstance(states, list) or len(states) != count:
        raise StateError(
            "copies", f"holds {_count(states)} states, where this loader has {count} (num_workers={count})"
        )
    if (
        not isinstance(retired, list)
        or not all(_is_int(w, 0, count) for w in retired)
        or len(set(retired)) != len(retired)
    ):
        raise StateError("copies", f"retires {retired!r}, where a list of distinct worker ids below {count} belongs")
    if not _is_int(turn, 0, count):
        raise StateError("copies", f"gives the next turn to {turn!r}, where a worker id below {count} belongs")
    served = 0
    for worker, copy in enumerate(states):
        served += _check_copy(plan, copy, f"copies.states[{worker}]")
    if delivered is not None and served > delivered + count:
        # (each delivered batch was served by one copy; a copy that ran out was asked once more)
        raise StateError("copies", f"served {served} batches in all, but the state delivered {delivered}")


def _count(value: Any) -> str:
    return str(len(value)) if isinstance(value, list) else repr(value)


def _check_copy(plan: Plan, copy: Any, key: str) -> int:
    """One copy's fields; the batches it served."""
    if copy is None:
        return 0
    if not isinstance(copy, Mapping) or set(copy) != set(COPY_KEYS):
        raise StateError(key, f"is {copy!r}, where a dict of {sorted(COPY_KEYS)} (or None) belongs")
    if not isinstance(copy["iterator_ended"], bool):
        raise StateError(f"{key}.iterator_ended", f"is {copy['iterator_ended']!r}, where True or False belongs")
    if not _is_int(copy["served"]):
        raise StateError(f"{key}.served", f"is {copy['served']!r}, where the batches it served (an int >= 0) belong")
    check_dataset_state(plan.loading.dataset, copy["dataset_state"], f"{key}.dataset_state", loads_here=True)
    return int(copy["served"])


_SKIPPED_TYPES = {"index": object, "batch_index": int, "worker": str, "error": str, "traceback": str}


def read_skipped(saved: Any) -> tuple:
    """The epoch's skipped samples (skip_bad_samples) as a state holds them
    under the optional key ``skipped``."""
    ok = isinstance(saved, (list, tuple)) and all(
        isinstance(record, Mapping)
        and set(record) <= set(_SKIPPED_TYPES)
        and set(record) >= set(_SKIPPED_TYPES) - {"traceback"}
        and all(isinstance(value, _SKIPPED_TYPES[name]) for name, value in record.items())
        and not isinstance(record["batch_index"], bool)
        for record in saved
    )
    if not ok:
        raise StateError("skipped", "is not a list of skipped samples as DataLoader.state_dict() writes them")
    return tuple(SkippedSample(**record) for record in saved)
