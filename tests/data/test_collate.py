"""conveyor.collate against torch.utils.data's default_collate / default_convert.

Every structure is collated both ways and compared exactly: values, dtypes,
shapes and container types, recursively. The core (numpy) result is compared
after converting its arrays with a converter local to this file, so a bug in
conveyor's own ``to_torch`` cannot hide one in ``default_collate``.
"""

from __future__ import annotations

import collections
import doctest
import importlib
import pickle
import pkgutil
import subprocess
import sys
import types
import typing
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from torch.utils.data import default_collate as torch_collate
from torch.utils.data import default_convert as torch_convert

import conveyor.collate as cc
from conveyor.collate import (
    PadCollate,
    Padded,
    TorchPadCollate,
    collate,
    collate_into,
    default_collate,
    default_convert,
    register_collate,
    to_torch,
    torch_default_collate,
    torch_default_convert,
    unregister_collate,
)

# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def assert_same(actual, expected, where="batch"):
    """Equal values, dtypes, shapes and exact container types, recursively."""
    assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        np.testing.assert_array_equal(actual, expected, err_msg=where)
    elif isinstance(expected, collections.abc.Mapping):
        assert list(actual) == list(expected), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)) or (
        isinstance(expected, collections.abc.Sequence) and not isinstance(expected, (str, bytes))
    ):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected or (actual != actual and expected != expected), where


def numpy_to_torch(tree):
    """This file's own numpy -> torch leaf converter, keeping container types."""
    if isinstance(tree, (str, bytes)):
        return tree
    if isinstance(tree, np.ndarray):
        return tree if tree.dtype.kind in "SUO" else torch.from_numpy(tree)
    if isinstance(tree, np.generic):
        return torch.as_tensor(tree)
    if isinstance(tree, defaultdict):
        out = defaultdict(tree.default_factory)
        out.update((k, numpy_to_torch(v)) for k, v in tree.items())
        return out
    if isinstance(tree, collections.abc.Mapping):
        return type(tree)({k: numpy_to_torch(v) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(numpy_to_torch(v) for v in tree))
    if isinstance(tree, (list, tuple, collections.UserList)):
        return type(tree)(numpy_to_torch(v) for v in tree)
    return tree


def contains_tensor(tree):
    if isinstance(tree, torch.Tensor):
        return True
    if isinstance(tree, collections.abc.Mapping):
        return any(contains_tensor(v) for v in tree.values())
    if isinstance(tree, (list, tuple, collections.UserList)):
        return any(contains_tensor(v) for v in tree)
    return False


def check_like_torch(batch):
    """Both flavours of conveyor give torch's default_collate result for ``batch``."""
    expected = torch_collate(batch)
    assert_same(torch_default_collate(batch), expected)
    core = default_collate(batch)
    if not any(contains_tensor(sample) for sample in batch):
        assert not contains_tensor(core), "the core must return numpy arrays"
    assert_same(numpy_to_torch(core), expected)


def raises_like_torch(batch, *fragments):
    """conveyor raises torch's exception type, with torch's text first and conveyor's context."""
    with pytest.raises(Exception) as torch_error:
        torch_collate(batch)
    for fn in (default_collate, torch_default_collate):
        with pytest.raises(Exception) as ours:
            fn(batch)
        assert type(ours.value) is type(torch_error.value), (ours.value, torch_error.value)
        for fragment in fragments:
            assert fragment in str(ours.value)
    return ours.value


Point = namedtuple("Point", ["x", "y"])


class TypedPoint(typing.NamedTuple):
    x: typing.Any
    y: typing.Any


class FrozenMapping(collections.abc.Mapping):
    """Immutable mapping constructible from a dict."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)

    def __eq__(self, other):
        return isinstance(other, FrozenMapping) and self._data == other._data


class PickyMapping(FrozenMapping):
    """A mapping whose constructor takes no dict: collates into a plain dict (as torch)."""

    def __init__(self, **kwargs):
        super().__init__(kwargs)


class Row(collections.UserList):
    pass


# --------------------------------------------------------------------------
# Differential: structures and leaves
# --------------------------------------------------------------------------

NUMPY_DTYPES = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


def _arr(dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    return np.asarray(rng.standard_normal(shape) * 10).astype(dtype)


CASES = {
    "ints": [0, 1, -5, 2**62],
    "floats": [0.5, -1.25, float("inf"), float("nan")],
    "bools": [True, False, True],
    "int-led mix with float (float32 as torch)": [1, 2.5, 3],
    "int-led mix with bool": [True, 1],
    "bool-led mix with float": [True, 2.5],
    "float-led mix (float64)": [1.0, 2, True],
    "int + complex": [1, 2j],
    "int + np.float64": [1, np.float64(2.5)],
    "int + np.float32": [1, np.float32(2.5)],
    "int + 0-d array": [1, np.array(2.5)],
    "np.float32 scalars": [np.float32(1), np.float32(2)],
    "np.float16 + python float": [np.float16(1), 2.5],
    "np.int8 + np.uint8": [np.int8(1), np.uint8(2)],
    "np.float32 + np.float64": [np.float32(1), np.float64(2)],
    "np.bool_": [np.bool_(True), np.bool_(False)],
    "np.complex64 + int": [np.complex64(1 + 2j), 2],
    "np.uint16": [np.uint16(7), np.uint16(9)],
    "strings": ["a", "bb", ""],
    "bytes": [b"a", b"b"],
    "np.str_": [np.str_("a"), np.str_("b")],
    "0-d arrays": [np.array(1.5), np.array(2.5)],
    "array + number": [np.array(1), 2],
    "array + python float": [np.array(1), 2.5],
    "arrays int64+float32": [np.zeros(3, np.int64), np.ones(3, np.float32)],
    "arrays float16+int64": [np.zeros(3, np.float16), np.ones(3, np.int64)],
    "arrays bool+uint8": [np.zeros(3, np.bool_), np.ones(3, np.uint8)],
    "arrays int8+uint8": [np.zeros(3, np.int8), np.ones(3, np.uint8)],
    "arrays complex64+float64": [np.zeros(2, np.complex64), np.ones(2, np.float64)],
    "memmap-like subclass": [np.arange(4.0).view(np.memmap), np.arange(4.0).view(np.memmap)],
    "non-contiguous arrays": [np.arange(12).reshape(3, 4).T, np.arange(12, 24).reshape(3, 4).T],
    "dict": [{"a": 1, "b": np.zeros(2)}, {"a": 2, "b": np.ones(2)}],
    "OrderedDict": [OrderedDict(b=1, a=2.0), OrderedDict(b=3, a=4.0)],
    "defaultdict": [defaultdict(list, x=1), defaultdict(list, x=2)],
    "immutable mapping": [FrozenMapping({"k": 1}), FrozenMapping({"k": 2})],
    "mapping without dict constructor": [PickyMapping(k=1), PickyMapping(k=2)],
    "mappingproxy": [types.MappingProxyType({"k": 1}), types.MappingProxyType({"k": 2})],
    "namedtuple": [Point(1, np.zeros(2)), Point(2, np.ones(2))],
    "typing.NamedTuple": [TypedPoint("a", 1.0), TypedPoint("b", 2.0)],
    "tuple -> list": [(1, "a", 2.0), (3, "b", 4.0)],
    "tuple of strings stays a tuple": [("a", 1), ("b", 2)],
    "list": [[1, 2], [3, 4]],
    "UserList": [Row([1, 2.0]), Row([3, 4.0])],
    "range": [range(2), range(2)],
    "list of str under a list": [["a"], ["b"]],
    "nested": [
        {"img": np.zeros((2, 3), np.uint8), "meta": {"id": 1, "tags": ("x", "y")}, "pts": [Point(1, 2.0)]},
        {"img": np.ones((2, 3), np.uint8), "meta": {"id": 2, "tags": ("z", "w")}, "pts": [Point(3, 4.0)]},
    ],
    "tensors": [torch.arange(3), torch.arange(3, 6)],
    "0-d tensors": [torch.tensor(1.5), torch.tensor(2.5)],
    "tensors of mixed dtype": [torch.zeros(2, dtype=torch.int64), torch.ones(2)],
    "tensors in dicts": [{"t": torch.zeros(2, 2), "n": 1}, {"t": torch.ones(2, 2), "n": 2}],
    "int + 0-d tensor": [1, torch.tensor(2)],
    "float + 0-d tensor": [1.0, torch.tensor(2)],
    "array + tensor": [np.zeros(2, np.float32), torch.ones(2)],
    "mixed numpy and tensors": [(np.zeros(2), torch.zeros(3), 1), (np.ones(2), torch.ones(3), 2)],
}


@pytest.mark.parametrize("name", list(CASES))
def test_collate_matches_torch(name):
    check_like_torch(CASES[name])


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (3,), (2, 3)], ids=str)
def test_arrays_of_every_dtype_match_torch(dtype, shape):
    check_like_torch([_arr(dtype, shape, seed) for seed in range(3)])


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_scalars_of_every_dtype_match_torch(dtype):
    batch = [np.dtype(dtype).type(v) for v in (0, 1, 1)]
    if dtype is np.uint64:
        # torch 2.13 fails here ("TypeError: an integer is required"); conveyor collates them.
        with pytest.raises(TypeError):
            torch_collate(batch)
        assert torch_default_collate(batch).dtype == torch.uint64
        return
    check_like_torch(batch)


def test_core_returns_numpy_with_torch_dtypes():
    out = default_collate([{"x": np.zeros((2, 2), np.float32), "y": 1, "z": 0.5, "b": True}] * 3)
    assert isinstance(out["x"], np.ndarray) and out["x"].shape == (3, 2, 2) and out["x"].dtype == np.float32
    assert out["y"].dtype == np.int64 and out["z"].dtype == np.float64 and out["b"].dtype == np.bool_


def test_output_is_a_fresh_plain_ndarray():
    samples = [np.arange(3).view(np.memmap), np.arange(3).view(np.memmap)]
    out = default_collate(samples)
    assert type(out) is np.ndarray and out.flags.c_contiguous and out.flags.writeable
    samples[0][0] = 100
    assert out[0, 0] == 0


def test_defaultdict_keeps_its_factory():
    out = default_collate([defaultdict(list, x=1), defaultdict(list, x=2)])
    assert out.default_factory is list
    assert torch_default_collate([defaultdict(list, x=1)]).default_factory is list


def test_big_endian_arrays_collate_to_native_order():
    # Deliberate difference: torch raises ValueError for non-native byte order.
    out = default_collate([np.arange(3, dtype=">i4"), np.arange(3, dtype=">i4")])
    assert out.dtype == np.dtype("=i4") and out.dtype.isnative
    assert out.tolist() == [[0, 1, 2], [0, 1, 2]]
    assert torch_default_collate([np.zeros(2, ">f4")]).dtype == torch.float32


def test_float_dtype_follows_torch_default_dtype():
    batch = [1, 2.5]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        check_like_torch(batch)
        assert default_collate(batch).dtype == np.float64
    finally:
        torch.set_default_dtype(previous)
    assert default_collate(batch).dtype == np.float32


def test_promotion_rules_match_torch_for_every_pair():
    dtypes = [np.dtype(d) for d in NUMPY_DTYPES]
    for a in dtypes:
        for b in dtypes:
            try:
                expected = torch.stack([torch.from_numpy(np.zeros(1, a)), torch.from_numpy(np.zeros(1, b))]).dtype
            except RuntimeError:
                with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64"):
                    default_collate([np.zeros(1, a), np.zeros(1, b)])
                continue
            assert torch_default_collate([np.zeros(1, a), np.zeros(1, b)]).dtype == expected, (a, b)


# --------------------------------------------------------------------------
# default_convert
# --------------------------------------------------------------------------

CONVERT_CASES = {
    "int": 1,
    "str": "abc",
    "array": np.arange(3),
    "np scalar": np.float32(1.5),
    "str array stays": np.array(["a"]),
    "tuple -> list": (np.zeros(2), 1, "a"),
    "namedtuple": Point(np.zeros(1), 2),
    "dict": {"a": np.ones(2), "b": [np.int64(3), "x"]},
    "defaultdict": defaultdict(int, a=np.ones(1)),
    "OrderedDict": OrderedDict(z=np.zeros(1), a=1),
    "UserList": Row([np.zeros(1), 2]),
    "range": range(3),
    "tensor": torch.ones(2),
    "np.str_": np.str_("a"),
}


@pytest.mark.parametrize("name", list(CONVERT_CASES))
def test_convert_matches_torch(name):
    data = CONVERT_CASES[name]
    expected = torch_convert(data)
    assert_same(torch_default_convert(data), expected)
    core = default_convert(data)
    assert not contains_tensor(core) or name == "tensor"
    assert_same(numpy_to_torch(core), expected)


def test_default_convert_keeps_numpy():
    out = default_convert({"a": (np.zeros(2), 1)})
    assert type(out["a"]) is list and isinstance(out["a"][0], np.ndarray)


# --------------------------------------------------------------------------
# to_torch
# --------------------------------------------------------------------------


def test_to_torch_is_zero_copy_and_keeps_containers():
    tree = {
        "a": np.arange(4),
        "b": (np.zeros(2), "s"),
        "c": Padded(np.ones(2), None, None),
        "d": 3,
        "e": np.float32(2.0),
        "f": np.array(["x"]),
    }
    out = to_torch(tree)
    assert isinstance(out["a"], torch.Tensor)
    out["a"][0] = 42
    assert tree["a"][0] == 42, "to_torch must share memory"
    assert type(out["b"]) is tuple and out["b"][1] == "s"
    assert type(out["c"]) is Padded and out["c"].lengths is None
    assert out["d"] == 3 and type(out["d"]) is int
    assert out["e"].dtype == torch.float32 and out["e"].ndim == 0
    assert isinstance(out["f"], np.ndarray)


def test_to_torch_of_collate_into_shares_the_allocated_memory():
    buffers = []

    def allocate(shape, dtype):
        buffers.append(np.zeros(shape, dtype))
        return buffers[-1]

    out = to_torch(collate_into([np.ones(3), np.ones(3)], allocate))
    out[0, 0] = 7
    assert buffers[0][0, 0] == 7


# --------------------------------------------------------------------------
# Errors: torch's type and wording first, then where and why
# --------------------------------------------------------------------------


def test_unequal_array_shapes_name_path_positions_and_shapes():
    batch = [{"image": np.zeros((3, 224, 224), np.float32)} for _ in range(8)]
    batch[5]["image"] = np.zeros((3, 200, 224), np.float32)
    batch[7]["image"] = np.zeros((3, 200, 224), np.float32)
    error = raises_like_torch(batch, "stack expects each tensor to be equal size")
    message = str(error)
    assert message.startswith(
        "stack expects each tensor to be equal size, but got [3, 224, 224] at entry 0 and [3, 200, 224] at entry 5"
    )
    assert 'batch["image"]' in message
    assert "sample 0 has shape (3, 224, 224) but sample 5 has shape (3, 200, 224)" in message
    assert "5, 7" in message and "Resize or crop" in message
    assert "PadCollate" not in message  # not a first-axis difference: padding would not help


def test_unequal_first_axis_suggests_padding():
    batch = [(np.zeros(3), 0), (np.zeros(5), 1)]
    message = str(raises_like_torch(batch, "stack expects each tensor to be equal size", "batch[0]"))
    assert "PadCollate" in message


def test_error_paths_through_tuples_and_namedtuples():
    batch = [({"boxes": np.zeros((2, 4))}, 0), ({"boxes": np.zeros((3, 4))}, 1)]
    raises_like_torch(batch, 'cannot stack batch[0]["boxes"]: sample 0 has shape (2, 4) but sample 1 has shape (3, 4)')
    batch = [Point(np.zeros(2), 0), Point(np.zeros(3), 1)]
    raises_like_torch(batch, "cannot stack batch.x:")


def test_many_differing_samples_are_listed_then_elided():
    batch = [np.zeros(2)] + [np.zeros(3)] * 20
    message = str(raises_like_torch(batch, "20 of 21 samples differ from sample 0: 1, 2, 3, 4, 5, 6, 7, 8, ..."))
    assert "9," not in message


def test_unequal_tensor_shapes():
    batch = [{"x": [torch.zeros(2), torch.zeros(4)]}, {"x": [torch.zeros(2), torch.zeros(3)]}]
    message = str(raises_like_torch(batch, "stack expects each tensor to be equal size", 'batch["x"][1]'))
    assert "sample 0 has shape (4,) but sample 1 has shape (3,)" in message


def test_unequal_sequence_lengths():
    batch = [{"ids": [1, 2, 3]}, {"ids": [1, 2, 3]}, {"ids": [1, 2]}]
    message = str(raises_like_torch(batch, "each element in list of batch should be of equal size", 'batch["ids"]'))
    assert message.startswith("each element in list of batch should be of equal size")
    assert "sample 0 has length 3 but sample 2 has length 2" in message


@pytest.mark.parametrize(
    "batch, fragment",
    [
        ([{1}, {2}], "found <class 'set'>"),
        ([None, None], "found <class 'NoneType'>"),
        ([1j, 2j], "found <class 'complex'>"),
        ([np.datetime64("2020-01-01")] * 2, "found <class 'numpy.datetime64'>"),
        ([np.array(["a"]), np.array(["b"])], "found <U1"),
        ([np.array([None]), np.array([None])], "found object"),
        ([np.array([1]), np.array(["b"])], "sample 1"),
    ],
)
def test_unsupported_types_raise_type_error_with_torch_wording(batch, fragment):
    error = raises_like_torch([{"f": b} for b in batch], fragment, 'batch["f"]')
    assert isinstance(error, TypeError)
    assert str(error).startswith("default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists")


@pytest.mark.parametrize(
    "batch",
    [
        [1, None],
        [1, "a"],
        [1, [2]],
        [1, {}],
        [1.0, "a"],
        [1.0, None],
        [1.0, 1j],
        [True, b"x"],
        [np.float32(1), None],
        [np.float32(1), "a"],
        [np.array([1]), None],
        [torch.zeros(2), 1],
        [torch.zeros(2), np.zeros(2)],
        [{"a": 1}, [1]],
        [[1], 1],
        [1, 2**63],
        [np.int64(1), np.uint64(2)],
    ],
    ids=repr,
)
def test_mixed_kinds_raise_torch_exception_types(batch):
    raises_like_torch(batch, "sample 1")


def test_missing_key_is_a_key_error_naming_samples():
    batch = [{"a": 1, "m": {"k": 1}}, {"a": 2, "m": {"k": 1}}, {"a": 3, "m": {}}]
    error = raises_like_torch(batch, 'batch["m"]', 'sample 2 has no key "k"')
    assert isinstance(error, KeyError)


def test_empty_batch_is_an_index_error():
    raises_like_torch([])


def test_nested_tensors_are_refused_like_torch():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nt = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
    raises_like_torch([nt, nt], "Batches of nested tensors are not currently supported")


def test_sparse_tensors_are_refused_like_torch():
    sp = torch.zeros(2, 2).to_sparse()
    raises_like_torch([sp, sp], "Batches of sparse tensors are not currently supported")


# --------------------------------------------------------------------------
# Registry and collate_fn_map
# --------------------------------------------------------------------------


class Box:
    def __init__(self, xyxy, label):
        self.xyxy = xyxy
        self.label = label


class RotatedBox(Box):
    pass


@pytest.fixture
def registry():
    registered = []

    def register(types_, fn):
        register_collate(types_, fn)
        registered.append(types_)

    yield register
    for types_ in registered:
        unregister_collate(types_)


def collate_box(batch, *, collate):
    return {"xyxy": collate([b.xyxy for b in batch], key="xyxy"), "label": collate([b.label for b in batch])}


def test_registered_type_is_collated_by_its_function(registry):
    registry(Box, collate_box)
    batch = [{"box": Box(np.zeros(4), 1)}, {"box": Box(np.ones(4), 2)}]
    out = default_collate(batch)
    assert out["box"]["xyxy"].shape == (2, 4) and out["box"]["label"].tolist() == [1, 2]
    out = torch_default_collate(batch)
    assert isinstance(out["box"]["xyxy"], torch.Tensor)


def test_most_specific_registration_wins(registry):
    registry(Box, lambda batch, *, collate: "box")
    assert default_collate([RotatedBox(0, 0)] * 2) == "box"
    registry(RotatedBox, lambda batch, *, collate: "rotated")
    assert default_collate([RotatedBox(0, 0)] * 2) == "rotated"
    assert default_collate([Box(0, 0)] * 2) == "box"


def test_registration_overrides_builtin_rules(registry):
    class Tags(list):
        pass

    registry(Tags, lambda batch, *, collate: [list(t) for t in batch])
    assert default_collate([Tags([1, 2]), Tags([3])]) == [[1, 2], [3]]


def test_register_as_decorator_with_tuple_and_unregister():
    class A:
        pass

    class B:
        pass

    @register_collate((A, B))
    def count(batch, *, collate):
        return len(batch)

    try:
        assert default_collate([A(), A()]) == 2 and default_collate([B()]) == 1
    finally:
        unregister_collate((A, B))
    with pytest.raises(TypeError, match="found <class"):
        default_collate([A()])


def test_register_rejects_non_types():
    with pytest.raises(TypeError):
        register_collate("Box", collate_box)
    with pytest.raises(TypeError):
        register_collate(Box, "not callable")


def test_errors_inside_registered_collation_carry_the_path(registry):
    registry(Box, collate_box)
    batch = [{"box": Box(np.zeros(4), 1)}, {"box": Box(np.zeros(5), 2)}]
    with pytest.raises(RuntimeError, match=r'batch\["box"\]\["xyxy"\]'):
        default_collate(batch)


needs_notes = pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes arrived in Python 3.11")


@needs_notes
def test_foreign_errors_get_a_note_with_the_path(registry):
    def broken(batch, *, collate):
        raise ZeroDivisionError("boom")

    registry(Box, broken)
    with pytest.raises(ZeroDivisionError) as info:
        default_collate([{"b": [Box(0, 0)]}] * 2)
    assert any('batch["b"][0]' in note for note in getattr(info.value, "__notes__", []))


def test_collate_fn_map_uses_torch_lookup_and_signature():
    calls = []

    def ints(batch, *, collate_fn_map):
        calls.append(collate_fn_map)
        return ("ints", tuple(batch))

    fn_map = {bool: lambda batch, *, collate_fn_map: "bools", int: ints}
    out = collate([{"a": 1, "b": True, "c": 2.0}, {"a": 2, "b": False, "c": 3.0}], collate_fn_map=fn_map)
    assert out["a"] == ("ints", (1, 2)) and out["b"] == "bools"
    assert isinstance(out["c"], np.ndarray) and out["c"].dtype == np.float64  # built-ins still apply
    assert calls == [fn_map]


def test_collate_fn_map_accepts_torch_style_recursion():
    def tensor_pairs(batch, *, collate_fn_map):
        return collate([list(pair) for pair in batch], collate_fn_map=collate_fn_map)

    out = collate([(1, 2), (3, 4)], collate_fn_map={tuple: tensor_pairs})
    assert [x.tolist() for x in out] == [[1, 3], [2, 4]]


@needs_notes
def test_collate_fn_map_errors_get_a_note_with_the_path():
    def broken(batch, *, collate_fn_map):
        raise ValueError("boom")

    with pytest.raises(ValueError) as info:
        collate([{"k": Box(0, 0)}], collate_fn_map={Box: broken})
    assert any('batch["k"]' in note for note in info.value.__notes__)


def test_collate_fn_map_takes_precedence_over_registry(registry):
    registry(Box, lambda batch, *, collate: "registry")
    assert collate([Box(0, 0)], collate_fn_map={Box: lambda batch, *, collate_fn_map: "map"}) == "map"
    assert collate([Box(0, 0)]) == "registry"


# --------------------------------------------------------------------------
# collate_into (the engine's allocation hook)
# --------------------------------------------------------------------------


def test_collate_into_allocates_every_array_through_the_hook():
    made = []

    def allocate(shape, dtype):
        out = np.full(shape, 99, dtype)
        made.append(out)
        return out

    batch = [
        {"x": np.arange(3, dtype=np.int16), "y": 1, "s": "a"},
        {"x": np.arange(3, 6, dtype=np.int16), "y": 2, "s": "b"},
    ]
    out = collate_into(batch, allocate)
    assert out["x"] is made[0] and out["y"] is made[1] and len(made) == 2
    assert out["x"].tolist() == [[0, 1, 2], [3, 4, 5]] and out["y"].tolist() == [1, 2]
    assert [(m.shape, m.dtype) for m in made] == [((2, 3), np.int16), ((2,), np.int64)]
    assert_same(numpy_to_torch(out), torch_collate(batch))


# --------------------------------------------------------------------------
# PadCollate
# --------------------------------------------------------------------------


def test_pad_numpy_sequences_with_lengths_and_mask():
    pad = PadCollate(-1, return_mask=True)
    out = pad([(np.array([1, 2, 3]), 0), (np.array([4]), 1)])
    values, lengths, mask = out[0]
    assert type(out[0]) is Padded
    assert values.tolist() == [[1, 2, 3], [4, -1, -1]] and values.dtype == np.int64
    assert lengths.tolist() == [3, 1] and lengths.dtype == np.int64
    assert mask.tolist() == [[True, True, True], [True, False, False]]
    assert out[1].tolist() == [0, 1]


def test_pad_left_and_to_multiple():
    out = PadCollate(0, pad_to_multiple_of=4, return_mask=True, side="left")([np.array([1, 2, 3]), np.array([4])])
    assert out.values.tolist() == [[0, 1, 2, 3], [0, 0, 0, 4]]
    assert out.mask.tolist() == [[False, True, True, True], [False, False, False, True]]
    out = PadCollate(pad_to_multiple_of=8)([np.ones(9), np.ones(2)])
    assert out.values.shape == (2, 16)


def test_pad_keeps_trailing_axes_and_promotes_dtypes():
    out = PadCollate(0.5)([np.zeros((2, 3), np.float32), np.ones((4, 3), np.float64)])
    assert out.values.shape == (2, 4, 3) and out.values.dtype == np.float64
    assert (out.values[0, 2:] == 0.5).all() and (out.values[1] == 1).all()


def test_pad_result_type_does_not_depend_on_lengths():
    out = PadCollate()([np.ones(3), np.ones(3)])
    assert type(out) is Padded and out.values.shape == (2, 3) and out.lengths.tolist() == [3, 3]


def test_pad_without_lengths_or_mask_returns_the_array():
    out = PadCollate(return_lengths=False)([np.ones(3), np.ones(1)])
    assert isinstance(out, np.ndarray) and out.shape == (2, 3)
    out = PadCollate(return_lengths=False, return_mask=True)([np.ones(3), np.ones(1)])
    assert out.lengths is None and out.mask.shape == (2, 3)


def test_pad_keys_and_per_key_values_with_token_lists():
    pad = PadCollate({"input_ids": 0, "labels": -100}, return_mask=True)
    out = pad(
        [
            {"input_ids": [5, 6, 7], "labels": np.array([1, 2, 3]), "pixel": np.zeros(2), "text": "a"},
            {"input_ids": [8], "labels": np.array([4]), "pixel": np.ones(2), "text": "b"},
        ]
    )
    assert out["input_ids"].values.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert out["labels"].values.tolist() == [[1, 2, 3], [4, -100, -100]]
    assert isinstance(out["pixel"], np.ndarray) and out["pixel"].shape == (2, 2)  # not padded: not a key
    assert out["text"] == ["a", "b"]


def test_pad_keys_with_scalar_value_and_nested_key():
    out = PadCollate(keys=["ids"])([{"m": {"ids": [1, 2]}, "v": [1, 2]}, {"m": {"ids": []}, "v": [3, 4]}])
    assert out["m"]["ids"].values.tolist() == [[1, 2], [0, 0]] and out["m"]["ids"].values.dtype == np.int64
    assert [v.tolist() for v in out["v"]] == [[1, 3], [2, 4]]  # lists outside keys collate as torch does


def test_pad_unnamed_unequal_arrays_still_fail_with_hint():
    with pytest.raises(RuntimeError, match=r'stack expects each tensor.*batch\["x"\].*PadCollate'):
        PadCollate(keys=["ids"])([{"ids": [1], "x": np.zeros(2)}, {"ids": [1], "x": np.zeros(3)}])


def test_pad_errors():
    with pytest.raises(RuntimeError, match=r"batch\[0\]: samples may differ only in their first axis"):
        PadCollate()([(np.zeros((2, 3)),), (np.zeros((2, 4)),)])
    with pytest.raises(ValueError, match="pad value -100 does not fit dtype uint8"):
        PadCollate(-100)([np.zeros(2, np.uint8), np.zeros(1, np.uint8)])
    with pytest.raises(ValueError, match="pad value 0.5 does not fit dtype int64"):
        PadCollate(0.5)([np.zeros(2, np.int64)])
    with pytest.raises(KeyError, match="none of keys"):
        PadCollate(keys=["input_idz"])([{"input_ids": [1]}])
    with pytest.raises(TypeError, match="did you mean keys=\\['ids'\\]"):
        PadCollate(keys="ids")
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PadCollate(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="side"):
        PadCollate(side="middle")
    with pytest.raises(ValueError, match="no value for keys"):
        PadCollate({"a": 0}, keys=["a", "b"])
    with pytest.raises(TypeError, match="not a \\(nested\\) list of numbers"):
        PadCollate(keys=["ids"])([{"ids": [1]}, {"ids": ["a"]}])


def test_pad_collate_pickles():
    pad = PadCollate({"ids": 1}, pad_to_multiple_of=2, return_mask=True, side="left")
    clone = pickle.loads(pickle.dumps(pad))
    batch = [{"ids": [1, 2, 3]}, {"ids": [4]}]
    assert_same(numpy_to_torch(clone(batch)), numpy_to_torch(pad(batch)))
    assert "PadCollate(" in repr(clone)
    clone = pickle.loads(pickle.dumps(TorchPadCollate()))
    assert type(clone) is TorchPadCollate


def test_pad_torch_tensors_give_tensors_equal_to_numpy_path():
    arrays = [np.arange(3, dtype=np.float32), np.arange(1, dtype=np.float32), np.arange(4, dtype=np.float32)]
    for side in ("right", "left"):
        pad = PadCollate(-1, pad_to_multiple_of=3, return_mask=True, side=side)
        from_tensors = pad([torch.from_numpy(a) for a in arrays])
        assert isinstance(from_tensors.values, torch.Tensor)
        assert_same(from_tensors, to_torch(pad(arrays)))
        torch_pad = TorchPadCollate(-1, pad_to_multiple_of=3, return_mask=True, side=side)
        assert_same(torch_pad(arrays), from_tensors)


def test_pad_empty_and_ragged_nested_lists():
    out = PadCollate(keys=["x"])([{"x": [[1, 2], [3, 4]]}, {"x": []}])
    assert out["x"].values.shape == (2, 2, 2) and out["x"].values.dtype == np.int64
    assert out["x"].lengths.tolist() == [2, 0] and (out["x"].values[1] == 0).all()
    with pytest.raises(TypeError, match=r'batch\["x"\]: sample 1 is not a \(nested\) list of numbers'):
        PadCollate(keys=["x"])([{"x": [[1, 2]]}, {"x": [[1, 2], [3]]}])


def test_pad_uses_registered_types_inside(registry):
    registry(Box, lambda batch, *, collate: collate([b.xyxy for b in batch], key="xyxy"))
    out = PadCollate()([Box(np.ones((1, 4)), 0), Box(np.ones((3, 4)), 0)])
    assert out.values.shape == (2, 3, 4) and out.lengths.tolist() == [1, 3]


def test_pad_tensor_errors():
    with pytest.raises(ValueError, match="does not fit dtype uint8"):
        PadCollate(-1)([torch.zeros(2, dtype=torch.uint8), torch.zeros(1, dtype=torch.uint8)])
    with pytest.raises(RuntimeError, match="first axis"):
        PadCollate()([torch.zeros(2, 2), torch.zeros(2, 3)])


def test_pad_collate_into_uses_the_hook():
    made = []

    def allocate(shape, dtype):
        made.append((shape, dtype))
        return np.empty(shape, dtype)

    PadCollate(return_mask=True).collate_into([np.ones(2), np.ones(3)], allocate)
    assert made == [((2, 3), np.float64), ((2,), np.int64), ((2, 3), np.bool_)]


# --------------------------------------------------------------------------
# torch stays unimported in the core
# --------------------------------------------------------------------------


def test_core_does_not_import_torch():
    code = (
        "import sys, numpy as np\n"
        "import conveyor.collate as c\n"
        "assert 'torch' not in sys.modules, 'import'\n"
        "c.default_collate([{'x': np.zeros(2), 'y': 1, 'z': [1.5, 'a']}] * 3)\n"
        "c.default_collate([np.float32(1), 2.5])\n"
        "c.default_convert((np.zeros(1), 1))\n"
        "c.PadCollate(return_mask=True)([np.zeros(2), np.zeros(1)])\n"
        "try:\n"
        "    c.default_collate([np.zeros(2), np.zeros(3)])\n"
        "except RuntimeError:\n"
        "    pass\n"
        "assert 'torch' not in sys.modules, 'collate'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_docstring_examples():
    # conveyor.collate is a package: its examples live in its modules.
    modules = [importlib.import_module(f"{cc.__name__}.{m.name}") for m in pkgutil.iter_modules(cc.__path__)]
    results = [doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE) for module in modules]
    assert sum(r.attempted for r in results) > 0 and sum(r.failed for r in results) == 0


# --------------------------------------------------------------------------
# Properties: random nested structures collate like torch
# --------------------------------------------------------------------------

NT1 = namedtuple("NT1", "a")
NT2 = namedtuple("NT2", "a b")
NT3 = namedtuple("NT3", "a b c")
NAMEDTUPLES = {1: NT1, 2: NT2, 3: NT3}
TENSOR_DTYPES = [
    np.bool_,
    np.uint8,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
]

leaf_schemas = st.one_of(
    st.sampled_from(["int", "float", "bool", "str", "bytes", "mixnum"]),
    # np.uint64 scalars are left out: torch itself fails on them (see the scalar test above).
    st.tuples(st.just("npscalar"), st.sampled_from([d for d in NUMPY_DTYPES if d is not np.uint64])),
    st.tuples(st.just("array"), st.sampled_from(NUMPY_DTYPES), hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
    st.tuples(st.just("tensor"), st.sampled_from(TENSOR_DTYPES), hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
)
keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
schemas = st.recursive(
    leaf_schemas,
    lambda children: st.one_of(
        st.tuples(st.sampled_from(["list", "tuple"]), st.lists(children, min_size=1, max_size=3)),
        st.tuples(st.just("namedtuple"), st.lists(children, min_size=1, max_size=3)),
        st.tuples(st.sampled_from(["dict", "OrderedDict"]), st.dictionaries(keys, children, min_size=1, max_size=3)),
    ),
    max_leaves=6,
)


def make_sample(schema, draw, first):
    """One sample following ``schema``; ``first`` marks sample 0 (it leads mixed-number batches)."""
    if isinstance(schema, str):
        if schema == "int":
            return draw(st.integers(-(2**63), 2**63 - 1))
        if schema == "float":
            return draw(st.floats())
        if schema == "bool":
            return draw(st.booleans())
        if schema == "str":
            return draw(st.text(max_size=3))
        if schema == "bytes":
            return draw(st.binary(max_size=3))
        if schema == "mixnum":  # int-led batch of ints, bools and floats: torch infers the dtype
            if first:
                return draw(st.integers(-100, 100))
            return draw(st.one_of(st.integers(-100, 100), st.booleans(), st.floats(-1e6, 1e6)))
    kind = schema[0]
    if kind == "npscalar":
        return draw(hnp.from_dtype(np.dtype(schema[1])))
    if kind in ("array", "tensor"):
        array = draw(hnp.arrays(schema[1], schema[2]))
        return torch.from_numpy(array) if kind == "tensor" else array
    children = schema[1]
    if kind == "list":
        return [make_sample(c, draw, first) for c in children]
    if kind == "tuple":
        return tuple(make_sample(c, draw, first) for c in children)
    if kind == "namedtuple":
        return NAMEDTUPLES[len(children)](*(make_sample(c, draw, first) for c in children))
    mapping = dict if kind == "dict" else OrderedDict
    return mapping((k, make_sample(c, draw, first)) for k, c in children.items())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=schemas, size=st.integers(1, 4), data=st.data())
def test_random_structures_collate_like_torch(schema, size, data):
    batch = [make_sample(schema, data.draw, first=(i == 0)) for i in range(size)]
    check_like_torch(batch)
    expected = torch_convert(batch[0])
    assert_same(torch_default_convert(batch[0]), expected)
    assert_same(numpy_to_torch(default_convert(batch[0])), expected)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=5),
    multiple=st.one_of(st.none(), st.integers(1, 4)),
    side=st.sampled_from(["right", "left"]),
)
def test_padding_keeps_data_and_fills_the_rest(lengths, multiple, side):
    arrays = [np.arange(1, n + 1, dtype=np.int32) * (i + 1) for i, n in enumerate(lengths)]
    out = PadCollate(-7, pad_to_multiple_of=multiple, return_mask=True, side=side)(arrays)
    total = out.values.shape[1]
    assert total >= max(lengths) and (multiple is None or total % multiple == 0)
    assert total == (max(lengths) if multiple is None else -(-max(lengths) // multiple) * multiple)
    for row, mask, array in zip(out.values, out.mask, arrays):
        assert row[mask].tolist() == array.tolist()
        assert (row[~mask] == -7).all()
        real = np.flatnonzero(mask)
        if len(real):
            assert (real[-1] == total - 1) if side == "left" else (real[0] == 0)
    assert out.lengths.tolist() == lengths
