"""Where collation failed, in words: paths into the sample and error messages.

A path is the tuple of steps from the batch to one place in it, printed as
``batch["image"][3].boxes``; messages start with torch's own wording (users
grep their logs for it) and go on to name the place, the samples that disagree
and the fix.

A sample is named by its dataset index (``dataset[9]``) when the loader says
which indices the batch holds (:func:`naming_samples`, around a map-style
batch's collation), else by its position in the batch (``sample 1``).
"""

from __future__ import annotations

import collections.abc
import numbers
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Sequence, overload

import numpy as np

if TYPE_CHECKING:
    from .context import _Context

# torch's wording, kept verbatim: users grep their logs for it.
_TORCH_TYPE_MESSAGE = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
_TORCH_SEQUENCE_MESSAGE = "each element in list of batch should be of equal size"
_TORCH_STACK_MESSAGE = "stack expects each tensor to be equal size, but got {} at entry {} and {} at entry {}"

# How many differing sample positions an error lists before eliding the rest.
_MAX_POSITIONS_SHOWN = 8


@dataclass(frozen=True)
class _Field:
    """A namedtuple field on a path (printed ``.name``)."""

    name: str


def _format_path(path: tuple) -> str:
    parts = ["batch"]
    for step in path:
        parts.append(f".{step.name}" if isinstance(step, _Field) else f"[{_format_key(step)}]")
    return "".join(parts)


def _format_key(key: Any) -> str:
    # Double quotes, so that messages (and KeyError's repr of them) need no escaping.
    return f'"{key}"' if isinstance(key, str) else repr(key)


def _type_name(obj: Any) -> str:
    cls = type(obj)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


#: The dataset indices of the samples being collated, in batch order, or
#: None where they are unknown (an iterable dataset, a direct call).
#: A context variable: each worker thread collates in its own context.
_DATASET_INDICES: ContextVar[Optional[Sequence[Any]]] = ContextVar("conveyor_collate_indices", default=None)


class naming_samples:  # noqa: N801  (a context manager, named as contextlib's are)
    """Within this block, collate errors name the sample at position ``k``
    by its dataset index, ``dataset[indices[k]]``; the loader's fetcher
    wraps a map-style batch's collation in it. A class rather than a
    generator: it runs once per batch, and costs a fraction of a µs."""

    __slots__ = ("_indices", "_token")

    def __init__(self, indices: Optional[Sequence[Any]]) -> None:
        self._indices = indices

    def __enter__(self) -> None:
        self._token = _DATASET_INDICES.set(self._indices)

    def __exit__(self, *exc_info: Any) -> None:
        _DATASET_INDICES.reset(self._token)


def _sample(position: int) -> str:
    """The sample at ``position`` of the batch, in words: ``dataset[9]``
    when its dataset index is known, else ``sample 1``."""
    indices = _DATASET_INDICES.get()
    if indices is not None and 0 <= position < len(indices):
        index = indices[position]
        if isinstance(index, numbers.Integral) and not isinstance(index, bool):
            index = int(index)  # numpy's int64 reads as np.int64(9) since numpy 2
        return f"dataset[{_format_key(index)}]"
    return f"sample {position}"


def _positions(positions: Sequence[int]) -> str:
    """Several samples, in words: ``dataset[9], dataset[11]`` or ``1, 3``
    (positions in the batch), the first few of them."""
    indices = _DATASET_INDICES.get()
    named = _sample if indices is not None and len(indices) > max(positions, default=0) else str
    shown = ", ".join(named(i) for i in positions[:_MAX_POSITIONS_SHOWN])
    return shown + (", ..." if len(positions) > _MAX_POSITIONS_SHOWN else "")


@overload
def _pad_example(path: tuple, lists: Literal[False] = False) -> str: ...


@overload
def _pad_example(path: tuple, lists: bool) -> Optional[str]: ...


def _pad_example(path: tuple, lists: bool = False) -> Optional[str]:
    """A one-line ``collate_fn=PadCollate(...)`` for the leaf at ``path``,
    padding only under its mapping key when it has one (which also pads
    plain lists of numbers there); None for a list with no key above it,
    which PadCollate leaves as a list."""
    key = next((step for step in reversed(path) if not isinstance(step, (int, _Field))), None)
    if key is None:
        return None if lists else "DataLoader(..., collate_fn=PadCollate(0, return_mask=True))"
    return f"DataLoader(..., collate_fn=PadCollate({{{_format_key(key)}: 0}}, return_mask=True))"


def _with_padcollate(example: str) -> str:
    """The PadCollate suggestion, one wording for every message that makes it."""
    return (
        f"with PadCollate (from conveyor, or conveyor.torch for tensors), which also gives each "
        f"sample's length and a mask: {example}"
    )


def _differing(values: Sequence[Any]) -> list[int]:
    """Positions whose value differs from position 0's."""
    first = values[0]
    return [i for i, value in enumerate(values) if value != first]


def _disagreement(values: Sequence[Any], what: str, describe: Callable[[Any], str] = str) -> str:
    """'sample 0 has <what> X but sample j has <what> Y (k of B samples differ ...)',
    samples named as :func:`_sample` says."""
    bad = _differing(values)
    j = bad[0]
    text = f"{_sample(0)} has {what} {describe(values[0])} but {_sample(j)} has {what} {describe(values[j])}"
    if len(bad) > 1:
        text += f" ({len(bad)} of {len(values)} samples differ from {_sample(0)}: {_positions(bad)})"
    return text


def _note_path(error: BaseException, path: tuple, ctx: "_Context") -> None:
    """Add the failing path to a foreign exception once (innermost wins)."""
    if getattr(error, "_conveyor_path_noted", False) or not hasattr(error, "add_note"):
        return
    error.add_note(f"{ctx.name}: raised while collating {_format_path(path)}")
    try:
        error._conveyor_path_noted = True  # type: ignore[attr-defined]
    except AttributeError:  # exceptions with __slots__
        pass


def _mismatch_error(batch: Sequence[Any], i: int, kind: str, path: tuple, ctx: _Context) -> Exception:
    """A sample of another kind among arrays: RuntimeError for non-numbers (as torch), else TypeError."""
    sample = batch[i]
    name = _type_name(sample)
    detail = (
        f"{ctx.name}: cannot collate {_format_path(path)}: {_sample(0)} is {kind} ({_type_name(batch[0])}) "
        f"but {_sample(i)} is {name}; every sample must hold the same kind of value here."
    )
    if isinstance(sample, (str, bytes, collections.abc.Sequence, np.generic)):
        return TypeError(detail)
    return RuntimeError(f"Could not infer dtype of {name}. {detail}")
