"""Workers run torch with one intra-op thread, as torch's workers do (issue 8,
item 1).

Without it, a worker forked after the main process had used torch's OpenMP
thread pool hung on its first parallel op (PyTorch issue 53565: the pool's
threads do not survive fork), and N workers each running a core's worth of
threads fought over the cores. torch's workers call ``torch.set_num_threads(1)``
before ``worker_init_fn``; conveyor's do too, also when the dataset imports
torch only inside ``__getitem__`` (a numpy-only worker does not load torch).

The main process runs torch with ``MAIN_THREADS`` threads during these tests
(``main_threads``), more than one whatever the machine, so that a setting
inherited through fork, or an inherited OpenMP pool, would show. Datasets sent
to spawn or forkserver workers are built by ``make_*`` factories: a class
defined inside a function travels by value (cloudpickle), so those workers
import torch only if the dataset does, not because this module does.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.utils.data as tud

import conveyor.torch as ct

pytestmark = pytest.mark.timeout(60)

START_METHODS = ["fork", "spawn", "forkserver"]

#: Threads of the main process while a test runs: several, even on one core.
MAIN_THREADS = 4


@pytest.fixture
def main_threads():
    """The main process uses several intra-op threads; put back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(MAIN_THREADS)
    yield MAIN_THREADS
    torch.set_num_threads(before)


# ------------------------------------------------------- conv1d after fork
def make_conv1d_signals(n):
    """The dataset of the report: ``conv1d`` on a (1, 1, 24000) signal in
    ``__init__`` (so in the main process) and in ``__getitem__``. Signals and
    kernel hold small integers, so every sum is exact whatever the threads."""

    def signal(i):
        return (torch.arange(24000) % 7 + i).float().reshape(1, 1, 24000)

    class Conv1dSignals:
        def __init__(self):
            self.kernel = torch.tensor([[[1.0, 2.0, 1.0]]])
            self.reference = F.conv1d(signal(0), self.kernel)

        def __len__(self):
            return n

        def __getitem__(self, i):
            out = F.conv1d(signal(i), self.kernel)
            return out[0, 0, ::1000], out.sum(), i

    return Conv1dSignals()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", START_METHODS)
def test_conv1d_dataset_loads_after_the_main_process_used_torch_threads(main_threads, method):
    """Hung forever under fork before workers set one thread."""
    dataset = make_conv1d_signals(6)  # runs conv1d here, in the main process
    F.conv1d(torch.ones(1, 1, 24000), dataset.kernel)  # and once more, as a training step would
    expected = list(tud.DataLoader(dataset, batch_size=2))
    got = list(ct.DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context=method))
    assert len(got) == len(expected) == 3
    for k, (g, e) in enumerate(zip(got, expected)):
        for leaf_g, leaf_e in zip(g, e):
            assert leaf_g.dtype == leaf_e.dtype and torch.equal(leaf_g, leaf_e), f"batch {k}: {g} vs {e}"


# ---------------------------------------------- the thread count in a worker
def make_thread_reporter(n, lazy):
    """Sample i reports the worker's torch thread count and pid. ``lazy``:
    the dataset imports torch only inside ``__getitem__``."""

    class ThreadReporter:
        def __len__(self):
            return n

        def __getitem__(self, i):
            if lazy:
                import torch as lazily_loaded_torch  # a local name: nothing refers to a global torch

                threads = lazily_loaded_torch.get_num_threads()
            else:
                threads = torch.get_num_threads()
            return {"threads": threads, "pid": os.getpid()}

    return ThreadReporter()


def reports(loader):
    """(threads, pid) of every sample the loader gives (batch_size=None)."""
    return [(int(s["threads"]), int(s["pid"])) for s in loader]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("lazy", [False, True], ids=["torch-dataset", "lazy-import"])
@pytest.mark.parametrize("method", START_METHODS)
def test_a_worker_runs_torch_with_one_thread(main_threads, method, lazy):
    dataset = make_thread_reporter(4, lazy)
    loader = ct.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=method)
    got = reports(loader)
    assert os.getpid() not in {pid for _, pid in got}, "samples must come from workers"
    assert [threads for threads, _ in got] == [1] * 4
    assert torch.get_num_threads() == main_threads, "the main process keeps its own setting"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", START_METHODS)
def test_worker_init_fn_may_choose_more_threads(main_threads, method):
    """The one thread is set before worker_init_fn, which may change it (as in torch)."""
    loader = ct.DataLoader(
        make_thread_reporter(4, lazy=False),
        batch_size=None,
        num_workers=2,
        multiprocessing_context=method,
        worker_init_fn=lambda worker_id: torch.set_num_threads(2),
    )
    assert [threads for threads, _ in reports(loader)] == [2] * 4


NUMPY_ONLY_SCRIPT = """
import json, os, sys
import conveyor


class ThreadsInWorker:
    '''A dataset of a numpy-only module: torch is imported while loading.'''

    def __len__(self):
        return 2

    def __getitem__(self, i):
        import torch

        return {"threads": torch.get_num_threads(), "pid": os.getpid()}


if __name__ == "__main__":
    report = {"main_pid": os.getpid()}
    for method in ("fork", "spawn", "forkserver"):
        loader = conveyor.DataLoader(ThreadsInWorker(), batch_size=None, num_workers=1, multiprocessing_context=method)
        report[method] = [(int(s["threads"]), int(s["pid"])) for s in loader]
    report["main_torch_loaded"] = "torch" in sys.modules
    import torch

    report["main_threads"] = torch.get_num_threads()
    print(json.dumps(report))
"""


@pytest.mark.timeout(90)
def test_a_worker_that_loads_torch_late_runs_it_with_one_thread(tmp_path):
    """A fresh script whose main process never loads torch, so even a forked
    worker imports it itself, with torch's default of one thread per core
    (which torch caps at the core count: on a one-core machine this test
    cannot tell the difference)."""
    (tmp_path / "numpy_only.py").write_text(NUMPY_ONLY_SCRIPT)
    done = subprocess.run([sys.executable, "numpy_only.py"], cwd=tmp_path, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, f"exit code {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["main_torch_loaded"] is False
    for method in START_METHODS:
        assert report["main_pid"] not in {pid for _, pid in report[method]}, method
        threads = [threads for threads, _ in report[method]]
        assert threads == [1] * 2, f"{method}: {threads} (torch's default here: {report['main_threads']})"


# --------------------------------------- an ImageNet-style run, two epochs
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


def random_resized_crop(image, size):
    """A crop of 30-100% of the area, aspect ratio 3/4 to 4/3, resized to
    size x size (CHW float), with torch ops only."""
    _, height, width = image.shape
    area = height * width * torch.empty(()).uniform_(0.3, 1.0).item()
    ratio = torch.empty(()).uniform_(-0.2877, 0.2877).exp().item()  # log(3/4) .. log(4/3)
    h = max(1, min(height, round((area / ratio) ** 0.5)))
    w = max(1, min(width, round((area * ratio) ** 0.5)))
    top = torch.randint(0, height - h + 1, ()).item()
    left = torch.randint(0, width - w + 1, ()).item()
    crop = image[:, top : top + h, left : left + w]
    return F.interpolate(crop[None], size=(size, size), mode="bilinear", align_corners=False)[0]


class RandomImages:
    """Random uint8 HxWx3 images with labels, augmented with torch ops: random
    resized crop to 224, horizontal flip, to float, normalize."""

    def __init__(self, n, height=96, width=128, classes=10):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randint(0, 256, (n, height, width, 3), dtype=torch.uint8, generator=generator)
        self.labels = torch.randint(0, classes, (n,), generator=generator)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i].permute(2, 0, 1).float().div_(255)
        image = random_resized_crop(image, 224)
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return (image - MEAN) / STD, self.labels[i]


@pytest.mark.timeout(90)
def test_imagenet_style_training_completes_two_epochs(main_threads):
    """Default start method, two workers, a CPU training step between batches:
    hung in the first epochs before workers set one thread."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, kernel_size=3, stride=4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = ct.DataLoader(RandomImages(16), batch_size=4, shuffle=True, num_workers=2)
    batches_per_epoch = []
    for epoch in range(2):
        count = 0
        for images, labels in loader:
            assert images.shape == (4, 3, 224, 224) and images.dtype == torch.float32
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            count += 1
        batches_per_epoch.append(count)
    assert batches_per_epoch == [4, 4]
    assert torch.isfinite(loss)
