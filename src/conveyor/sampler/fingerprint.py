"""The fingerprints of the arguments that shape a sampler's order, which a state records and checks.

::

    sampler's arguments ──▶ counts, flags, and for a long argument (weights, indices, lengths)
                            its CRC-32: values_crc32, once per argument object (Crc32Of)
        conveyor's samplers ──▶ their own state dict (_settings), checked by their load_state_dict
        torch's own samplers ──▶ the loader's settings (torch_sampler_arguments), checked by the loader's

A state saved mid-epoch holds the epoch's draw and a position in it; loaded
into a sampler whose weights, indices or lengths differ in value only (the
count is the same) it would yield another order, repeating some samples and
skipping others. The state therefore carries, for each such argument, the
key ``<argument>_crc32``: the CRC-32 of its values as little-endian int64 (or
float64) bytes, a few bytes whatever the data set's size. A state saved
before a fingerprint was recorded lacks its key and is accepted (the count
and the other settings are still checked): see :func:`is_fingerprint`.
"""

from __future__ import annotations

import weakref
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np

from conveyor.rng import is_torch_generator

#: How a key that holds an argument's fingerprint ends.
FINGERPRINT_SUFFIX = "_crc32"


def values_crc32(values: Any) -> int:
    """The CRC-32 of ``values`` (a sequence, an array, a tensor, a range):
    integers and booleans as little-endian int64, floats as float64, so the
    same numbers give the same fingerprint whatever their container or dtype;
    anything else (strings, mixed objects) by the text of each value."""
    array = _as_array(values)
    if array.dtype.kind in "biu":
        return zlib.crc32(np.ascontiguousarray(array, dtype="<i8").tobytes())
    if array.dtype.kind == "f":
        return zlib.crc32(np.ascontiguousarray(array, dtype="<f8").tobytes())
    return zlib.crc32("\x1f".join(map(repr, array.ravel().tolist())).encode("utf-8"))


def _as_array(values: Any) -> np.ndarray:
    if isinstance(values, range):
        return np.arange(values.start, values.stop, values.step, dtype=np.int64)
    try:
        return np.asarray(values)
    except (TypeError, ValueError, RuntimeError):  # (a tensor that needs grad or is on a device; ragged items)
        tolist = getattr(values, "tolist", None)
        items = tolist() if callable(tolist) else list(values)
        return np.asarray(items, dtype=object if not items or not _all_numbers(items) else None)


def _all_numbers(items: Iterable[Any]) -> bool:
    return all(isinstance(item, (int, float, np.number)) for item in items)


class Crc32Of:
    """The fingerprint of one argument, computed once per object it is given.

    Holds the object it last fingerprinted, so another object (an attribute
    set anew) is fingerprinted again, and a reused ``id`` cannot fool it;
    values changed in place after the first call are not seen (a sampler's
    arguments are fixed at construction, as in torch)."""

    __slots__ = ("_values", "_length", "_crc32")

    def __init__(self) -> None:
        self._values: Any = None
        self._length = -1
        self._crc32 = 0

    def __call__(self, values: Any) -> int:
        length = len(values)
        if values is not self._values or length != self._length:
            self._crc32 = values_crc32(values)
            self._values, self._length = values, length
        return self._crc32


def is_fingerprint(key: str) -> bool:
    """Whether a settings key holds an argument's fingerprint: optional on
    load (a state saved before it was recorded lacks it)."""
    return key.endswith(FINGERPRINT_SUFFIX)


def describe_arguments(keys: Iterable[str]) -> str:
    """The arguments that ``keys`` (settings that differ) stand for, for an
    error: ``weights_crc32`` is the weights, ``RandomSampler.num_samples``
    the RandomSampler's num_samples."""
    names = []
    for key in keys:
        owner, _, name = key.rpartition(".")
        if is_fingerprint(name):
            name = f"{name[: -len(FINGERPRINT_SUFFIX)]} ({name}: the CRC-32 of its values)"
        names.append(f"{owner}'s {name}" if owner else name)
    return ", ".join(names)


# ------------------------------------------------------------ torch's own samplers

#: Modules of torch's own sampler classes (read by attribute: conveyor imports no torch here).
_TORCH_SAMPLER_MODULES = frozenset({"torch.utils.data.sampler", "torch.utils.data.distributed"})
#: Each torch sampler's fingerprints, made once (keyed weakly: the sampler is the user's).
_TORCH_CRC32S: "weakref.WeakKeyDictionary[Any, dict[str, Crc32Of]]" = weakref.WeakKeyDictionary()


def torch_sampler_arguments(index_sampler: Any) -> dict[str, Any]:
    """The arguments that shape the order of torch's own samplers in a
    loader's ``index_sampler`` (itself, or inside a BatchSampler of torch's
    or conveyor's), as settings keys ``<Class>.<argument>``; {} when there are
    none. conveyor's samplers are left out: their own state records and
    checks theirs. Only torch's exact classes are read (a subclass may shape
    its order otherwise), and only through samplers of torch or conveyor (a
    sampler of the user's decides what its inner one means)."""
    arguments: dict[str, Any] = {}
    sampler, seen = index_sampler, 0
    while sampler is not None and seen < _MAX_DEPTH:
        module = type(sampler).__module__
        if module in _TORCH_SAMPLER_MODULES:
            kind = type(sampler).__name__
            arguments.update({f"{kind}.{name}": value for name, value in _torch_arguments(sampler, kind).items()})
        elif not module.startswith("conveyor."):
            break
        inner = getattr(sampler, "sampler", None)
        sampler, seen = (None if inner is sampler else inner), seen + 1
    return arguments


#: Samplers inside samplers looked into (a BatchSampler over a sampler is two).
_MAX_DEPTH = 4


def _torch_arguments(sampler: Any, kind: str) -> dict[str, Any]:
    """One torch sampler's order-shaping arguments (JSON values)."""
    if kind == "SequentialSampler":
        return {"dataset_length": len(sampler.data_source)}
    if kind == "RandomSampler":
        return {
            "dataset_length": len(sampler.data_source),
            "num_samples": int(sampler.num_samples),
            "replacement": bool(sampler.replacement),
            "generator": _generator_kind(sampler.generator),
        }
    if kind == "SubsetRandomSampler":
        return {
            "num_indices": len(sampler.indices),
            "indices_crc32": _torch_crc32(sampler, "indices"),
            "generator": _generator_kind(sampler.generator),
        }
    if kind == "WeightedRandomSampler":
        return {
            "num_weights": len(sampler.weights),
            "weights_crc32": _torch_crc32(sampler, "weights"),
            "num_samples": int(sampler.num_samples),
            "replacement": bool(sampler.replacement),
            "generator": _generator_kind(sampler.generator),
        }
    if kind == "BatchSampler":
        return {"batch_size": sampler.batch_size, "drop_last": bool(sampler.drop_last)}
    if kind == "DistributedSampler":  # (rank left out, as conveyor's DistributedSampler does)
        return {
            "dataset_length": len(sampler.dataset),
            "num_replicas": int(sampler.num_replicas),
            "shuffle": bool(sampler.shuffle),
            "seed": int(sampler.seed),
            "drop_last": bool(sampler.drop_last),
        }
    return {}


def _torch_crc32(sampler: Any, name: str) -> int:
    try:
        crc32s = _TORCH_CRC32S.setdefault(sampler, {})
    except TypeError:  # (not weakly referenceable: fingerprinted each time)
        return values_crc32(getattr(sampler, name))
    return crc32s.setdefault(name, Crc32Of())(getattr(sampler, name))


def _generator_kind(generator: Any) -> str:
    if generator is None:
        return "global"
    if is_torch_generator(generator):
        return "torch"
    return "numpy" if isinstance(generator, np.random.Generator) else type(generator).__name__
