"""States an earlier conveyor wrote in another layout, brought to today's before they are checked.

::

    DataLoader.load_state_dict(state) ──▶ upgrade(state) ──▶ LoaderState.from_dict (state_records.py)

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
resumes to the same batches (``tests/test_saved_states.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._encoding import check_checksum, checksum

#: The keys of version 2's first layout that today's ``copies`` replaced.
EARLY_V2_KEYS = ("iterator_state", "iterator_ended", "iterator_served", "worker_progress")


def is_early_v2(state: Any) -> bool:
    """Whether ``state`` is a version 2 state in the first layout."""
    return (
        isinstance(state, Mapping)
        and state.get("kind") == "DataLoader"
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
        one = {
            "dataset_state": state["dataset_state"],
            "iterator_state": state["iterator_state"],
            "iterator_ended": state["iterator_ended"],
            "served": state["iterator_served"],
        }
        copies = {"states": [one], "retired": [], "next": 0}
        upgraded["dataset_state"] = None
    upgraded["copies"] = copies
    upgraded["checksum"] = checksum(upgraded)
    return upgraded
