"""The loader state's encoding: a version, named keys, a checksum, and the
upgrade of a state an earlier conveyor wrote in another layout.

    {version, kind, settings, epoch, in_epoch, base_seed, position,
     delivered_ahead, sampler, generator_state, dataset_state, copies,
     replay, first_batch, [skipped], checksum}

* ``settings``: what must be the same in the loader that loads the state
  (``_settings.settings``).
* ``copies``: iterable datasets: where each copy stood (one per worker, or
  the one of ``num_workers=0``), as ``_engine.executor.progress.IterableProgress``
  snapshots: ``{"states": [...], "retired": [...], "next": n}``
  (``_engine/loading/copies.py``'s ``Copies``, whose keys the checks read).
* ``skipped``: present when samples were skipped this epoch
  (``skip_bad_samples``): one dict per ``skips.SkippedSample``.
* ``checksum``: the CRC-32 of the canonical JSON of everything else, so a
  truncated or hand-edited state is refused instead of yielding other data
  (the seal: :func:`checksum` makes it, :func:`check_checksum` verifies it).

The typed records of these keys, and the one place a state is decoded, are
in _records.py (``LoaderState``); the checks that refuse a state that does
not fit, in _checks.py.

Upgrades (:func:`upgrade`), before a state is checked::

    DataLoader.load_state_dict(state) ──▶ upgrade(state) ──▶ LoaderState.from_dict (_records.py)

Version 2 was written in two layouts. Until 2026-11-30 (commit 8361879 and
before) an iterable dataset's copies were saved in two places:
``worker_progress`` (the copies of worker processes, ``{"states", "retired",
"next"}``) and, for ``num_workers=0``, the one copy in the top-level
``dataset_state``, ``iterator_state``, ``iterator_ended`` and
``iterator_served``. Since then both are one ``copies`` (the same
``{"states", "retired", "next"}``; the one copy of ``num_workers=0`` is its
``states[0]``), and ``dataset_state`` holds a dataset's state only between
epochs. Such a state is upgraded here, after its own checksum is checked as
it was written (an edited old state is refused like an edited new one), and
resumes to the same batches (``tests/state/test_saved_states.py``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from typing import Any

from .._engine.loading.copies import Copies, CopyState

#: Version of the loader state layout; a state of another version is refused.
#: 2: the copies of an iterable dataset (workers, or the one in-process) are
#: saved alike, and one without state resumes by fast-forward in its process.
#: (Version 2's first layout, before ``copies``, is upgraded: :func:`upgrade`.)
STATE_VERSION = 2
KIND = "DataLoader"
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


# ------------------------------------------------------------------ upgrades

#: The keys of version 2's first layout that today's ``copies`` replaced.
EARLY_V2_KEYS = ("iterator_state", "iterator_ended", "iterator_served", "worker_progress")


def is_early_v2(state: Any) -> bool:
    """Whether ``state`` is a version 2 state in the first layout."""
    return (
        isinstance(state, Mapping)
        and state.get("kind") == KIND
        and state.get("version") == 2
        and "copies" not in state
        and all(key in state for key in EARLY_V2_KEYS)
    )


def upgrade(state: Any) -> Any:
    """``state`` in today's layout: an early version 2 state upgraded (with
    a new checksum), any other returned as it is (its checks come next)."""
    if not is_early_v2(state):
        return state
    check_checksum(state)
    upgraded = {key: value for key, value in state.items() if key not in (*EARLY_V2_KEYS, "checksum")}
    copies = state["worker_progress"]
    settings = state.get("settings")
    in_process = (
        isinstance(settings, Mapping) and settings.get("dataset") == "iterable" and settings.get("num_workers") == 0
    )
    if copies is None and in_process and state.get("in_epoch") is True:
        one = CopyState(
            state["dataset_state"], state["iterator_state"], state["iterator_ended"], state["iterator_served"]
        )
        copies = Copies((one,), (), 0).to_dict()
        upgraded["dataset_state"] = None
    upgraded["copies"] = copies
    upgraded["checksum"] = checksum(upgraded)
    return upgraded
