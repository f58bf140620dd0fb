"""A DataLoader pickled by conveyor before the loader and its state were
packages still loads, and goes on as one pickled today does.

``tests/fixtures/loader_pickle_e4eef0e.pkl`` was written by conveyor at
e4eef0e, when the loader's and the state's modules were top-level
(``conveyor.persistent``, ``conveyor.epoch_progress``,
``conveyor.dataset_epoch``, ...), with pickle protocol 2::

    loader = DataLoader(TensorDataset(np.arange(12)), batch_size=3, shuffle=True, seed=5)
    it = iter(loader); next(it); del it
    state = loader.state_dict()
    pickle.dump({"loader": loader, "state": state, ...}, file, protocol=2)
"""

import os
import pickle
import subprocess
import sys

import numpy as np

from conveyor import DataLoader, TensorDataset

FIXTURE = os.path.join(os.path.dirname(__file__), os.pardir, "fixtures", "loader_pickle_e4eef0e.pkl")


def _read() -> bytes:
    with open(FIXTURE, "rb") as file:
        return file.read()


def _pickled_today() -> DataLoader:
    loader = DataLoader(TensorDataset(np.arange(12)), batch_size=3, shuffle=True, seed=5)
    it = iter(loader)
    next(it)
    del it
    return pickle.loads(pickle.dumps(loader, protocol=2))


def _epochs(loader, n: int = 2) -> list:
    return [[batch[0].tolist() for batch in loader] for _ in range(n)]


def test_the_fixture_names_the_former_modules():
    blob = _read()
    for former in (b"conveyor.persistent", b"conveyor.epoch_progress", b"conveyor.dataset_epoch"):
        assert former in blob, former


def test_a_loader_pickled_before_the_packages_loads_and_goes_on_as_today():
    old = pickle.loads(_read())
    assert old["loader"].state_dict() == old["state"]
    assert _epochs(old["loader"]) == _epochs(_pickled_today())


def test_it_loads_in_a_fresh_interpreter():
    code = (
        "import pickle, sys; d = pickle.loads(open(sys.argv[1], 'rb').read()); "
        "print(sum(len(b[0]) for b in d['loader']))"
    )
    done = subprocess.run([sys.executable, "-c", code, FIXTURE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "12"
