"""Dataset helpers behave as torch.utils.data's: differential tests, plus the
duck-typing rules and batch fetching the loader relies on."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

import conveyor.dataset as cd
from toy_datasets import Squares

# --- helpers ---------------------------------------------------------------


def _raised(call):
    with pytest.raises(Exception) as info:
        call()
    return info.value


def assert_same_error(torch_call, our_call, prefix=None):
    """Ours raises an instance of torch's exception type, and our message starts
    with torch's (or with ``prefix`` where torch's wording has a typo we fixed)."""
    theirs, ours = _raised(torch_call), _raised(our_call)
    assert isinstance(ours, type(theirs)), (type(ours), type(theirs))
    expected = prefix if prefix is not None else str(theirs)
    assert str(ours).startswith(expected), (str(ours), expected)
    return ours


def same(a, b):
    """Deep equality over tuples, lists, dicts, tensors and arrays."""
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return bool(np.all(a == b)) and type(a) is type(b)


def samples(ds):
    return [ds[i] for i in range(len(ds))]


class BatchedSquares(Squares):
    """Records every __getitems__ call, to see that batches stay batched."""

    def __init__(self, n):
        super().__init__(n)
        self.calls = []

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [i * i for i in indices]


class ShortBatch(Squares):
    def __getitems__(self, indices):
        return [i * i for i in indices][:-1]


class DictBatch(Squares):
    def __getitems__(self, indices):
        return {"x": indices}


class Count(cd.IterableDataset):
    def __init__(self, start, stop):
        self.start, self.stop = start, stop

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        return self.stop - self.start


class TorchCount(tud.IterableDataset):
    def __init__(self, start, stop):
        self.start, self.stop = start, stop

    def __iter__(self):
        return iter(range(self.start, self.stop))

    def __len__(self):
        return self.stop - self.start


class Stream:
    """Duck-typed iterable dataset: __iter__ only."""

    def __iter__(self):
        return iter([1, 2])


# --- the core imports no framework ------------------------------------------


def test_import_does_not_load_torch():
    code = "import sys, conveyor.dataset; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_duck_typing_helpers_do_not_load_torch():
    code = (
        "import sys, conveyor.dataset as d\n"
        "assert d.is_iterable_dataset(iter([])) and d.is_map_dataset([1])\n"
        "assert d.fetch_many([1, 2], [1]) == [2]\n"
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- Dataset / IterableDataset ----------------------------------------------


def test_dataset_base_getitem_error_matches_torch():
    assert_same_error(lambda: tud.Dataset()[0], lambda: cd.Dataset()[0])


def test_iterable_dataset_is_abstract_like_torch():
    assert_same_error(lambda: tud.IterableDataset(), lambda: cd.IterableDataset())


def test_add_makes_concat_and_chain():
    both = Squares(2) + Squares(3)
    assert isinstance(both, cd.ConcatDataset) and samples(both) == [0, 1, 0, 1, 4]
    chained = Count(0, 2) + Count(5, 7)
    assert isinstance(chained, cd.ChainDataset) and list(chained) == [0, 1, 5, 6]


# --- TensorDataset ----------------------------------------------------------


def test_tensor_dataset_torch_tensors_match_torch():
    x, y = torch.arange(12).reshape(4, 3), torch.tensor([1.0, 2.0, 3.0, 4.0])
    theirs, ours = tud.TensorDataset(x, y), cd.TensorDataset(x, y)
    assert len(ours) == len(theirs) == 4
    assert same(samples(ours), samples(theirs))
    assert same(ours[-1], theirs[-1]) and same(ours[1:3], theirs[1:3])


def test_tensor_dataset_numpy_and_mixed():
    x = np.arange(12).reshape(4, 3)
    y = torch.tensor([1, 2, 3, 4])
    ds = cd.TensorDataset(x, y)
    assert len(ds) == 4
    row, label = ds[2]
    assert isinstance(row, np.ndarray) and row.tolist() == [6, 7, 8]
    assert isinstance(label, torch.Tensor) and label.item() == 3


def test_tensor_dataset_size_mismatch_matches_torch():
    a, b = torch.zeros(3, 2), torch.zeros(4)
    err = assert_same_error(lambda: tud.TensorDataset(a, b), lambda: cd.TensorDataset(a, b))
    assert isinstance(err, ValueError) and "[3, 4]" in str(err)
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        cd.TensorDataset(np.zeros(3), np.zeros(2))


def test_tensor_dataset_rejects_non_arrays_and_nothing():
    with pytest.raises(TypeError, match="argument 1 is a list"):
        cd.TensorDataset(np.zeros(2), [1, 2])
    with pytest.raises(ValueError, match="at least one"):
        cd.TensorDataset()


# --- StackDataset -----------------------------------------------------------


def test_stack_dataset_tuple_and_dict_match_torch():
    a, b = torch.arange(5), [str(i) for i in range(5)]
    assert same(samples(cd.StackDataset(a, b)), samples(tud.StackDataset(a, b)))
    assert same(samples(cd.StackDataset(x=a, y=b)), samples(tud.StackDataset(x=a, y=b)))
    assert len(cd.StackDataset(a, b)) == len(tud.StackDataset(a, b)) == 5


@pytest.mark.parametrize("as_dict", [False, True])
def test_stack_dataset_getitems_matches_torch_and_stays_batched(as_dict):
    def build(cls):
        batched, plain = BatchedSquares(6), list(range(6))
        return (cls(x=batched, y=plain) if as_dict else cls(batched, plain)), batched

    (ours, our_child), (theirs, their_child) = build(cd.StackDataset), build(tud.StackDataset)
    indices = [4, 0, 2]
    assert same(ours.__getitems__(indices), theirs.__getitems__(indices))
    assert our_child.calls == their_child.calls == [indices]
    assert ours.__getitems__([]) == theirs.__getitems__([]) == []


def test_stack_dataset_errors_match_torch():
    assert_same_error(
        lambda: tud.StackDataset([1], x=[1]),
        lambda: cd.StackDataset([1], x=[1]),
        # torch's wording lacks a space after "or"; ours has it.
        prefix="Supported either ``tuple``- (via ``args``) or",
    )
    assert_same_error(lambda: tud.StackDataset(), lambda: cd.StackDataset())
    err = assert_same_error(lambda: tud.StackDataset([1], [1, 2]), lambda: cd.StackDataset([1], [1, 2]))
    assert "args[0]=1, args[1]=2" in str(err)
    err = assert_same_error(lambda: tud.StackDataset(x=[1], y=[1, 2]), lambda: cd.StackDataset(x=[1], y=[1, 2]))
    assert "x=1, y=2" in str(err)


def test_stack_dataset_nested_size_mismatch_matches_torch():
    err = assert_same_error(
        lambda: tud.StackDataset(ShortBatch(4)).__getitems__([0, 1]),
        lambda: cd.StackDataset(ShortBatch(4)).__getitems__([0, 1]),
    )
    assert "ShortBatch" in str(err)


# --- ConcatDataset ----------------------------------------------------------


def test_concat_matches_torch_including_negative_indices():
    parts = [list(range(3)), [], Squares(4), tud.TensorDataset(torch.arange(2))]
    theirs, ours = tud.ConcatDataset(parts), cd.ConcatDataset(parts)
    assert ours.cumulative_sizes == theirs.cumulative_sizes == [3, 3, 7, 9]
    assert len(ours) == len(theirs) == 9
    every = range(-len(ours), len(ours))
    assert same([ours[i] for i in every], [theirs[i] for i in every])
    assert ours[np.int64(4)] == theirs[4] and ours[torch.tensor(4)] == theirs[4]


def test_concat_mixes_torch_and_conveyor_datasets():
    mixed = cd.ConcatDataset([tud.TensorDataset(torch.arange(2)), cd.TensorDataset(np.arange(3))])
    assert [int(s[0]) for s in samples(mixed)] == [0, 1, 0, 1, 2]
    their_mix = tud.ConcatDataset([cd.TensorDataset(np.arange(3)), tud.TensorDataset(torch.arange(2))])
    assert len(their_mix) == 5


def test_concat_index_errors_match_torch():
    parts = [[1, 2], [3]]
    theirs, ours = tud.ConcatDataset(parts), cd.ConcatDataset(parts)
    assert_same_error(lambda: theirs[-4], lambda: ours[-4])
    assert_same_error(lambda: theirs[3], lambda: ours[3], prefix="index 3 is out of range")
    # IndexError ends old-style iteration, as it does for torch's.
    assert list(iter(ours)) == list(iter(theirs)) == [1, 2, 3]


@pytest.mark.parametrize("member", [Count(0, 2), TorchCount(0, 2), Stream()], ids=type)
def test_concat_rejects_iterable_datasets(member):
    err = _raised(lambda: cd.ConcatDataset([[1], member]))
    assert isinstance(err, AssertionError) and isinstance(err, TypeError)
    assert str(err).startswith("ConcatDataset does not support IterableDataset")
    assert "datasets[1]" in str(err)
    if isinstance(member, tud.IterableDataset):
        assert_same_error(lambda: tud.ConcatDataset([[1], member]), lambda: cd.ConcatDataset([[1], member]))


def test_concat_empty_matches_torch():
    err = assert_same_error(lambda: tud.ConcatDataset([]), lambda: cd.ConcatDataset(iter([])))
    assert isinstance(err, ValueError)


def test_concat_deprecated_spelling_warns():
    ds = cd.ConcatDataset([[1], [2]])
    with pytest.warns(FutureWarning, match="renamed to `cumulative_sizes`"):
        assert ds.cummulative_sizes == [1, 2]


# --- ChainDataset -----------------------------------------------------------


def test_chain_matches_torch():
    members = [TorchCount(0, 3), TorchCount(10, 12)]
    theirs, ours = tud.ChainDataset(members), cd.ChainDataset(members)
    assert list(ours) == list(theirs) == [0, 1, 2, 10, 11]
    assert len(ours) == len(theirs) == 5
    assert list(ours) == list(ours)  # re-iterable


def test_chain_of_conveyor_and_duck_streams():
    chained = cd.ChainDataset(iter([Count(0, 2), Stream()]))
    assert list(chained) == [0, 1, 1, 2] and list(chained) == [0, 1, 1, 2]
    assert cd.is_iterable_dataset(chained)


def test_chain_rejects_map_datasets_like_torch():
    members = [TorchCount(0, 1), [5, 6]]
    for use in (list, len):
        err = assert_same_error(lambda: use(tud.ChainDataset(members)), lambda: use(cd.ChainDataset(members)))
        assert isinstance(err, TypeError) and "ConcatDataset" in str(err)


def test_chain_len_needs_member_len():
    class TorchStream(tud.IterableDataset):
        def __iter__(self):
            return iter([1])

    assert_same_error(
        lambda: len(tud.ChainDataset([TorchCount(0, 1), TorchStream()])),
        lambda: len(cd.ChainDataset([TorchCount(0, 1), TorchStream()])),
    )


# --- Subset -----------------------------------------------------------------


def test_subset_matches_torch():
    base, indices = torch.arange(10) * 2, [7, 0, 3, 3]
    theirs, ours = tud.Subset(base, indices), cd.Subset(base, indices)
    assert len(ours) == len(theirs) == 4
    assert same(samples(ours), samples(theirs)) and same(ours[-1], theirs[-1])
    assert same(ours[[0, 2]], theirs[[0, 2]])
    assert same(ours.__getitems__([1, 2]), theirs.__getitems__([1, 2]))


def test_subset_getitems_delegates_with_mapped_indices():
    ours_base, their_base = BatchedSquares(10), BatchedSquares(10)
    ours, theirs = cd.Subset(ours_base, [9, 5, 1]), tud.Subset(their_base, [9, 5, 1])
    assert ours.__getitems__([2, 0]) == theirs.__getitems__([2, 0]) == [1, 81]
    assert ours_base.calls == their_base.calls == [[1, 9]]


def test_subset_subclass_must_override_getitems_like_torch():
    def subclass(base):
        return type("Shifted", (base,), {"__getitem__": lambda self, i: 0})

    assert_same_error(
        lambda: subclass(tud.Subset)([1], [0]),
        lambda: subclass(cd.Subset)([1], [0]),
        prefix="Shifted overrides __getitem__ but not __getitems__.",
    )


# --- random_split -----------------------------------------------------------


def _split_indices(splits):
    return [list(s.indices) for s in splits]


@pytest.mark.parametrize(
    "n, lengths",
    [
        (10, [3, 7]),
        (10, [10]),
        (7, [0, 7, 0]),
        (10, [0.3, 0.7]),
        (11, [0.5, 0.5]),  # remainder 1
        (10, [0.25, 0.25, 0.25, 0.25]),  # remainder 2, round robin
        (17, [0.1, 0.2, 0.3, 0.4]),
        (3, [1 / 3, 1 / 3, 1 / 3]),
        (5, [1]),
    ],
)
@pytest.mark.parametrize("seed", [0, 42])
def test_random_split_equals_torch_for_same_generator(n, lengths, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = tud.random_split(range(n), lengths, generator=torch.Generator().manual_seed(seed))
        ours = cd.random_split(range(n), lengths, generator=torch.Generator().manual_seed(seed))
    assert _split_indices(ours) == _split_indices(theirs)
    assert all(isinstance(s, cd.Subset) for s in ours)
    assert [list(s) for s in ours] == [list(s) for s in theirs]


def test_random_split_zero_length_warning_matches_torch():
    with pytest.warns(UserWarning) as theirs:
        tud.random_split(range(2), [0.1, 0.1, 0.8], generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning) as ours:
        cd.random_split(range(2), [0.1, 0.1, 0.8], generator=0)
    assert [str(w.message) for w in ours] == [str(w.message) for w in theirs]
    assert ours[0].filename == __file__  # points at the caller


def test_random_split_errors_match_torch():
    gen = torch.Generator().manual_seed(0)
    assert_same_error(
        lambda: tud.random_split(range(10), [3, 6], generator=gen),
        lambda: cd.random_split(range(10), [3, 6], generator=gen),
    )
    assert_same_error(
        lambda: tud.random_split(range(10), [1.5, -0.5], generator=gen),
        lambda: cd.random_split(range(10), [1.5, -0.5], generator=gen),
    )
    assert_same_error(
        lambda: tud.random_split(range(10), [2.5, 7.5], generator=gen),
        lambda: cd.random_split(range(10), [2.5, 7.5], generator=gen),
        prefix="random_split lengths must be ints",
    )
    with pytest.raises(ValueError, match="must not be negative"):
        cd.random_split(range(10), [-1, 11], generator=0)


def test_random_split_accepts_fractions_summing_just_above_one():
    lengths = [0.05] * 20  # sums to 1.0000000000000002: torch raises (pytorch#128116)
    with pytest.raises(ValueError, match="Sum of input lengths"):
        tud.random_split(range(40), lengths, generator=torch.Generator().manual_seed(0))
    splits = cd.random_split(range(40), lengths, generator=0)
    assert [len(s) for s in splits] == [2] * 20


def test_random_split_numpy_generators_and_seeds_are_reproducible():
    def run(generator):
        return _split_indices(cd.random_split(range(20), [0.5, 0.5], generator=generator))

    assert run(np.random.default_rng(3)) == run(np.random.default_rng(3)) == run(3)
    np.random.seed(5)
    first = run(None)
    np.random.seed(5)
    assert run(None) == first


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 60),
    cuts=st.lists(st.integers(0, 60), max_size=4),
    seed=st.integers(0, 2**32),
    fractions=st.booleans(),
)
def test_random_split_partitions_the_indices(n, cuts, seed, fractions):
    points = sorted(min(c, n) for c in cuts)
    lengths = [b - a for a, b in zip([0] + points, points + [n])]
    if fractions and n:
        lengths = [length / n for length in lengths]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        splits = cd.random_split(list(range(n)), lengths, generator=seed)
    flat = [i for s in splits for i in s.indices]
    assert sorted(flat) == list(range(n))
    if not fractions or not n:
        assert [len(s) for s in splits] == lengths


# --- duck typing and fetch_many ---------------------------------------------


@pytest.mark.parametrize(
    "obj, iterable",
    [
        (Count(0, 1), True),
        (TorchCount(0, 1), True),
        (cd.ChainDataset([]), True),
        (tud.ChainDataset([]), True),
        (Stream(), True),
        ((x for x in []), True),
        (iter([1]), True),
        (Squares(1), False),
        (tud.TensorDataset(torch.zeros(1)), False),
        ([1, 2], False),
        (np.zeros(3), False),
        ({"a": 1}, False),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, bool) else str(v),
)
def test_dataset_style(obj, iterable):
    assert cd.is_iterable_dataset(obj) is iterable
    assert cd.is_map_dataset(obj) is (not iterable)


def test_neither_style():
    assert not cd.is_iterable_dataset(3) and not cd.is_map_dataset(3)


def test_fetch_many_uses_getitems_when_present():
    batched = BatchedSquares(5)
    assert cd.fetch_many(batched, [3, 1]) == [9, 1] and batched.calls == [[3, 1]]
    assert cd.fetch_many(Squares(5), [3, 1]) == [9, 1]
    assert cd.fetch_many(torch.arange(4), [2]) == [torch.tensor(2)]


def test_fetch_many_passes_getitems_output_through_like_torch():
    # torch hands whatever __getitems__ returns to collate_fn: batched dicts work.
    assert cd.fetch_many(DictBatch(5), [0, 1]) == DictBatch(5).__getitems__([0, 1])


# --- pickling ---------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: cd.TensorDataset(np.arange(4), torch.arange(4)),
        lambda: cd.StackDataset(x=[1, 2], y=np.arange(2)),
        lambda: cd.ConcatDataset([[1, 2], Squares(3)]),
        lambda: cd.ChainDataset([Count(0, 2), Count(4, 5)]),
        lambda: cd.random_split(Squares(6), [2, 4], generator=1)[1],
    ],
)
def test_datasets_pickle(make):
    ds = make()
    copy = pickle.loads(pickle.dumps(ds))
    got = list(copy) if cd.is_iterable_dataset(ds) else samples(copy)
    want = list(ds) if cd.is_iterable_dataset(ds) else samples(ds)
    assert same(got, want)
