"""Where collation failed, in words: paths into the sample and error messages.

A path is the tuple of steps from the batch to one place in it, printed as
``batch["image"][3].boxes``; messages start with torch's own wording (users
grep their logs for it) and go on to name the place, the samples that disagree
and the fix.
"""

from __future__ import annotations

import collections.abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from .rules import _Context

# torch's wording, kept verbatim: users grep their logs for it.
_TORCH_TYPE_MESSAGE = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)
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


def _positions(indices: Sequence[int]) -> str:
    shown = ", ".join(str(i) for i in indices[:_MAX_POSITIONS_SHOWN])
    return shown + (", ..." if len(indices) > _MAX_POSITIONS_SHOWN else "")


def _differing(values: Sequence[Any]) -> list[int]:
    """Positions whose value differs from position 0's."""
    first = values[0]
    return [i for i, value in enumerate(values) if value != first]


def _disagreement(values: Sequence[Any], what: str, describe: Callable[[Any], str] = str) -> str:
    """'sample 0 has <what> X but sample j has <what> Y (k of B samples differ ...)'."""
    bad = _differing(values)
    j = bad[0]
    text = f"sample 0 has {what} {describe(values[0])} but sample {j} has {what} {describe(values[j])}"
    if len(bad) > 1:
        text += f" ({len(bad)} of {len(values)} samples differ from sample 0: {_positions(bad)})"
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
        f"{ctx.name}: cannot collate {_format_path(path)}: sample 0 is {kind} ({_type_name(batch[0])}) "
        f"but sample {i} is {name}; every sample must hold the same kind of value here."
    )
    if isinstance(sample, (str, bytes, collections.abc.Sequence, np.generic)):
        return TypeError(detail)
    return RuntimeError(f"Could not infer dtype of {name}. {detail}")
