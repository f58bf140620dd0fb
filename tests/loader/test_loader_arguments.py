"""Every invalid or conflicting DataLoader argument fails at construction,
with torch's exception type and wording first, then conveyor's fix."""

import multiprocessing
import warnings

import numpy as np
import pytest
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct
from toy_datasets import Squares


class Stream(tud.IterableDataset):
    def __iter__(self):
        return iter(range(5))


def _torch_error(kwargs, dataset):
    with pytest.raises(Exception) as info:
        tud.DataLoader(dataset, **kwargs)
    return info.value


TORCH_REJECTS = [
    dict(num_workers=-1),
    dict(timeout=-1),
    dict(prefetch_factor=2),
    dict(num_workers=1, prefetch_factor=-1),
    dict(persistent_workers=True),
    dict(sampler=[0, 1], shuffle=True),
    dict(batch_sampler=[[0, 1]], batch_size=2),
    dict(batch_sampler=[[0, 1]], shuffle=True),
    dict(batch_sampler=[[0, 1]], sampler=[0, 1]),
    dict(batch_sampler=[[0, 1]], drop_last=True),
    dict(batch_size=None, drop_last=True),
    dict(batch_size=0),
    dict(batch_size=-3),
    dict(batch_size=2.5),
    dict(multiprocessing_context="spawn"),
    dict(num_workers=1, multiprocessing_context="nonsense"),
    dict(num_workers=1, multiprocessing_context=42),
]


@pytest.mark.parametrize("kwargs", TORCH_REJECTS, ids=lambda k: ",".join(f"{a}={b!r}" for a, b in k.items()))
@pytest.mark.parametrize("module", [conveyor, ct], ids=["core", "torch"])
def test_same_error_as_torch_for_map_datasets(module, kwargs):
    expected = _torch_error(kwargs, Squares(10))
    with pytest.raises(type(expected)) as info:
        module.DataLoader(Squares(10), **kwargs)
    ours = str(info.value)
    assert ours.startswith(str(expected).rstrip(".")), (ours, str(expected))


ITERABLE_REJECTS = [dict(shuffle=True), dict(sampler=[0, 1]), dict(batch_sampler=[[0, 1]])]


@pytest.mark.parametrize("kwargs", ITERABLE_REJECTS, ids=lambda k: ",".join(k))
def test_same_error_as_torch_for_iterable_datasets(kwargs):
    expected = _torch_error(kwargs, Stream())
    with pytest.raises(type(expected)) as info:
        ct.DataLoader(Stream(), **kwargs)
    first_line = str(expected).split(", but got")[0]
    assert str(info.value).startswith(first_line)


def test_conveyor_iterable_dataset_is_iterable_for_both_loaders():
    class Ours(ct.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        tud.DataLoader(Ours(), shuffle=True)
    with pytest.raises(ValueError, match="expected unspecified shuffle"):
        ct.DataLoader(Ours(), shuffle=True)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(num_workers=1.5), TypeError, "num_workers must be an int"),
        (dict(timeout="3"), TypeError, "timeout must be a number"),
        (dict(batch_size=True), ValueError, "batch_size should be a positive integer"),
        (dict(batch_size="4"), ValueError, "batch_size should be a positive integer"),
        (dict(num_workers=1, prefetch_factor=0), ValueError, "prefetch_factor=0"),
        (dict(num_workers=1, prefetch_factor=1.5), TypeError, "prefetch_factor must be an int"),
        (dict(sampler=42), TypeError, "sampler must be iterable"),
        (dict(batch_sampler=42, batch_size=1), TypeError, "batch_sampler must be iterable"),
        (dict(collate_fn=3), TypeError, "collate_fn must be callable"),
        (dict(worker_init_fn="f"), TypeError, "worker_init_fn must be callable"),
        (dict(seed=1.5), TypeError, "seed must be an int"),
        (dict(seed=1, generator=np.random.default_rng(0)), ValueError, "mutually exclusive"),
    ],
)
def test_mistakes_torch_lets_through_fail_early(kwargs, error, words):
    with pytest.raises(error, match=words):
        conveyor.DataLoader(Squares(10), **kwargs)


def test_dataset_without_getitem_or_iter_is_rejected():
    with pytest.raises(TypeError, match="has neither"):
        conveyor.DataLoader(object())
    with pytest.raises(TypeError, match="has neither"):
        conveyor.DataLoader(42)


@pytest.mark.parametrize(
    "attr", ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]
)
def test_frozen_attributes_after_init(attr):
    loader = ct.DataLoader(Squares(10))
    with pytest.raises(ValueError, match=f"{attr} attribute should not be set after DataLoader is initialized"):
        setattr(loader, attr, None)
    loader.num_workers = 0  # others stay settable, as in torch


def test_generic_alias():
    alias = ct.DataLoader[int]
    assert alias.__origin__ is ct.DataLoader
    assert conveyor.DataLoader[str].__origin__ is conveyor.DataLoader


def test_context_object_accepted():
    loader = conveyor.DataLoader(
        Squares(10), num_workers=1, multiprocessing_context=multiprocessing.get_context("spawn")
    )
    assert loader.multiprocessing_context.get_start_method() == "spawn"


def test_too_many_workers_warns_like_torch():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        conveyor.DataLoader(Squares(10), num_workers=512)
    assert any("This DataLoader will create 512 worker processes in total" in str(w.message) for w in caught)


def test_prefetch_factor_defaults_like_torch():
    assert conveyor.DataLoader(Squares(10)).prefetch_factor is None
    assert conveyor.DataLoader(Squares(10), num_workers=2).prefetch_factor == 2
