"""Collation: turn a list of samples into one batch.

``default_collate`` follows ``torch.utils.data.default_collate`` rule for rule,
but its leaves are numpy arrays, so the core never needs torch::

    sample leaf (batch[0])          collated leaf
    ------------------------------  -------------------------------------------
    numpy array                     array of shape (B, *shape), dtype promoted
                                    as torch.stack would
    numpy scalar (np.bool_, number) array of shape (B,)
    int / bool / float              int64 / bool / float64 array (a batch led
                                    by an int takes torch's inferred dtype,
                                    e.g. [1, 2.5] -> float32)
    str / bytes                     the samples, unchanged
    torch.Tensor                    torch.stack(batch) (a tensor, as torch)
    Mapping                         same mapping type, values collated per key
    namedtuple                      same namedtuple, collated per field
    tuple                           list, collated per position
    other Sequence                  same sequence type where it can be rebuilt

A whole pipeline speaks torch in two steps that stay separate on purpose:
``default_collate`` (numpy, can run in a worker process, writing into shared
memory) and :func:`to_torch` (zero-copy ``torch.from_numpy``, in the main
process). ``torch_default_collate`` is the two composed and equals
``torch.utils.data.default_collate`` in values, dtypes, shapes and containers.

User types are taught with :func:`register_collate`; variable-length
sequences are padded by :class:`PadCollate`. Errors name the place in the
sample that failed (``batch["image"]``), the samples that disagree and how::

    RuntimeError: stack expects each tensor to be equal size, but got
    [3, 224, 224] at entry 0 and [3, 200, 224] at entry 5. default_collate:
    cannot stack batch["image"]: sample 0 has shape (3, 224, 224) but sample 5
    has shape (3, 200, 224) ...

torch is imported only when a sample holds tensors (it is then already
loaded) or when a ``torch_*`` function, :func:`to_torch` or
:class:`TorchPadCollate` is called.
"""

from __future__ import annotations

import collections.abc
import copy
import sys
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

__all__ = [
    "default_collate",
    "default_convert",
    "collate",
    "torch_default_collate",
    "torch_default_convert",
    "to_torch",
    "register_collate",
    "unregister_collate",
    "PadCollate",
    "TorchPadCollate",
    "Padded",
]

# torch's wording, kept verbatim: users grep their logs for it.
_TORCH_TYPE_MESSAGE = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)
_TORCH_SEQUENCE_MESSAGE = "each element in list of batch should be of equal size"
_TORCH_STACK_MESSAGE = "stack expects each tensor to be equal size, but got {} at entry {} and {} at entry {}"

# numpy dtype kinds torch refuses (bytes, unicode, object), as its [SaUO] pattern.
_UNSUPPORTED_KINDS = "SUO"
# Kinds torch turns into tensors: bool, unsigned, signed, float, complex.
_NUMERIC_KINDS = "biufc"
# How many differing sample positions an error lists before eliding the rest.
_MAX_POSITIONS_SHOWN = 8

_BOOL = np.dtype(np.bool_)
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)


# --------------------------------------------------------------------------
# Output allocation
# --------------------------------------------------------------------------

Allocate = Callable[[tuple, np.dtype], np.ndarray]


def allocate_batch(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """Allocate an uninitialised output array; the default ``allocate`` hook.

    Collation allocates each output array once through such a function and
    copies the samples in; the engine swaps in one that hands out shared memory
    (see :func:`collate_into`).
    """
    return np.empty(shape, dtype)


def _stack_into(arrays: Sequence[np.ndarray], dtype: np.dtype, allocate: Allocate) -> np.ndarray:
    """Allocate ``(len(arrays), *arrays[0].shape)`` once and copy each sample in.

    An allocator with a ``claim(arrays, dtype)`` method (the engine's, which
    places samples in the batch as they are made) may answer with the
    finished output, whose rows already are ``arrays``.
    """
    claim = getattr(allocate, "claim", None)
    if claim is not None:
        out = claim(arrays, dtype)
        if out is not None:
            return out
    out = allocate((len(arrays),) + arrays[0].shape, dtype)
    for i, array in enumerate(arrays):
        out[i] = array
    return out


# --------------------------------------------------------------------------
# Paths and error messages
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# The type registry (per process)
# --------------------------------------------------------------------------

CollateFn = Callable[..., Any]
CollateFnMap = collections.abc.Mapping  # {type or tuple of types: fn(batch, *, collate_fn_map)}

_REGISTRY: dict[type, CollateFn] = {}


def register_collate(types: type | tuple[type, ...], fn: CollateFn | None = None):
    """Teach :func:`default_collate` (and every collate in this module) a type.

    ``fn(batch, *, collate)`` receives the samples at one place in the batch
    whose first element is an instance of ``types``, and returns the collated
    value. ``collate(sub_batch, key=None)`` collates a list of sub-values with
    the caller's rules (registry, padding, numpy or torch); ``key`` names the
    step for error messages. Lookup walks ``type(batch[0]).__mro__``, so the
    most specific registration wins; registrations take precedence over the
    built-in rules. Usable as a decorator::

        >>> class Box:
        ...     def __init__(self, xyxy):
        ...         self.xyxy = xyxy
        >>> @register_collate(Box)
        ... def collate_boxes(batch, *, collate):
        ...     return collate([b.xyxy for b in batch], key="xyxy")
        >>> default_collate([Box(np.zeros(4)), Box(np.ones(4))]).shape
        (2, 4)
        >>> unregister_collate(Box)

    The registry is per process: a worker started with ``fork`` inherits it,
    one started with ``spawn`` or ``forkserver`` sees only registrations made
    while importing modules. Register at module level, beside the type's
    definition, so that every process that can unpickle the type has its rule.
    """
    if fn is None:
        return lambda f: register_collate(types, f) or f
    if not callable(fn):
        raise TypeError(f"register_collate: fn must be callable, got {_type_name(fn)}")
    for cls in types if isinstance(types, tuple) else (types,):
        if not isinstance(cls, type):
            raise TypeError(f"register_collate: expected a type or a tuple of types, got {cls!r}")
        _REGISTRY[cls] = fn
    return None


def unregister_collate(types: type | tuple[type, ...]) -> None:
    """Remove registrations made with :func:`register_collate`; unknown types are ignored."""
    for cls in types if isinstance(types, tuple) else (types,):
        _REGISTRY.pop(cls, None)


def _registered_fn(cls: type) -> CollateFn | None:
    for base in cls.__mro__:
        fn = _REGISTRY.get(base)
        if fn is not None:
            return fn
    return None


def _mapped_fn(fn_map: CollateFnMap, elem: Any) -> CollateFn | None:
    """torch's lookup in a ``collate_fn_map``: exact type, then isinstance in order."""
    fn = fn_map.get(type(elem))
    if fn is not None:
        return fn
    for key, fn in fn_map.items():
        if isinstance(elem, key):
            return fn
    return None


# --------------------------------------------------------------------------
# Recursion context
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class _PadScope:
    """Array leaves below this point are padded with ``value``.

    ``explicit`` when a key named in ``PadCollate(keys=...)`` opened the scope:
    then a (nested) list of numbers right under that key counts as an array.
    """

    value: Any
    explicit: bool


class _Context:
    """What stays fixed during one collation: rules, allocator, padding."""

    __slots__ = ("fn_map", "allocate", "name", "padding", "pad_keys_seen")

    def __init__(
        self,
        name: str,
        allocate: Allocate = allocate_batch,
        fn_map: CollateFnMap | None = None,
        padding: "PadCollate | None" = None,
    ) -> None:
        self.name = name
        self.allocate = allocate
        self.fn_map = fn_map
        self.padding = padding
        self.pad_keys_seen: set = set()


class _Recurse:
    """The ``collate`` callable handed to registered functions."""

    __slots__ = ("_path", "_ctx", "_scope")

    def __init__(self, path: tuple, ctx: _Context, scope: _PadScope | None) -> None:
        self._path = path
        self._ctx = ctx
        self._scope = scope

    def __call__(self, batch: Sequence[Any], key: Any = None) -> Any:
        path = self._path if key is None else self._path + (key,)
        return _collate(batch, path, self._ctx, self._scope)


# --------------------------------------------------------------------------
# The recursion
# --------------------------------------------------------------------------


def _collate(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    if len(batch) == 0:
        raise IndexError(f"{ctx.name}: cannot collate an empty batch at {_format_path(path)}")
    elem = batch[0]
    cls = type(elem)

    if ctx.fn_map is not None:
        fn = _mapped_fn(ctx.fn_map, elem)
        if fn is not None:
            return _call_user_fn(fn, batch, path, ctx, collate_fn_map=ctx.fn_map)
    if _REGISTRY:
        fn = _registered_fn(cls)
        if fn is not None:
            return _call_user_fn(fn, batch, path, ctx, collate=_Recurse(path, ctx, scope))

    if cls is np.ndarray or isinstance(elem, np.ndarray):
        if scope is not None and elem.ndim > 0:
            return _pad_leaf(batch, path, ctx, scope)
        return _collate_arrays(batch, path, ctx)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(elem, torch.Tensor):
        if scope is not None and elem.ndim > 0:
            return _pad_leaf(batch, path, ctx, scope)
        return _stack_tensors(batch, path, ctx, torch)
    if isinstance(elem, (np.bool_, np.number, int, float)):
        return _collate_numbers(batch, path, ctx)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        return _collate_mapping(batch, path, ctx, scope)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return _collate_namedtuple(batch, path, ctx, scope)
    if isinstance(elem, collections.abc.Sequence):
        if scope is not None and scope.explicit and _is_number_list(elem):
            return _pad_leaf(batch, path, ctx, scope)
        return _collate_sequence(batch, path, ctx, scope)
    raise TypeError(
        _TORCH_TYPE_MESSAGE.format(cls)
        + f". {ctx.name}: cannot collate {_format_path(path)} (sample 0 is {_type_name(elem)}). "
        f"Convert it in the dataset, or teach conveyor with register_collate({cls.__name__}, fn)."
    )


def _call_user_fn(fn: CollateFn, batch: Sequence[Any], path: tuple, ctx: _Context, **kwargs: Any) -> Any:
    try:
        return fn(batch, **kwargs)
    except Exception as error:
        _note_path(error, path, ctx)
        raise


def _holds_tensor(batch: Sequence[Any]) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and any(isinstance(sample, torch.Tensor) for sample in batch)


# ---- structures ----------------------------------------------------------


def _require_all(batch: Sequence[Any], kind: type, kind_name: str, path: tuple, ctx: _Context) -> None:
    for i, sample in enumerate(batch):
        if not isinstance(sample, kind):
            raise TypeError(
                f"{ctx.name}: cannot collate {_format_path(path)}: sample 0 is {kind_name} "
                f"({_type_name(batch[0])}) but sample {i} is {_type_name(sample)}; every sample must "
                f"have the same structure."
            )


def _collate_mapping(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    _require_all(batch, collections.abc.Mapping, "a mapping", path, ctx)
    collated = {}
    for key in elem:
        try:
            column = [sample[key] for sample in batch]
        except KeyError:
            missing = [i for i, sample in enumerate(batch) if key not in sample]
            raise KeyError(
                f"{ctx.name}: cannot collate {_format_path(path)}: sample {missing[0]} has no key "
                f"{_format_key(key)}, which sample 0 has (samples without it: {_positions(missing)}); "
                f"every sample must have the keys of sample 0."
            ) from None
        collated[key] = _collate(column, path + (key,), ctx, _child_scope(ctx, scope, key))
    return _rebuild_mapping(elem, collated)


def _collate_namedtuple(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    fields = elem._fields
    return type(elem)(
        *(
            _collate(column, path + (_Field(fields[i]),), ctx, scope)
            for i, column in enumerate(zip(*batch))
        )
    )


def _collate_sequence(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope | None) -> Any:
    elem = batch[0]
    sizes = []
    for i, sample in enumerate(batch):
        try:
            sizes.append(len(sample))
        except TypeError:
            raise TypeError(
                f"{ctx.name}: cannot collate {_format_path(path)}: sample 0 is a sequence "
                f"({_type_name(elem)}) but sample {i} is {_type_name(sample)}, which has no len(); "
                f"every sample must have the same structure."
            ) from None
    if any(size != sizes[0] for size in sizes):
        raise RuntimeError(
            f"{_TORCH_SEQUENCE_MESSAGE}. {ctx.name}: cannot collate {_format_path(path)}: "
            f"{_disagreement(sizes, 'length')}. Sequences are collated position by position, so "
            f"all must have one length; for variable-length sequences pass collate_fn=PadCollate(...)."
        )
    # Columns stay the tuples zip makes: torch hands str columns back as they are.
    values = [_collate(column, path + (i,), ctx, scope) for i, column in enumerate(zip(*batch))]
    if isinstance(elem, tuple):
        return values  # torch turns tuples into lists ("backwards compatibility")
    return _rebuild_sequence(elem, values)


def _rebuild_mapping(template: collections.abc.Mapping, values: dict) -> collections.abc.Mapping:
    """A mapping like ``template`` holding ``values``; a dict where that is impossible.

    A mutable mapping is shallow-copied and updated, so subclasses keep their
    extra state (a defaultdict its factory); an immutable one is built from a
    dict. Types that support neither fall back to dict (torch does the same).
    """
    try:
        if isinstance(template, collections.abc.MutableMapping):
            clone = copy.copy(template)
            clone.update(values)
            return clone
        return type(template)(values)
    except TypeError:
        return values


def _rebuild_sequence(template: Sequence, values: list) -> Sequence:
    """A sequence like ``template`` holding ``values``; a list where that is impossible."""
    try:
        if isinstance(template, collections.abc.MutableSequence):
            clone = copy.copy(template)
            for i, value in enumerate(values):
                clone[i] = value
            return clone
        return type(template)(values)
    except TypeError:
        return values


# ---- numpy arrays ----------------------------------------------------------


def _collate_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> Any:
    if _holds_tensor(batch):  # as torch: convert every sample to a tensor, then stack
        torch = sys.modules["torch"]
        return _stack_tensors([torch.as_tensor(sample) for sample in batch], path, ctx, torch)
    arrays = _as_arrays(batch, path, ctx)
    shapes = [array.shape for array in arrays]
    if any(shape != shapes[0] for shape in shapes):
        raise RuntimeError(_unequal_shapes_message(shapes, path, ctx))
    return _stack_into(arrays, _result_dtype([a.dtype for a in arrays], path, ctx), ctx.allocate)


def _as_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> list[np.ndarray]:
    """The samples of an array-led batch as numpy arrays of supported dtypes.

    Numbers and numpy scalars among them become 0-d arrays of torch's dtype.
    """
    arrays = []
    for i, sample in enumerate(batch):
        if not isinstance(sample, np.ndarray):
            dtype = _scalar_dtype(sample)
            if dtype is None:
                raise _mismatch_error(batch, i, "an array", path, ctx)
            sample = np.asarray(sample, dtype)
        elif sample.dtype.kind in _UNSUPPORTED_KINDS:
            raise TypeError(
                _TORCH_TYPE_MESSAGE.format(sample.dtype)
                + f". {ctx.name}: cannot collate {_format_path(path)}: sample {i} is an array of dtype "
                f"{sample.dtype}; string and object arrays cannot be batched. Keep them as str/bytes "
                f"(collated into a list) or encode them as numbers."
            )
        arrays.append(sample)
    return arrays


def _unequal_shapes_message(shapes: Sequence[tuple], path: tuple, ctx: _Context) -> str:
    j = _differing(shapes)[0]
    torch_text = _TORCH_STACK_MESSAGE.format(list(shapes[0]), 0, list(shapes[j]), j)
    hint = "Resize or crop to one size"
    if len(shapes[0]) > 0 and len({s[1:] for s in shapes}) == 1 and len({len(s) for s in shapes}) == 1:
        hint += ", or pass collate_fn=PadCollate(...) to pad them along the first axis"
    return (
        f"{torch_text}. {ctx.name}: cannot stack {_format_path(path)}: "
        f"{_disagreement(shapes, 'shape')}. {hint}."
    )


# ---- numbers ---------------------------------------------------------------


def _collate_numbers(batch: Sequence[Any], path: tuple, ctx: _Context) -> Any:
    """Python numbers and numpy scalars -> a (B,) array with torch's dtype.

    torch builds a float-led batch with ``dtype=float64`` and infers the dtype
    of every other batch from all its elements (``torch.tensor(batch)``).
    """
    float_led = isinstance(batch[0], float) and not isinstance(batch[0], np.generic)
    dtypes = []
    for i, sample in enumerate(batch):
        dtype = _scalar_dtype(sample)
        if dtype is None or (float_led and isinstance(sample, complex)):
            if _holds_tensor(batch):  # 0-d tensors among numbers: torch's own result
                torch = sys.modules["torch"]
                return torch.tensor(batch, dtype=torch.float64) if float_led else torch.as_tensor(batch)
            raise _number_mismatch_error(batch, i, float_led, path, ctx)
        dtypes.append(dtype)
    dtype = _FLOAT64 if float_led else _result_dtype(dtypes, path, ctx)
    try:
        values = np.array(batch, dtype=dtype)
    except OverflowError:
        i = next((i for i, x in enumerate(batch) if isinstance(x, int) and not -(2**63) <= x < 2**63), 0)
        raise ValueError(
            f"Overflow when unpacking long long. {ctx.name}: cannot collate {_format_path(path)}: sample {i} "
            f"holds {batch[i]}, which does not fit in int64."
        ) from None
    if ctx.allocate is allocate_batch:
        return values
    out = ctx.allocate(values.shape, dtype)
    out[...] = values
    return out


def _number_mismatch_error(
    batch: Sequence[Any], i: int, float_led: bool, path: tuple, ctx: _Context
) -> Exception:
    """The exception torch raises for a non-number in a number batch, with context."""
    sample = batch[i]
    name = _type_name(sample)
    if float_led:
        error_type, torch_text = TypeError, f"must be real number, not {name}"
    elif isinstance(sample, (str, bytes)):
        error_type, torch_text = TypeError, f"new(): invalid data type '{name}'"
    elif isinstance(sample, (collections.abc.Sequence, np.ndarray, np.generic)):
        error_type, torch_text = TypeError, f"'{name}' object cannot be interpreted as an integer"
    else:
        error_type, torch_text = RuntimeError, f"Could not infer dtype of {name}"
    return error_type(
        f"{torch_text}. {ctx.name}: cannot collate {_format_path(path)}: sample 0 is "
        f"{_type_name(batch[0])} but sample {i} is {name}; every sample must hold a number here."
    )


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


# ---- dtype rules (torch's) ---------------------------------------------------

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


# ---- torch tensors ----------------------------------------------------------

_TORCH_NESTED_MESSAGE = (
    "Batches of nested tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)
_TORCH_SPARSE_MESSAGE = (
    "Batches of sparse tensors are not currently supported by the default collate_fn; "
    "please provide a custom collate_fn to handle them appropriately."
)


def _stack_tensors(batch: Sequence[Any], path: tuple, ctx: _Context, torch: Any) -> Any:
    """``torch.stack(batch)``, as torch collates tensors, with errors that say where."""
    elem = batch[0]
    where = f"{ctx.name}: cannot stack {_format_path(path)}"
    if elem.is_nested:
        raise RuntimeError(f"{_TORCH_NESTED_MESSAGE} {where}.")
    if elem.layout in _sparse_layouts(torch):
        raise RuntimeError(f"{_TORCH_SPARSE_MESSAGE} {where}.")
    for i, sample in enumerate(batch):
        if not isinstance(sample, torch.Tensor):
            raise TypeError(
                f"expected Tensor as element {i} in argument 0, but got {_type_name(sample)}. {where}: "
                f"sample 0 is a torch.Tensor but sample {i} is {_type_name(sample)}."
            )
    shapes = [tuple(t.shape) for t in batch]
    if any(shape != shapes[0] for shape in shapes):
        raise RuntimeError(_unequal_shapes_message(shapes, path, ctx))
    try:
        return torch.stack(batch, 0)
    except (RuntimeError, TypeError, ValueError) as error:
        base = next(t for t in (RuntimeError, TypeError, ValueError) if isinstance(error, t))
        raise base(f"{error}. {where}.") from error


def _sparse_layouts(torch: Any) -> tuple:
    return (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


# --------------------------------------------------------------------------
# Public collate functions
# --------------------------------------------------------------------------


def default_collate(batch: Sequence[Any]) -> Any:
    """Collate a list of samples into a batch of numpy arrays, with torch's rules.

    See the module docstring for the rules. Examples::

        >>> default_collate([0, 1, 2])
        array([0, 1, 2])
        >>> default_collate([{"x": np.zeros(2), "name": "a"}, {"x": np.ones(2), "name": "b"}])
        {'x': array([[0., 0.],
               [1., 1.]]), 'name': ['a', 'b']}
        >>> default_collate([(1, 2.0), (3, 4.0)])
        [array([1, 3]), array([2., 4.])]

    Samples holding torch tensors give tensors (``torch.stack``) at those
    places. Types registered with :func:`register_collate` are collated by
    their function.
    """
    return _collate(batch, (), _Context("default_collate"), None)


def collate(batch: Sequence[Any], *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """:func:`default_collate` with a torch-style ``collate_fn_map`` consulted first.

    Same signature and lookup as ``torch.utils.data._utils.collate.collate``:
    the exact type of ``batch[0]`` is looked up, then each key in insertion
    order with ``isinstance``; the function found is called as
    ``fn(batch, collate_fn_map=collate_fn_map)``. Unlike torch, the built-in
    rules (and :func:`register_collate`'s registry) still apply to types the
    map does not name, so a map needs only the types it changes.
    """
    return _collate(batch, (), _Context("collate", fn_map=collate_fn_map), None)


def collate_into(batch: Sequence[Any], allocate: Allocate) -> Any:
    """:func:`default_collate`, allocating every numpy output with ``allocate(shape, dtype)``.

    The engine's hook for collating straight into shared memory; ``allocate``
    must return a writable array of exactly that shape and dtype.
    """
    return _collate(batch, (), _Context("default_collate", allocate=allocate), None)


def torch_default_collate(batch: Sequence[Any]) -> Any:
    """``torch.utils.data.default_collate``: the same values, dtypes, shapes and containers.

    Computed as ``to_torch(default_collate(batch))``, so the numpy half can run
    anywhere and the tensors share its memory.
    """
    return to_torch(default_collate(batch))


# --------------------------------------------------------------------------
# Conversion (no batching): default_convert, to_torch
# --------------------------------------------------------------------------


def _convert(data: Any, leaf: Callable[[Any], Any], tuples_to_lists: bool) -> Any:
    """Rebuild ``data``'s containers as torch's default_convert does, mapping numpy leaves with ``leaf``."""
    if isinstance(data, (np.ndarray, np.generic)):
        return data if isinstance(data, (str, bytes)) else leaf(data)  # np.str_ / np.bytes_ stay
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, collections.abc.Mapping):
        return _rebuild_mapping(data, {key: _convert(data[key], leaf, tuples_to_lists) for key in data})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_convert(d, leaf, tuples_to_lists) for d in data))
    if isinstance(data, tuple):
        values = [_convert(d, leaf, tuples_to_lists) for d in data]
        if tuples_to_lists:
            return values  # torch's "backwards compatibility"
        return tuple(values) if type(data) is tuple else _rebuild_sequence(data, values)
    if isinstance(data, collections.abc.Sequence):
        return _rebuild_sequence(data, [_convert(d, leaf, tuples_to_lists) for d in data])
    return data


def default_convert(data: Any) -> Any:
    """torch's ``default_convert`` for the core: rebuild containers, keep numpy leaves.

    The structure rules are torch's (tuples become lists, namedtuples and
    mappings keep their type); arrays stay numpy arrays since the core has
    nothing to convert them to. :func:`torch_default_convert` makes tensors.

        >>> default_convert((np.zeros(2), "a"))
        [array([0., 0.]), 'a']
    """
    return _convert(data, _identity, tuples_to_lists=True)


def _identity(x: Any) -> Any:
    return x


def _array_to_tensor(x: Any) -> Any:
    """A numpy leaf as a tensor sharing its memory; string/object arrays stay."""
    import torch

    if isinstance(x, np.ndarray):
        return x if x.dtype.kind in _UNSUPPORTED_KINDS else torch.from_numpy(x)
    return torch.as_tensor(x)


def _numpy_module_leaf_to_tensor(x: Any) -> Any:
    # torch converts only types defined by numpy itself (not ndarray subclasses from elsewhere).
    return _array_to_tensor(x) if type(x).__module__ == "numpy" else x


def torch_default_convert(data: Any) -> Any:
    """``torch.utils.data.default_convert``: numpy leaves become tensors, tuples become lists."""
    return _convert(data, _numpy_module_leaf_to_tensor, tuples_to_lists=True)


def to_torch(tree: Any) -> Any:
    """Turn the numpy leaves of a collated batch into torch tensors, zero-copy.

    Arrays go through ``torch.from_numpy`` (the tensor shares the array's
    memory), numpy scalars through ``torch.as_tensor``; string and object
    arrays, Python numbers, strings, tensors and unknown objects stay as they
    are. Containers keep their exact types (a tuple stays a tuple), so
    ``to_torch(default_collate(b))`` equals torch's ``default_collate(b)``.
    """
    return _convert(tree, _array_to_tensor, tuples_to_lists=False)


# --------------------------------------------------------------------------
# Padding
# --------------------------------------------------------------------------


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
    lengths on the CPU). :class:`TorchPadCollate` returns tensors in every case.
    Instances pickle, so they can be sent to worker processes.
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
        ctx = _Context("PadCollate", allocate=allocate, padding=self)
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
    """:class:`PadCollate` that returns torch tensors (``to_torch`` of its numpy result)."""

    def __call__(self, batch: Sequence[Any]) -> Any:
        return to_torch(super().__call__(batch))


def _child_scope(ctx: _Context, scope: _PadScope | None, key: Any) -> _PadScope | None:
    """The pad scope below mapping key ``key``."""
    padding = ctx.padding
    if padding is None or padding.keys is None:
        return scope
    try:
        named = key in padding.keys
    except TypeError:  # unhashable key
        named = False
    if not named:
        return scope
    ctx.pad_keys_seen.add(key)
    value = padding.pad_value[key] if isinstance(padding.pad_value, dict) else padding.pad_value
    return _PadScope(value, explicit=True)


def _is_number_list(x: Any) -> bool:
    """A (nested) list or tuple of numbers, judged by its first element (empty counts)."""
    while isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        if len(x) == 0:
            return True
        x = x[0]
    return _scalar_dtype(x) is not None and not isinstance(x, np.ndarray)


def _pad_leaf(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope) -> Any:
    if _holds_tensor(batch):
        return _pad_tensors(batch, path, ctx, scope, sys.modules["torch"])
    arrays = _as_pad_arrays(batch, path, ctx)
    lengths, total = _check_pad_shapes([a.shape for a in arrays], path, ctx)
    dtype = _result_dtype([a.dtype for a in arrays], path, ctx)
    fill = _checked_fill(scope.value, dtype, path, ctx)
    side = ctx.padding.side
    values = ctx.allocate((len(arrays), total) + arrays[0].shape[1:], dtype)
    for i, array in enumerate(arrays):
        data, pad = _pad_slices(lengths[i], total, side)
        values[i, data] = array
        values[i, pad] = fill
    lengths_out = mask = None
    if ctx.padding.return_lengths:
        lengths_out = ctx.allocate((len(arrays),), _INT64)
        lengths_out[...] = lengths
    if ctx.padding.return_mask:
        mask = ctx.allocate((len(arrays), total), _BOOL)
        positions, sample_lengths = np.arange(total), np.asarray(lengths, _INT64)[:, None]
        if side == "right":
            np.less(positions, sample_lengths, out=mask)
        else:
            np.greater_equal(positions, total - sample_lengths, out=mask)
    return ctx.padding._result(values, lengths_out, mask)


def _as_pad_arrays(batch: Sequence[Any], path: tuple, ctx: _Context) -> list[np.ndarray]:
    """The samples as arrays; (nested) lists of numbers are converted, empty ones shaped like the rest."""
    arrays = []
    for i, sample in enumerate(batch):
        if isinstance(sample, (list, tuple)):
            if len(sample) == 0:
                arrays.append(None)  # shaped once the others are known
                continue
            try:
                sample = np.asarray(sample)
            except ValueError:  # ragged nesting
                sample = np.empty(0, object)
            if sample.dtype.kind not in _NUMERIC_KINDS:
                raise TypeError(
                    f"PadCollate: cannot pad {_format_path(path)}: sample {i} is not a (nested) list of "
                    f"numbers of one shape."
                )
        if not isinstance(sample, np.ndarray):
            raise _mismatch_error(batch, i, "an array", path, ctx)
        if sample.dtype.kind in _UNSUPPORTED_KINDS:
            raise TypeError(
                _TORCH_TYPE_MESSAGE.format(sample.dtype)
                + f". PadCollate: cannot pad {_format_path(path)}: sample {i} has dtype {sample.dtype}."
            )
        arrays.append(sample)
    return _shape_empty_lists(arrays)


def _shape_empty_lists(arrays: list) -> list[np.ndarray]:
    """Give empty lists (None here) the trailing shape and dtype of the other samples.

    To numpy ``[]`` is a float64 array of shape (0,); as one sample among token
    lists it must neither turn the batch into floats nor break a 2-D layout.
    """
    if all(a is not None for a in arrays):
        return arrays
    model = next((a for a in arrays if a is not None), np.zeros(0, _INT64))
    empty = np.zeros((0,) + model.shape[1:], model.dtype)
    return [empty if a is None else a for a in arrays]


def _check_pad_shapes(shapes: Sequence[tuple], path: tuple, ctx: _Context) -> tuple[list[int], int]:
    """The sample lengths and the padded length; samples must agree on every axis but the first."""
    for i, shape in enumerate(shapes):
        if len(shape) == 0:
            raise RuntimeError(
                f"PadCollate: cannot pad {_format_path(path)}: sample {i} is 0-dimensional; padded values "
                f"need a first (sequence) axis.{_keys_hint(ctx)}"
            )
    rests = [shape[1:] for shape in shapes]
    if any(rest != rests[0] for rest in rests):
        j = _differing(rests)[0]
        raise RuntimeError(
            f"{_TORCH_STACK_MESSAGE.format(list(shapes[0]), 0, list(shapes[j]), j)}. "
            f"PadCollate: cannot pad {_format_path(path)}: samples may differ only in their first axis; "
            f"{_disagreement(rests, 'trailing shape')}.{_keys_hint(ctx)}"
        )
    lengths = [shape[0] for shape in shapes]
    return lengths, ctx.padding._padded_length(max(lengths))


def _keys_hint(ctx: _Context) -> str:
    return " Pass keys=[...] to pad only the values under some keys." if ctx.padding.keys is None else ""


def _pad_slices(length: int, total: int, side: str) -> tuple[slice, slice]:
    """(where the data goes, where the padding goes) along the first axis."""
    if side == "right":
        return slice(0, length), slice(length, total)
    return slice(total - length, total), slice(0, total - length)


def _checked_fill(value: Any, dtype: np.dtype, path: tuple, ctx: _Context) -> np.ndarray:
    """``value`` as a scalar of ``dtype``; ValueError if it does not survive the cast."""
    problem = None
    try:
        with np.errstate(all="ignore"):
            fill = np.asarray(value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as error:
        problem = str(error)
    else:
        if fill.shape != () or not (fill == value or (fill != fill and value != value)):
            problem = f"it becomes {fill!r}"
    if problem is not None:
        raise ValueError(
            f"PadCollate: pad value {value!r} does not fit dtype {dtype} of {_format_path(path)} ({problem}); "
            f"choose a pad value the dtype can hold, or pass a mapping pad_value={{key: value}}."
        )
    return fill


def _pad_tensors(batch: Sequence[Any], path: tuple, ctx: _Context, scope: _PadScope, torch: Any) -> Any:
    """Pad a batch holding torch tensors with torch ops (on the tensors' device)."""
    tensors = [s if isinstance(s, torch.Tensor) else torch.as_tensor(s) for s in batch]
    lengths, total = _check_pad_shapes([tuple(t.shape) for t in tensors], path, ctx)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    numpy_dtype = _numpy_dtype_of(dtype, torch)
    if numpy_dtype is not None:
        _checked_fill(scope.value, numpy_dtype, path, ctx)
    side = ctx.padding.side
    values = tensors[0].new_empty((len(tensors), total) + tuple(tensors[0].shape[1:]), dtype=dtype)
    for i, tensor in enumerate(tensors):
        data, pad = _pad_slices(lengths[i], total, side)
        values[i, data] = tensor
        values[i, pad] = scope.value
    lengths_out = torch.tensor(lengths, dtype=torch.int64) if ctx.padding.return_lengths else None
    mask = None
    if ctx.padding.return_mask:
        positions = torch.arange(total, device=values.device)
        sample_lengths = torch.tensor(lengths, dtype=torch.int64, device=values.device)[:, None]
        mask = positions < sample_lengths if side == "right" else positions >= total - sample_lengths
    return ctx.padding._result(values, lengths_out, mask)


def _numpy_dtype_of(dtype: Any, torch: Any) -> np.dtype | None:
    """The numpy dtype of a torch dtype, or None where numpy has none (bfloat16, ...)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except (TypeError, RuntimeError):  # bfloat16 and friends have no numpy dtype
        return None
