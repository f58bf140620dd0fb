"""The loader state as typed records: the one place a state is decoded and checked.

::

    ResumeTracker.save ──▶ LoaderState(...) ──to_dict()──▶ the dict DataLoader.state_dict() returns
    DataLoader.load_state_dict(dict) ──▶ ResumeTracker.load ──▶ LoaderState.from_dict(dict, plan)
        the header, the settings, every field (_checks.py) ──▶ the typed records

Records (each with ``to_dict()``, and a ``from_dict()`` that checks what it decodes):
  * ``LoaderState``: every key of the state as a typed field (the header's
    version and kind are this version's, the checksum is made by ``to_dict``).
    The sampler's, the generator's and the datasets' parts stay what their
    own ``state_dict()`` gives.
  * ``Copies``: an iterable dataset's copies (one per worker, or the one of
    ``num_workers=0``), each a ``CopyState`` or None (not started).
  * ``ReplayPoint``: what puts an index sampler that cannot jump back where
    its epoch began (``sampler.replay.replay_point``).
  * skipped samples are ``skips.SkippedSample`` records.

``to_dict()`` of a decoded state gives back the dict it was decoded from,
key for key, for every state conveyor writes. ``Copies`` and ``CopyState``
are the engine's own records (``_engine/loading/copies.py``), which follow the
copies from the workers to the saved state; here they are decoded, once checked.
The layout's keys, version and checksum are in _encoding.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from .._engine.loading.copies import Copies, CopyState
from ..skips import SkippedSample
from ._checks import (
    check_base_seed,
    check_copies,
    check_dataset_state,
    check_fingerprint,
    check_generator,
    check_header,
    check_replay,
    check_sampler,
    check_settings,
    read_position,
    read_skipped,
)
from ._encoding import KIND, STATE_VERSION, checksum
from ._settings import generator_source

if TYPE_CHECKING:
    from ..loader._plan import Plan

__all__ = ["LoaderState", "Copies", "CopyState", "ReplayPoint"]


@dataclass(frozen=True)
class ReplayPoint:
    """What puts an index sampler that cannot jump back where its epoch
    began, to draw that epoch again (``sampler.replay``): its own state
    (``kind`` "state"), its generator's state ("generator"), or, for a batch
    sampler, its inner sampler's point ("inner": ``value`` is a ReplayPoint,
    or None)."""

    kind: str
    value: Any

    def to_dict(self) -> dict[str, Any]:
        return {self.kind: self.value.to_dict() if isinstance(self.value, ReplayPoint) else self.value}

    @classmethod
    def of(cls, point: Optional[Mapping[str, Any]]) -> Optional["ReplayPoint"]:
        """``replay_point()``'s dict (or a checked one) as a record; None for None."""
        if point is None:
            return None
        ((kind, value),) = point.items()
        return cls(kind, cls.of(value) if kind == "inner" else value)

    @classmethod
    def from_dict(cls, saved: Any, plan: Plan) -> Optional["ReplayPoint"]:
        """A saved ``replay``, checked against the loader's index sampler."""
        check_replay(plan.sampling.index_sampler, saved, plan.sampling.flavor)
        return cls.of(saved)


def _optional_dict(record: Any) -> Any:
    return None if record is None else record.to_dict()


@dataclass(frozen=True)
class LoaderState:
    """A loader's resumable state, one field per key (see _encoding.py for
    the layout and docs/architecture.md for who owns each part).

    ``epoch``, ``in_epoch``, ``position``, ``delivered_ahead`` say where the
    pass stands; ``base_seed`` roots its batch seeds; ``sampler``,
    ``generator_state`` and ``dataset_state`` are their owners' own states;
    ``copies`` where an iterable dataset's copies stand; ``replay`` and
    ``first_batch`` replay a sampler that cannot jump; ``skipped``: the
    samples skip_bad_samples left out this epoch (None: the key is absent,
    as when none was)."""

    VERSION: ClassVar[int] = STATE_VERSION
    KIND: ClassVar[str] = KIND

    settings: Mapping[str, Any]
    epoch: int
    in_epoch: bool
    base_seed: Optional[int]
    position: int
    delivered_ahead: tuple[int, ...]
    sampler: Optional[dict[str, Any]]
    generator_state: Any
    dataset_state: Any
    copies: Optional[Copies]
    replay: Optional[ReplayPoint]
    first_batch: Optional[str]
    skipped: Optional[tuple[SkippedSample, ...]] = None

    @property
    def count(self) -> int:
        """Batches delivered in the state's epoch."""
        return self.position + len(set(self.delivered_ahead))

    def to_dict(self) -> dict[str, Any]:
        """The state as ``DataLoader.state_dict()`` returns it: header, fields, checksum."""
        skipped = {} if self.skipped is None else {"skipped": [record.to_dict() for record in self.skipped]}
        state: dict[str, Any] = {
            "version": self.VERSION,
            "kind": self.KIND,
            "settings": self.settings,
            **skipped,
            "epoch": self.epoch,
            "in_epoch": self.in_epoch,
            "base_seed": self.base_seed,
            "position": self.position,
            "delivered_ahead": list(self.delivered_ahead),
            "sampler": self.sampler,
            "generator_state": self.generator_state,
            "dataset_state": self.dataset_state,
            "copies": _optional_dict(self.copies),
            "replay": _optional_dict(self.replay),
            "first_batch": self.first_batch,
        }
        state["checksum"] = checksum(state)
        return state

    @classmethod
    def from_dict(cls, state: Any, plan: Plan) -> "LoaderState":
        """``state`` decoded, after every check against the loader's ``plan``
        shows: the header and checksum, the settings, then each field's type
        and range. A state that does not fit raises a ValueError (TypeError
        for one that is not a dict) naming ``DataLoader.load_state_dict`` and
        the key, before anything changes."""
        check_header(state)
        check_settings(plan, state["settings"])
        epoch, in_epoch, base_seed, position, ahead = read_position(state)
        check_base_seed(plan, epoch, in_epoch, base_seed)
        check_sampler(plan.sampling.index_sampler, state["sampler"], position, in_epoch, plan.iterable)
        replay = ReplayPoint.from_dict(state["replay"], plan)
        check_fingerprint(state["first_batch"])
        check_generator(generator_source(plan), state["generator_state"])
        loads_dataset = plan.iterable and plan.running.num_workers == 0 and not in_epoch
        check_dataset_state(plan.loading.dataset, state["dataset_state"], "dataset_state", loads_dataset)
        check_copies(plan, state["copies"], position + len(set(ahead)) if in_epoch else None)
        copies = Copies.of(state["copies"])
        skipped = read_skipped(state["skipped"]) if "skipped" in state else None
        return cls(
            settings=state["settings"],
            epoch=epoch,
            in_epoch=in_epoch,
            base_seed=base_seed,
            position=position,
            delivered_ahead=ahead,
            sampler=state["sampler"],
            generator_state=state["generator_state"],
            dataset_state=state["dataset_state"],
            copies=copies,
            replay=replay,
            first_batch=state["first_batch"],
            skipped=skipped,
        )
