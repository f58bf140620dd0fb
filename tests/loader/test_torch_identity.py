"""Code and frameworks that look for torch's classes find them in conveyor.torch.

PyTorch Lightning, Accelerate and user code check ``isinstance(loader,
torch.utils.data.DataLoader)``, look at the sampler's class, read
``multiprocessing_context.get_start_method()``, subscript ``Dataset[int]``
and re-create a loader from its constructor arguments (to put a
DistributedSampler in): each of those must see torch's types and get a
conveyor loader back.
"""

from __future__ import annotations

import inspect
import multiprocessing

import pytest
import torch.utils.data as tud
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

import conveyor.torch as ct

pytestmark = pytest.mark.timeout(60)

SAME_NAME = [
    "Dataset",
    "IterableDataset",
    "TensorDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
    "Sampler",
    "SequentialSampler",
    "RandomSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
    "BatchSampler",
    "DistributedSampler",
    "DataLoader",
]


@pytest.mark.parametrize("name", SAME_NAME)
def test_each_facade_class_is_a_subclass_of_torchs_class_of_that_name(name):
    assert issubclass(getattr(ct, name), getattr(tud, name))


def test_a_default_loader_and_its_samplers_are_torchs_types():
    data = list(range(10))
    shuffled = ct.DataLoader(data, batch_size=2, shuffle=True)
    assert isinstance(shuffled, tud.DataLoader)
    assert isinstance(shuffled.sampler, tud.RandomSampler)
    assert isinstance(shuffled.batch_sampler, tud.BatchSampler)
    assert isinstance(ct.DataLoader(data).sampler, tud.SequentialSampler)
    assert shuffled._dataset_kind == tud.DataLoader(data)._dataset_kind
    assert (
        ct.DataLoader(ct.ChainDataset([data]))._dataset_kind == tud.DataLoader(tud.ChainDataset([data]))._dataset_kind
    )


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_multiprocessing_context_is_a_context_object_as_torch_gives(method):
    ours = ct.DataLoader(list(range(4)), num_workers=1, multiprocessing_context=method)
    theirs = tud.DataLoader(list(range(4)), num_workers=1, multiprocessing_context=method)
    assert isinstance(ours.multiprocessing_context, multiprocessing.context.BaseContext)
    assert ours.multiprocessing_context.get_start_method() == theirs.multiprocessing_context.get_start_method()
    assert [int(b) for b in ours] == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["Dataset", "IterableDataset", "Subset", "ConcatDataset", "StackDataset", "Sampler"])
def test_generic_classes_can_be_subscripted_as_torchs(name):
    assert getattr(ct, name)[int] is not None
    getattr(tud, name)[int]  # (torch's too: the same user code works with both)

    class Typed(getattr(ct, "Dataset")[int]):
        def __len__(self):
            return 3

        def __getitem__(self, i: int) -> int:
            return i

    assert [int(b) for b in ct.DataLoader(Typed())] == [0, 1, 2]


def _recreated_with(loader, **replace):
    """What frameworks do to put their own sampler in: read the constructor's
    arguments off the loader's attributes, then call its class again."""
    parameters = inspect.signature(type(loader).__init__).parameters
    kwargs = {
        name: getattr(loader, name)
        for name, p in parameters.items()
        if name != "self" and p.kind is not p.VAR_KEYWORD and p.kind is not p.VAR_POSITIONAL and hasattr(loader, name)
    }
    kwargs.update(batch_sampler=None, shuffle=None, **replace)
    return type(loader)(**kwargs)


def test_a_loader_recreated_from_its_arguments_is_a_conveyor_loader_with_the_new_sampler():
    data = list(range(10))
    loader = ct.DataLoader(data, batch_size=2, shuffle=True, num_workers=0)
    halves = []
    for rank in range(2):
        sampler = TorchDistributedSampler(data, num_replicas=2, rank=rank, shuffle=False)
        again = _recreated_with(loader, sampler=sampler)
        assert type(again) is ct.DataLoader and again.sampler is sampler
        halves.append(sorted(int(x) for b in again for x in b))
    assert halves == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    torch_halves = [
        sorted(
            int(x)
            for b in _recreated_with(
                tud.DataLoader(data, batch_size=2),
                sampler=TorchDistributedSampler(data, num_replicas=2, rank=r, shuffle=False),
            )
            for x in b
        )
        for r in range(2)
    ]
    assert halves == torch_halves
