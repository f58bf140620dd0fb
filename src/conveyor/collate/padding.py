"""PadCollate: collate like default_collate, padding variable-length sequences.

The classes users hold (:class:`PadCollate`, :class:`TorchPadCollate`) and the
leaf they get back (:class:`Padded`); the padding of each leaf is done in
:mod:`.pad_leaf`.
"""

from __future__ import annotations

import collections.abc
from typing import Any, NamedTuple, Sequence

from .allocation import Allocate, allocate_batch, as_allocator
from .context import _Context
from .convert import to_torch
from .pad_leaf import _PadScope
from .rules import _collate


class Padded(NamedTuple):
    """A padded leaf of a :class:`PadCollate` batch.

    ``values`` has shape ``(B, L, *rest)``; ``lengths`` (int64, shape ``(B,)``)
    and ``mask`` (bool, shape ``(B, L)``, True at real positions) are None
    unless asked for.
    """

    values: Any
    lengths: Any = None
    mask: Any = None


class PadCollate:
    """Collate like :func:`default_collate`, padding variable-length sequences.

    Every array or tensor leaf with at least one axis (or, with ``keys``, each
    one under those keys) is padded along its first axis to the longest sample
    in the batch; the other axes must agree. Such a leaf always becomes a
    :class:`Padded` ``(values, lengths, mask)`` — even when the lengths happen
    to be equal, so the batch's structure does not depend on its data — or the
    bare padded array when ``return_lengths`` and ``return_mask`` are both
    False. Everything else is collated as :func:`default_collate` does.

    Args:
        pad_value: the fill value; or a mapping ``{key: value}``, which also
            selects the keys to pad when ``keys`` is not given.
        pad_to_multiple_of: round the padded length up to a multiple of this
            (e.g. 8 for tensor cores).
        return_lengths: include the true length of each sample.
        return_mask: include a boolean mask, True at real (unpadded) positions.
        keys: pad only the values under these mapping keys (at any depth);
            under such a key a (nested) list of numbers is padded as an array,
            e.g. token ids straight from a tokenizer.
        side: ``"right"`` (pad after the data) or ``"left"``.

    Example::

        >>> import numpy as np
        >>> pad = PadCollate({"input_ids": 0, "labels": -100}, return_mask=True)
        >>> batch = pad([
        ...     {"input_ids": [5, 6, 7], "labels": np.array([1, 2, 3]), "id": 0},
        ...     {"input_ids": [8], "labels": np.array([4]), "id": 1},
        ... ])
        >>> batch["input_ids"].values
        array([[5, 6, 7],
               [8, 0, 0]])
        >>> batch["input_ids"].lengths
        array([3, 1])
        >>> batch["input_ids"].mask
        array([[ True,  True,  True],
               [ True, False, False]])
        >>> batch["labels"].values
        array([[   1,    2,    3],
               [   4, -100, -100]])
        >>> batch["id"]
        array([0, 1])

    Numpy in, numpy out; torch tensors in, tensors out (on their device; the
    lengths on the CPU). ``conveyor.torch.PadCollate`` (the class
    :class:`TorchPadCollate` of ``conveyor.collate``) returns tensors in every
    case. Instances pickle, so they can be sent to worker processes. See
    docs/text.md for padding with token budgets, masks and resume.
    """

    def __init__(
        self,
        pad_value: Any = 0,
        *,
        pad_to_multiple_of: int | None = None,
        return_lengths: bool = True,
        return_mask: bool = False,
        keys: collections.abc.Collection | None = None,
        side: str = "right",
    ) -> None:
        multiple = pad_to_multiple_of
        if multiple is not None and (isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1):
            raise ValueError(f"PadCollate: pad_to_multiple_of must be a positive int or None, got {multiple!r}")
        if side not in ("right", "left"):
            raise ValueError(f"PadCollate: side must be 'right' or 'left', got {side!r}")
        if isinstance(keys, (str, bytes)):
            raise TypeError(
                f"PadCollate: keys must be a collection of keys, not a string; did you mean keys=[{keys!r}]?"
            )
        if keys is not None:
            keys = frozenset(keys)
        if isinstance(pad_value, collections.abc.Mapping):
            pad_value = dict(pad_value)
            if keys is None:
                keys = frozenset(pad_value)
            missing = [k for k in keys if k not in pad_value]
            if missing:
                raise ValueError(
                    f"PadCollate: pad_value has no value for keys {sorted(map(repr, missing))}; add them to pad_value."
                )
        self.pad_value = pad_value
        self.pad_to_multiple_of = pad_to_multiple_of
        self.return_lengths = bool(return_lengths)
        self.return_mask = bool(return_mask)
        self.keys = keys
        self.side = side

    def __repr__(self) -> str:
        keys = None if self.keys is None else sorted(self.keys, key=repr)
        return (
            f"{type(self).__name__}({self.pad_value!r}, pad_to_multiple_of={self.pad_to_multiple_of!r}, "
            f"return_lengths={self.return_lengths}, return_mask={self.return_mask}, keys={keys!r}, "
            f"side={self.side!r})"
        )

    def __call__(self, batch: Sequence[Any]) -> Any:
        return self.collate_into(batch, allocate_batch)

    def collate_into(self, batch: Sequence[Any], allocate: Allocate) -> Any:
        """Collate and pad, allocating numpy outputs with ``allocate`` (the engine's hook)."""
        ctx = _Context("PadCollate", allocate=as_allocator(allocate), padding=self)
        root = None if self.keys is not None else _PadScope(self.pad_value, explicit=False)
        out = _collate(batch, (), ctx, root)
        if self.keys is not None and not ctx.pad_keys_seen:
            raise KeyError(
                f"PadCollate: none of keys={sorted(self.keys, key=repr)} occurs in the samples, so nothing "
                f"was padded; check the spelling."
            )
        return out

    def _result(self, values: Any, lengths: Any, mask: Any) -> Any:
        """The padded leaf: values alone, or Padded (lengths and mask are None unless asked for)."""
        if not (self.return_lengths or self.return_mask):
            return values
        return Padded(values, lengths, mask)

    def _padded_length(self, longest: int) -> int:
        m = self.pad_to_multiple_of
        return longest if m is None else -(-longest // m) * m


class TorchPadCollate(PadCollate):
    """:class:`PadCollate` that returns torch tensors (``to_torch`` of its
    numpy result); users reach it as ``conveyor.torch.PadCollate``."""

    def __call__(self, batch: Sequence[Any]) -> Any:
        return to_torch(super().__call__(batch))
