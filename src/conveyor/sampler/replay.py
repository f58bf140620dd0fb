"""Resuming a sampler that is not conveyor's: replay its iteration from the start.

A sampler without a position of its own is put back where its iteration
began (:func:`replay_point` / :func:`restore_replay_point`: its state dict,
else its generator's state) and its first batches are drawn again and dropped
(:func:`replay`), checked against the saved run's first batch
(:func:`batch_fingerprint`). Used by BatchSampler and by the loader's state.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from conveyor.rng import is_torch_generator, source_for


def batch_fingerprint(batch: Any) -> str:
    """A short fingerprint of a batch of indices (or of one index): the
    CRC-32 of their text, to check that a replayed iteration is the one
    that was saved."""
    text = ",".join(map(str, batch)) if isinstance(batch, (list, tuple)) else str(batch)
    return f"{zlib.crc32(text.encode()):08x}"


def fingerprint_problem(value: Any) -> str | None:
    """Why ``value`` is not what :func:`batch_fingerprint` gives (None: it is, or it is None)."""
    if value is None or (isinstance(value, str) and len(value) == 8 and all(c in "0123456789abcdef" for c in value)):
        return None
    return f"is {value!r}, where a batch's fingerprint (8 hex digits) or None belongs"


def replay(batches: Iterator[Any], skip: int, fingerprint: str | None, what: str) -> Iterator[Any]:
    """``batches`` without their first ``skip``, which are drawn to put the
    sampler where it was. The first batch must be the saved run's (its
    ``fingerprint``): otherwise the sampler does not give the same order on
    a new iteration, and resuming would yield other samples; that raises.
    Resume mechanism 2 (docs/architecture.md, "Resume mechanisms")."""
    for number, batch in enumerate(batches):
        if number == 0 and fingerprint is not None and batch_fingerprint(batch) != fingerprint:
            raise RuntimeError(
                f"cannot resume exactly: {what} gave another first batch than in the run that saved the "
                f"state, so it does not repeat its order on a new iteration and the rest of the epoch would "
                f"hold other samples. Give it state_dict()/load_state_dict(), or a torch.Generator or "
                f"numpy Generator as its `generator` attribute, or use conveyor's samplers (which resume "
                f"exactly); or start the epoch over (set_epoch) instead of loading a mid-epoch state."
            )
        if number >= skip:
            yield batch


def replay_point(sampler: Any, flavor: str) -> Any:
    """What makes ``sampler`` draw its next iteration again, as plain
    values: its ``state_dict()``; else the state of its ``generator``
    attribute (torch's samplers draw from it); else, for a batch sampler,
    the replay point of its ``sampler``; else None."""
    if callable(getattr(sampler, "state_dict", None)) and callable(getattr(sampler, "load_state_dict", None)):
        return {"state": sampler.state_dict()}
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, np.random.Generator) or is_torch_generator(generator):
        return {"generator": source_for(generator, flavor).get_state()}
    inner = getattr(sampler, "sampler", None)
    if inner is not None and inner is not sampler:
        point = replay_point(inner, flavor)
        return None if point is None else {"inner": point}
    return None


def replay_point_problem(sampler: Any, point: Any, flavor: str) -> str | None:
    """Why :func:`restore_replay_point` could not put ``sampler`` back with
    ``point`` (None: it can), found without changing anything. A sampler
    state is left to the sampler's own ``load_state_dict``, which checks
    before it loads."""
    if point is None:
        return None
    if not isinstance(point, Mapping) or len(point) != 1 or not {"state", "generator", "inner"} >= set(point):
        return f"is {point!r}, where a replay point (a dict of one of 'state', 'generator', 'inner') belongs"
    if "state" in point:
        stateful = callable(getattr(sampler, "load_state_dict", None))
        return None if stateful else f"holds a state for {type(sampler).__name__}, which has no load_state_dict"
    if "generator" in point:
        generator = getattr(sampler, "generator", None)
        if not (isinstance(generator, np.random.Generator) or is_torch_generator(generator)):
            return f"holds a generator's state, but {type(sampler).__name__} has no generator"
        return source_for(generator, flavor).state_problem(point["generator"])
    inner = getattr(sampler, "sampler", None)
    if inner is None or inner is sampler:
        return f"holds an inner sampler's point, but {type(sampler).__name__} has no inner sampler"
    return replay_point_problem(inner, point["inner"], flavor)


def restore_replay_point(sampler: Any, point: Any, flavor: str) -> None:
    """Put ``sampler`` back where :func:`replay_point` found it."""
    if not isinstance(point, Mapping):
        return
    if "state" in point:
        sampler.load_state_dict(point["state"])
    elif "generator" in point:
        source_for(sampler.generator, flavor).set_state(point["generator"])
    elif "inner" in point:
        restore_replay_point(sampler.sampler, point["inner"], flavor)
