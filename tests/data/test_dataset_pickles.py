"""Datasets pickled by conveyor before its datasets were one package still load.

A pickle names a class by its module, so a dataset a user saved (or a copy
an older process made for its spawn workers) names the module of its time.
``tests/fixtures/dataset_pickles_e4eef0e.pkl`` was written by conveyor at e4eef0e,
when the datasets were top-level modules (``conveyor.dataset_views.Subset``,
``conveyor.sharding.ShardedIterable``, ...), with pickle protocol 2::

    objects = {
        "TensorDataset": TensorDataset(np.arange(6).reshape(3, 2), np.array([7, 8, 9])),
        "StackDataset": StackDataset(a=[1, 2, 3], b=["x", "y", "z"]),
        "Subset": Subset([10, 11, 12, 13], [3, 1]),
        "ConcatDataset": ConcatDataset([[0, 1], [2, 3, 4]]),
        "ChainDataset": ChainDataset([ShardedIterable(range(5), num_replicas=1, rank=0)]),
        "ShardedIterable": ShardedIterable(range(6), num_replicas=2, rank=1),
        "CompactList": CompactList(["cat.jpg", "dog.jpg"]),
    }
    pickle.dump(objects, file, protocol=2)
"""

import os
import pickle
import subprocess
import sys

import numpy as np

import conveyor

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "dataset_pickles_e4eef0e.pkl")

#: Each class of the file, by the module that held it then.
FORMER_PATHS = {
    "TensorDataset": "conveyor.dataset_views",
    "StackDataset": "conveyor.dataset_views",
    "Subset": "conveyor.dataset_views",
    "ConcatDataset": "conveyor.dataset_protocol",
    "ChainDataset": "conveyor.dataset_protocol",
    "ShardedIterable": "conveyor.sharding",
    "CompactList": "conveyor.compact",
}


def _read() -> bytes:
    with open(FIXTURE, "rb") as file:
        return file.read()


def _samples(objects: dict) -> dict:
    """What each dataset of the file gives, in plain values."""
    tensors = objects["TensorDataset"]
    concat = objects["ConcatDataset"]
    return {
        "TensorDataset": [(row.tolist(), int(label)) for row, label in (tensors[i] for i in range(len(tensors)))],
        "StackDataset": objects["StackDataset"][2],
        "Subset": list(objects["Subset"]),
        "ConcatDataset": [concat[i] for i in range(len(concat))],
        "ChainDataset": list(objects["ChainDataset"]),
        "ShardedIterable": list(objects["ShardedIterable"]),
        "CompactList": list(objects["CompactList"]),
    }


EXPECTED = {
    "TensorDataset": [([0, 1], 7), ([2, 3], 8), ([4, 5], 9)],
    "StackDataset": {"a": 3, "b": "z"},
    "Subset": [13, 11],
    "ConcatDataset": [0, 1, 2, 3, 4],
    "ChainDataset": [0, 1, 2, 3, 4],
    "ShardedIterable": [1, 3, 5],
    "CompactList": ["cat.jpg", "dog.jpg"],
}


def test_the_file_names_the_classes_by_their_former_modules():
    data = _read()
    assert data[:2] == b"\x80\x02"  # protocol 2
    for name, module in FORMER_PATHS.items():
        assert f"c{module}\n{name}\n".encode() in data, f"{module}.{name} is not in the file"


def test_a_pickle_of_the_former_modules_loads_into_todays_classes():
    objects = pickle.loads(_read())
    assert {name: type(obj) for name, obj in objects.items()} == {name: getattr(conveyor, name) for name in objects}
    assert _samples(objects) == EXPECTED
    assert isinstance(objects["TensorDataset"][0][0], np.ndarray)


def test_it_loads_in_a_fresh_process_that_imports_nothing_first():
    """``pickle.load`` alone, as a spawn worker or a user's script would: the
    former module names resolve when unpickling imports ``conveyor``."""
    code = f"import pickle; objects = pickle.load(open({FIXTURE!r}, 'rb')); print(sorted(objects))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == str(sorted(FORMER_PATHS))


def test_todays_pickles_load_back():
    objects = pickle.loads(_read())
    again = pickle.loads(pickle.dumps(objects))
    assert _samples(again) == EXPECTED
