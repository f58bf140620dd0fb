"""CompactList: a read-only list kept in numpy buffers, so forked workers
that read it copy no pages (copy-on-access of Python lists)."""

from __future__ import annotations

import pickle

import pytest

import conveyor
from conveyor import CompactList


@pytest.mark.parametrize(
    "items", [["a", "", "émeu", "猫.jpg"], [b"\x00\x01", b"", b"xyz"], [3, -1, 2**62], [1.5, 2, -0.0], []]
)
def test_it_reads_like_the_list_it_was_made_from(items):
    compact = CompactList(items)
    assert len(compact) == len(items)
    assert list(compact) == items and compact == items
    for i in range(-len(items), len(items)):
        assert compact[i] == items[i]
    assert list(compact[1:3]) == items[1:3]
    assert list(pickle.loads(pickle.dumps(compact))) == items


def test_out_of_range_and_mixed_kinds_fail_clearly():
    with pytest.raises(IndexError, match="out of range"):
        CompactList(["a"])[1]
    with pytest.raises(TypeError, match="one kind"):
        CompactList(["a", 1])
    with pytest.raises(TypeError, match="one kind"):
        CompactList([True, False])


def test_a_dataset_holding_one_loads_in_workers():
    class Names:
        def __init__(self):
            self.names = CompactList(f"file_{i:05d}.jpg" for i in range(100))

        def __len__(self):
            return len(self.names)

        def __getitem__(self, i):
            return self.names[i]

    for method in ("fork", "spawn"):
        loader = conveyor.DataLoader(Names(), batch_size=25, num_workers=2, multiprocessing_context=method)
        assert [name for batch in loader for name in batch] == [f"file_{i:05d}.jpg" for i in range(100)]
