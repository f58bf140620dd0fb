"""Classes of the user's script (``__main__``) in batches from worker processes.

A namedtuple sample, a dataclass sample and a ``collate_fn`` returning a
batch class of the script come back as instances of the script's own
classes under every start method, as from torch.utils.data; a result that
truly cannot be pickled still fails its batch, naming what cannot.

The classes must really live in ``__main__``, so each test runs a script of
its own (SCRIPT) in a fresh interpreter; one run checks every case for one
start method (each loader of it costs a worker start), and reports what it
saw as JSON.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import pytest

#: The tests read the script's reports, one run per start method (the module's fixture): one xdist
#: worker takes them all, or each worker that took one would run the script again.
pytestmark = pytest.mark.xdist_group("script_classes")

SCRIPT = textwrap.dedent(
    """
    import collections, dataclasses, json, sys, threading
    import numpy as np
    import torch
    import conveyor, conveyor.torch

    Sample = collections.namedtuple("Sample", ["image", "label"])
    Misnamed = collections.namedtuple("Point", ["x"])  # (a mistake: the script has no Point)

    @dataclasses.dataclass
    class Item:
        image: object
        label: int

    class Batch:
        def __init__(self, images, labels):
            self.images, self.labels = images, labels

    class Dataset(torch.utils.data.Dataset):
        # items 0-5: namedtuples, items 2-3 big enough for the shared-memory slot
        def __init__(self, numpy):
            self.numpy = numpy

        def __len__(self):
            return 6

        def __getitem__(self, i):
            image = np.full((64, 64, 4) if i in (2, 3) else (3,), i, dtype=np.float32)
            return Sample(image if self.numpy else torch.from_numpy(image), i)

    class ItemDataset(Dataset):
        def __getitem__(self, i):
            return Item(*super().__getitem__(i))

    class MisnamedDataset(Dataset):
        def __getitem__(self, i):
            return Misnamed(i)

    def stack(images):
        return np.stack(images) if isinstance(images[0], np.ndarray) else torch.stack(images)

    def collate(items):
        # batch [0, 1]: the dataclass samples as they are; [2, 3]: a Batch of the
        # script; [4, 5]: a Batch holding a lock, which cannot be sent back
        first = items[0].label
        if first == 0:
            return items
        if first == 2:
            return Batch(stack([item.image for item in items]), [item.label for item in items])
        return Batch(threading.Lock(), [item.label for item in items])

    def same(a, b):
        # equal values, and the very same types all the way down
        if type(a) is not type(b):
            return False
        if isinstance(a, torch.Tensor):
            return a.dtype == b.dtype and torch.equal(a, b)
        if isinstance(a, np.ndarray):
            return a.dtype == b.dtype and np.array_equal(a, b)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(a, (Item, Batch)):
            return same(sorted(vars(a).items()), sorted(vars(b).items()))
        return a == b

    def outcomes(loader):
        got = []
        iterator = iter(loader)
        while True:
            try:
                got.append(next(iterator))
            except StopIteration:
                return got
            except Exception as exc:
                got.append(exc)

    def describe(batches, reference):
        # what the test checks: the type of each batch (and of a list's items),
        # whether it is the script's own class, whether it equals the reference
        types = []
        for batch in batches:
            if isinstance(batch, BaseException):
                types.append(["error", type(batch).__name__, str(batch)])
            elif isinstance(batch, list):
                types.append(["list"] + [type(x).__name__ for x in batch])
            else:
                types.append([type(batch).__name__])
        kept = [b for b in batches if not isinstance(b, BaseException)]
        script = [type(b) in (Sample, Batch) or (type(b) is list and all(type(x) is Item for x in b)) for b in kept]
        return {"types": types, "script_classes": all(script), "equal": same(kept, reference)}

    def main():
        method, out = sys.argv[1], sys.argv[2]
        ways = dict(num_workers=1, multiprocessing_context=method)
        report = {}
        # torch's batches: the reference (batch [4, 5] left out: torch cannot send it back either)
        torch_samples = list(torch.utils.data.DataLoader(Dataset(False), batch_size=2, **ways))
        torch_items = list(torch.utils.data.DataLoader(
            ItemDataset(False), batch_sampler=[[0, 1], [2, 3]], collate_fn=collate, **ways
        ))
        # conveyor.DataLoader gives numpy: its reference is the main process's own loading
        numpy_samples = list(conveyor.DataLoader(Dataset(True), batch_size=2))
        numpy_items = list(conveyor.DataLoader(ItemDataset(True), batch_sampler=[[0, 1], [2, 3]], collate_fn=collate))
        cases = {
            "conveyor.torch samples": (conveyor.torch.DataLoader(Dataset(False), batch_size=2, **ways), torch_samples),
            "conveyor.torch collate_fn": (conveyor.torch.DataLoader(
                ItemDataset(False), batch_size=2, collate_fn=collate, **ways
            ), torch_items),
            "conveyor samples": (conveyor.DataLoader(Dataset(True), batch_size=2, **ways), numpy_samples),
            "conveyor collate_fn": (conveyor.DataLoader(
                ItemDataset(True), batch_size=2, collate_fn=collate, **ways
            ), numpy_items),
        }
        report["torch samples"] = describe(torch_samples, torch_samples)
        report["torch collate_fn"] = describe(torch_items, torch_items)
        for name, (loader, reference) in cases.items():
            report[name] = describe(outcomes(loader), reference)
        try:
            next(iter(conveyor.torch.DataLoader(MisnamedDataset(False), batch_size=2, **ways)))
        except Exception as exc:
            report["misnamed"] = [type(exc).__name__, str(exc), type(exc.__cause__).__name__, str(exc.__cause__)]
        with open(out, "w") as f:
            json.dump(report, f)

    if __name__ == "__main__":
        main()
    """
)

SAMPLES = {"types": [["Sample"]] * 3, "script_classes": True, "equal": True}
TORCH_COLLATE = {"types": [["list", "Item", "Item"], ["Batch"]], "script_classes": True, "equal": True}


def run_script(tmp_path, method: str) -> dict:
    """What SCRIPT reports, run with ``method`` in ``tmp_path``."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(script), method, str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def script_report():
    """``script_report(method)``: SCRIPT's report for ``method``, run once for all the tests here."""
    runs: dict = {}

    def run(method: str) -> dict:
        if method not in runs:
            with tempfile.TemporaryDirectory() as where:
                runs[method] = run_script(pathlib.Path(where), method)
        return runs[method]

    return run


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_batches_of_the_scripts_classes_arrive_as_those_classes_equal_to_torchs(script_report, method):
    """Under spawn and forkserver (fork: a check), both loaders give the
    script's Sample namedtuples (through the shared-memory slot too), its
    Item dataclasses and its Batch class from a collate_fn, equal to the
    reference batches, with the very same classes (``type(b) is Sample``).
    The batch holding a lock fails alone, with the error that names the
    lock (as under fork, not a complaint about the script's class)."""
    report = script_report(method)

    assert report["torch samples"] == SAMPLES
    assert report["torch collate_fn"] == TORCH_COLLATE
    for loader in ("conveyor.torch", "conveyor"):
        assert report[f"{loader} samples"] == SAMPLES, loader
        got = report[f"{loader} collate_fn"]
        assert got["script_classes"] and got["equal"], (loader, got)
        assert got["types"][:2] == TORCH_COLLATE["types"] and len(got["types"]) == 3, (loader, got)
        error = got["types"][2]
        assert error[:2] == ["error", "TypeError"], (loader, error)
        assert "while sending its result to the main process" in error[2], (loader, error)
        assert "cannot pickle '_thread.lock' object" in error[2], (loader, error)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_a_script_class_under_another_name_fails_saying_so(script_report, method):
    """``Misnamed = namedtuple("Point", ...)``: no process can find Point in
    the script (torch's workers cannot pickle it either, and torch then
    waits for the batch forever); the loader fails, saying that the script
    has no Point and how to fix it."""
    kind, message, cause_kind, cause = script_report(method)["misnamed"]

    assert kind == "TransportError" and "could not read the result of batch 0" in message, message
    assert cause_kind == "AttributeError", cause
    assert "the script has no 'Point' at its top level" in cause, cause
    assert "collections.namedtuple('Point', ...) assigned to Point" in cause, cause
