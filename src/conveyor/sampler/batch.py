"""BatchSampler: groups a sampler's indices into batches, resumable at any batch.

A conveyor inner sampler resumes at its own item; any other is replayed from
the start of the saved iteration (:mod:`.replay`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeGuard

from ..state._stateful import is_stateful
from .arguments import _check_bool, _check_int, _check_positive_int
from .replay import (
    batch_fingerprint,
    fingerprint_problem,
    replay,
    replay_point,
    replay_point_problem,
    restore_replay_point,
)
from .resumable import _has_position, _Resumable
from .samplers import Sampler


def _is_int_value(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


class _BatchRun:
    """One BatchSampler iteration: what replays the inner sampler's draw,
    items pulled since, and a fingerprint of the iteration's first batch."""

    __slots__ = ("inner_start", "items", "first_batch")

    def __init__(self) -> None:
        #: Jumping (a conveyor inner sampler): its state once it has handed
        #: out its first item. Replaying (any other): what reproduces its
        #: iteration, taken before the first draw (see replay_point).
        self.inner_start: Any = None
        self.items = 0
        self.first_batch: str | None = None


class BatchSampler(_Resumable, Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    ``drop_last=True`` drops a final batch shorter than ``batch_size``.
    ``sampler`` may be any iterable of indices.

    Resuming: when ``sampler`` has ``state_dict``/``load_state_dict`` (every
    conveyor sampler does), the state wraps the inner sampler's state and the
    resumed iteration continues it directly. Otherwise only the batch count is
    saved, and the resumed iteration runs a fresh iteration of ``sampler`` and
    skips that many batches by iterating, which is exact only when ``sampler``
    yields the same order each time.

    Example::

        >>> from conveyor.sampler import SequentialSampler
        >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=False))
        [[0, 1, 2], [3, 4, 5], [6]]
        >>> list(BatchSampler(SequentialSampler(range(7)), batch_size=3, drop_last=True))
        [[0, 1, 2], [3, 4, 5]]
    """

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        self.batch_size = _check_positive_int("batch_size", batch_size)
        self.drop_last = _check_bool("drop_last", drop_last)
        if not hasattr(sampler, "__iter__") and not hasattr(sampler, "__getitem__"):
            raise TypeError(f"BatchSampler needs an iterable sampler of indices, got {type(sampler).__name__}")
        self.sampler = sampler
        self._init_progress()

    def _inner_jumps(self) -> bool:
        """Whether the inner sampler resumes at an item itself (a conveyor
        sampler); any other is replayed from the iteration's start."""
        return is_stateful(self.sampler) and _has_position(self.sampler.state_dict())

    def _settings(self) -> dict[str, Any]:
        return {"batch_size": self.batch_size, "drop_last": self.drop_last, "sampler_kind": type(self.sampler).__name__}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        run = _BatchRun()  # the context and the cursor's record: _progress reads it
        return run, run

    def _progress(self) -> dict[str, Any]:
        progress = super()._progress()
        record = progress["rng"]
        if self._resume is not None:
            saved = self._resume.record or {}
            return {
                **progress,
                "rng": None,
                "sampler": saved.get("sampler"),
                "replay": saved.get("replay"),
                "first_batch": saved.get("first_batch"),
            }
        if isinstance(record, _BatchRun) and not self._inner_jumps():
            # Replayed: what reproduces the iteration, and its first batch to check it by.
            return {
                **progress,
                "rng": None,
                "sampler": None,
                "replay": record.inner_start,
                "first_batch": record.first_batch,
            }
        return {**progress, "rng": None, "sampler": self._inner_state(record), "replay": None, "first_batch": None}

    def _inner_state(self, record: Any) -> Any:
        """The inner sampler's state that goes with this sampler's position."""
        if not is_stateful(self.sampler):
            return None
        if isinstance(record, _BatchRun) and _has_position(record.inner_start):
            # From the capture, not the inner sampler now: it may have finished
            # (last, short batch) and no longer hold the draw to replay.
            return {**record.inner_start, "position": record.items, "in_iteration": True}
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``; the inner sampler's state is loaded too.

        A conveyor inner sampler resumes at its item. Any other is put back
        to the start of the saved iteration (its own state, or its
        generator's) and the batches before ``position`` are drawn again and
        dropped; the first of them must match the saved run's, or the next
        iteration raises RuntimeError instead of yielding other samples.

        ``position`` (batches) may have been changed since saving to any batch
        of the same iteration: lowered (a loader that prefetched rewinding to
        what it delivered) or raised (a loader that kept the state of the
        iteration's first batch).
        """
        if isinstance(state, Mapping):  # (what is not a mapping, the check below refuses)
            self._check_parts(state)
        super().load_state_dict(state)
        inner, point = state.get("sampler"), state.get("replay")
        if self._resume is not None:
            self._resume.record = {"sampler": inner, "replay": point, "first_batch": state.get("first_batch")}
        if point is not None:
            restore_replay_point(self.sampler, point, self._flavor)
            return
        if inner is None or not is_stateful(self.sampler):
            return
        if state["in_iteration"] and _has_position(inner) and inner["in_iteration"]:
            assert self._resume is not None  # (in_iteration: super() made it)
            inner = {**inner, "position": self._items_behind(state["position"], inner)}
            self._resume.record = {**self._resume.record, "sampler": inner}
        self.sampler.load_state_dict(inner)

    def _check_parts(self, state: Mapping[str, Any]) -> None:
        """Refuse, naming the key, what this sampler keeps of its inner
        sampler that cannot be loaded (before anything is loaded)."""
        inner = state.get("sampler")
        problems = {
            "first_batch": fingerprint_problem(state.get("first_batch")),
            "replay": replay_point_problem(self.sampler, state.get("replay"), self._flavor),
            "sampler": None
            if inner is None or isinstance(inner, Mapping)
            else f"is {inner!r}, where the inner sampler's state (a dict) or None belongs",
        }
        if (
            isinstance(inner, Mapping)
            and "num_samples" in inner
            and not (_is_int_value(inner["num_samples"]) and inner["num_samples"] >= 0)
        ):
            problems["sampler"] = f"has num_samples {inner['num_samples']!r}, where an int >= 0 belongs"
        for key, problem in problems.items():
            if problem is not None:
                kind = type(self).__name__
                raise ValueError(
                    f"{kind}.load_state_dict: the state's {key!r} {problem}; pass a dict returned by "
                    f"{kind}.state_dict()"
                )

    def _items_behind(self, batches: int, inner: Mapping[str, Any]) -> int:
        """Inner items handed out for the first ``batches`` batches: all full
        but the last of the iteration, which the inner sampler's end cuts (its
        length when saved, where its state records one: a DistributedSampler's
        share changes with the job's size)."""
        items = batches * self.batch_size
        saved_length = inner.get("num_samples")
        if _is_int_value(saved_length):
            return min(items, saved_length)
        try:
            return min(items, len(self.sampler))  # type: ignore[arg-type]
        except TypeError:  # no len(): only lowering is possible
            return min(items, inner["position"])

    @property
    def loaded_from_another_size(self) -> bool:
        """Whether the inner sampler took the state loaded last from a data-parallel job of another size."""
        return bool(getattr(self.sampler, "loaded_from_another_size", False))

    def pin_next_draw(self) -> None:
        """Forwarded to the inner sampler (see RandomSampler.pin_next_draw)."""
        pin = getattr(self.sampler, "pin_next_draw", None)
        if callable(pin):
            pin()

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the inner sampler when it has ``set_epoch``."""
        self.epoch = _check_int("epoch", epoch)
        set_inner_epoch = getattr(self.sampler, "set_epoch", None)
        if not callable(set_inner_epoch):
            return
        set_inner_epoch(epoch)
        if self._resume is not None and is_stateful(self.sampler):
            inner = self.sampler.state_dict()
            if _has_position(inner) and not inner["in_iteration"]:
                self._resume = None  # the inner sampler dropped its resume point (and warned)

    def __iter__(self) -> Iterator[list[int]]:
        resume = self._resume
        saved = resume.record if resume is not None and isinstance(resume.record, Mapping) else {}
        cursor, run = self._start()
        jumps = self._inner_jumps()
        if not jumps:
            run.inner_start = replay_point(self.sampler, self._flavor)
        indices = iter(self.sampler)
        if jumps:
            indices = self._noting_inner_start(indices, run)
        size, drop_last = self.batch_size, self.drop_last
        batches: Iterator[list[int]] = iter(lambda: list(itertools.islice(indices, size)), [])
        if not jumps and resume is not None:
            if saved.get("replay") is not None:
                run.inner_start = saved["replay"]  # the replayed iteration's start, for a later save
            run.first_batch = saved.get("first_batch")
            batches = replay(batches, cursor.position, run.first_batch, f"the sampler {type(self.sampler).__name__}")
        for batch in batches:
            if drop_last and len(batch) < size:
                break
            if run.first_batch is None:
                run.first_batch = batch_fingerprint(batch)
            run.items += len(batch)
            cursor.advance()
            yield batch
        cursor.done = True

    def _noting_inner_start(self, indices: Iterator[int], run: _BatchRun) -> Iterator[int]:
        """``indices``, after noting the inner sampler's state once it has
        handed out its first item: its iteration is under way then, even
        when that first batch is its last (a state taken after the batch
        would be the next iteration's)."""
        try:
            first = next(indices)
        except StopIteration:
            return indices
        assert is_stateful(self.sampler)  # (only an inner sampler that jumps is noted)
        run.inner_start = self.sampler.state_dict()
        # Items handed out before this one: where the iteration (maybe a resumed one) started.
        run.items = run.inner_start["position"] - 1
        return itertools.chain((first,), indices)

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size  # type: ignore[arg-type]
