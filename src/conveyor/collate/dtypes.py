"""torch's dtype rules on numpy dtypes: what dtype a number takes, and promotion.

A batch's dtype is the one torch would give it: Python numbers take torch's
inferred dtypes (a float follows ``torch.get_default_dtype()``), and a batch of
mixed dtypes is promoted as ``torch.stack`` / ``torch.tensor`` promote, not as
numpy does.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .errors import _disagreement, _format_path

if TYPE_CHECKING:
    from .context import _Context

# numpy dtype kinds torch refuses (bytes, unicode, object), as its [SaUO] pattern.
_UNSUPPORTED_KINDS = "SUO"
# Kinds torch turns into tensors: bool, unsigned, signed, float, complex.
_NUMERIC_KINDS = "biufc"

_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)


# torch orders dtype categories bool < integer < floating < complex; a mixed
# batch takes the highest category, and within a category the wider type.
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}
# torch promotes these only with floating types (it raises for bool, integers, complex).
_UNPROMOTABLE_UNSIGNED = frozenset(np.dtype(t) for t in (np.uint16, np.uint32, np.uint64))


def _result_dtype(dtypes: Sequence[np.dtype], path: tuple, ctx: _Context) -> np.dtype:
    """torch's promotion over ``dtypes`` (as torch.stack / torch.tensor apply it)."""
    result = dtypes[0]
    try:
        for dtype in dtypes[1:]:
            if dtype != result:
                result = _promote_pair(result, dtype)
    except RuntimeError as error:
        raise RuntimeError(
            f"{error}. {ctx.name}: cannot collate {_format_path(path)}: {_disagreement(dtypes, 'dtype')}; "
            f"cast them to one dtype in the dataset."
        ) from None
    return result if result.isnative else result.newbyteorder("=")


def _promote_pair(a: np.dtype, b: np.dtype) -> np.dtype:
    a, b = (a if a.isnative else a.newbyteorder("=")), (b if b.isnative else b.newbyteorder("="))
    if a == b:
        return a
    rank_a, rank_b = _CATEGORY.get(a.kind), _CATEGORY.get(b.kind)
    if rank_a is None or rank_b is None:
        return np.result_type(a, b)  # dtypes torch lacks (datetime, ...): numpy decides
    if (a in _UNPROMOTABLE_UNSIGNED or b in _UNPROMOTABLE_UNSIGNED) and "f" not in (a.kind, b.kind):
        raise RuntimeError(
            f"Promotion for uint16, uint32, uint64 types is not supported, attempted to promote {a} and {b}"
        )
    if rank_a != rank_b:
        high, low = (a, b) if rank_a > rank_b else (b, a)
        if high.kind == "c" and low.kind == "f":
            return np.promote_types(high, low)  # complex64 + float64 -> complex128
        return high
    return np.promote_types(a, b)


def _default_float() -> np.dtype:
    """torch's default dtype for Python floats: float32 unless torch.set_default_dtype changed it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        default = torch.get_default_dtype()
        if default == torch.float64:
            return _FLOAT64
        if default == torch.float16:
            return np.dtype(np.float16)
    return np.dtype(np.float32)


def _scalar_dtype(x: Any) -> np.dtype | None:
    """The dtype torch infers for one element of a batch; None when not a number."""
    cls = type(x)
    if cls is int:
        return _INT64
    if cls is float:
        return _default_float()
    if cls is bool:
        return _BOOL
    if isinstance(x, (np.bool_, np.number)):
        return x.dtype
    if isinstance(x, np.ndarray):
        return x.dtype if x.ndim == 0 and x.dtype.kind in _NUMERIC_KINDS else None
    if isinstance(x, bool):
        return _BOOL
    if isinstance(x, int):
        return _INT64
    if isinstance(x, float):
        return _default_float()
    if isinstance(x, complex):  # torch's default complex dtype follows its default float dtype
        return np.dtype(np.complex128) if _default_float() == _FLOAT64 else np.dtype(np.complex64)
    return None
