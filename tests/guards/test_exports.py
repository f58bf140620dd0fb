"""The public surface: what `conveyor` and `conveyor.torch` export, documented,
and the core importing no framework."""

import subprocess
import sys

import pytest
import torch.utils.data as tud

import conveyor
import conveyor.torch as ct

# Deprecated in torch (datapipes) or private: deliberately not provided (docs/differences.md).
NOT_PROVIDED = {
    "DFIterDataPipe",
    "DataChunk",
    "IterDataPipe",
    "MapDataPipe",
    "_DatasetKind",
    "argument_validation",
    "functional_datapipe",
    "guaranteed_datapipes_determinism",
    "non_deterministic",
    "runtime_validation",
    "runtime_validation_disabled",
}


def test_every_exported_name_exists_and_is_documented():
    for module in (conveyor, ct):
        for name in module.__all__:
            obj = getattr(module, name)
            assert getattr(obj, "__doc__", None), f"{module.__name__}.{name} has no docstring"


def test_torch_facade_has_every_public_name_of_torch_utils_data():
    missing = [name for name in tud.__all__ if name not in NOT_PROVIDED and not hasattr(ct, name)]
    assert missing == []


def test_import_conveyor_imports_each_name_when_first_used():
    code = (
        "import sys, conveyor; before = 'conveyor.loader' in sys.modules; conveyor.DataLoader; "
        "print(before, 'conveyor.loader' in sys.modules, conveyor.stats.LoaderStats.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.split() == ["False", "True", "LoaderStats"]
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        conveyor.Nothing  # noqa: B018


def test_every_former_module_name_is_found_by_the_package_that_registers_it():
    import importlib

    from conveyor import _former_names

    registered = {}
    for package in ("conveyor.loader", "conveyor.state", "conveyor.dataset"):
        registered.update(dict.fromkeys(importlib.import_module(package)._FORMER_NAMES, package))
    assert registered == _former_names.HOMES


def test_core_import_loads_no_framework():
    code = "import sys, conveyor; assert 'torch' not in sys.modules and 'jax' not in sys.modules, sorted(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


#: The public surface, pinned: a name added or removed is a decision, made here too.
CORE_NAMES = {
    "BatchSampler",
    "ChainDataset",
    "CompactList",
    "ConcatDataset",
    "DataLoader",
    "Dataset",
    "DistributedSampler",
    "IterableDataset",
    "IterableMix",
    "Mix",
    "Pack",
    "PadCollate",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "ShardedIterable",
    "ShardedSampler",
    "ShardBlockSampler",
    "StackDataset",
    "StallWarning",
    "Stateful",
    "Subset",
    "SubsetRandomSampler",
    "TensorDataset",
    "TokenBudgetBatchSampler",
    "TokenFiles",
    "TransportError",
    "WeightedRandomSampler",
    "WorkerDiedError",
    "WorkerInfo",
    "default_collate",
    "default_convert",
    "derive_seed",
    "get_worker_info",
    "random_split",
    "register_collate",
    "sample_rng",
    "SampleRandom",
    "SkipBudget",
    "SkippedSample",
    "BadSampleBudgetExceeded",
    "RayWorkers",
}


def test_the_public_surface_is_exactly_the_pinned_one():
    assert set(conveyor.__all__) == CORE_NAMES
    assert set(ct.__all__) == (CORE_NAMES - {"derive_seed"}) | {"StatefulDataLoader"}


def test_the_shards_and_store_modules_are_pinned_too():
    import conveyor.shards
    import conveyor.store

    assert set(conveyor.shards.__all__) == {
        "ShardDataset",
        "ShardStream",
        "ShardIndex",
        "ShardError",
        "shard_paths",
        "encode_sample",
        "decode_member",
    }
    assert set(conveyor.store.__all__) == {"Store", "StoreFiles", "worth_retrying"}
    for module in (conveyor.shards, conveyor.store):
        assert all(hasattr(module, name) for name in module.__all__)
