"""Batches from workers arrive through reused shared memory: zero-copy views,
no fresh allocation per batch once warm, never overwritten while the user holds
them, and nothing left behind whatever ends the loader."""

import gc
import os
import subprocess
import sys
import textwrap
import time
from collections import namedtuple

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
import procutil

pytestmark = pytest.mark.timeout(90)

Pair = namedtuple("Pair", "image label")


class Images:
    """Sample i: a (3, 32, 32) uint8 image filled with i % 251, and i."""

    def __init__(self, n=64, side=32):
        self.n, self.side = n, side

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"image": np.full((3, self.side, self.side), i % 251, np.uint8), "label": i}


def owner(array):
    base = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def address(array):
    return array.__array_interface__["data"][0]


def check(batch, first):
    n = len(batch["label"])
    expected = np.arange(first, first + n)
    assert np.array_equal(np.asarray(batch["label"]), expected)
    for k, i in enumerate(expected):
        assert (np.asarray(batch["image"][k]) == i % 251).all()


def test_big_batches_are_views_on_shared_memory_reused_once_warm():
    loader = conveyor.DataLoader(Images(64 * 30), batch_size=64, num_workers=2)
    addresses = set()
    for b, batch in enumerate(loader):
        check(batch, 64 * b)
        assert type(owner(batch["image"])).__name__ == "mmap", "the batch is a view on a shared mapping"
        addresses.add(address(batch["image"]))
    # 30 batches through a handful of slots: memory is reused, not allocated per batch.
    assert len(addresses) <= 2 * (2 + 3), addresses


def test_torch_facade_gives_tensors_sharing_the_slot():
    loader = ct.DataLoader(Images(64 * 4), batch_size=64, num_workers=2)
    for b, batch in enumerate(loader):
        assert isinstance(batch["image"], torch.Tensor) and batch["image"].dtype == torch.uint8
        assert batch["label"].dtype == torch.int64
        check(batch, 64 * b)


def test_holding_many_batches_never_overwrites_them():
    """More batches held than slots exist: the loader sends the rest another
    way rather than overwrite memory in use or wait forever."""
    loader = conveyor.DataLoader(Images(64 * 40), batch_size=64, num_workers=2)
    held = list(loader)
    assert len(held) == 40
    for b, batch in enumerate(held):
        check(batch, 64 * b)


def test_released_slots_are_reused_after_holding():
    loader = conveyor.DataLoader(Images(64 * 20), batch_size=64, num_workers=1, persistent_workers=True)
    held = list(loader)
    del held
    gc.collect()
    addresses = {address(b["image"]) for b in loader}
    assert len(addresses) <= 1 + 3 + 2


def slot_bytes() -> int:
    """Bytes held by this process's shared-memory slots (memfds named conveyor-slot)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if "conveyor-slot" in os.readlink(f"/proc/self/fd/{fd}"):
                total += os.fstat(int(fd)).st_size
        except OSError:
            pass
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_slot_grown_past_the_release_size_gives_its_memory_back(monkeypatch):
    """Batches of 786 KB with the release size set to 512 KB: a dropped
    batch's slot is emptied, the next batch regrows it, and batches stay
    right, held or not."""
    from conveyor._engine.transport import slots as shm

    monkeypatch.setattr(shm, "RELEASE_ABOVE_BYTES", 512 << 10)  # (read in the main process only)
    loader = conveyor.DataLoader(Images(64 * 12, side=64), batch_size=64, num_workers=2, persistent_workers=True)
    held = []
    for b, batch in enumerate(loader):
        check(batch, 64 * b)
        if b % 3 == 0:
            held.append(batch)
    for k, batch in enumerate(held):
        check(batch, 64 * 3 * k)
    assert slot_bytes() >= len(held) * 64 * 3 * 64 * 64  # what is held keeps its memory
    del held, batch
    gc.collect()
    assert slot_bytes() < 64 * 3 * 64 * 64  # less than one batch: every slot gave its memory back
    for b, batch in enumerate(loader):  # and the slots grow again, right
        check(batch, 64 * b)


def test_custom_collate_output_is_copied_into_shared_memory():
    def stack_images(samples):
        return Pair(np.stack([s["image"] for s in samples])[:, ::-1].copy(), [s["label"] for s in samples])

    loader = conveyor.DataLoader(Images(64 * 3), batch_size=64, num_workers=2, collate_fn=stack_images)
    for b, batch in enumerate(loader):
        assert isinstance(batch, Pair) and batch.label == list(range(64 * b, 64 * b + 64))
        assert type(owner(batch.image)).__name__ == "mmap"
        assert (batch.image[5] == (64 * b + 5) % 251).all()


def test_torch_tensors_from_a_custom_collate_stay_tensors():
    class Tensors(Images):
        def __getitem__(self, i):
            return torch.full((3, 32, 32), float(i))

    loader = conveyor.DataLoader(Tensors(64 * 3), batch_size=64, num_workers=2, collate_fn=torch.stack)
    for b, batch in enumerate(loader):
        assert isinstance(batch, torch.Tensor) and batch.dtype == torch.float32
        assert torch.equal(batch[:, 0, 0, 0], torch.arange(64 * b, 64 * b + 64, dtype=torch.float32))


def test_small_batches_travel_inline_and_stay_correct():
    loader = conveyor.DataLoader(list(range(1000)), batch_size=32, num_workers=2)
    assert np.concatenate(list(loader)).tolist() == list(range(1000))


def test_unusual_leaves_survive_the_trip():
    class Mixed:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {
                "big_endian": np.full(20000, i, dtype=">i4"),
                "strided": np.arange(40000, dtype=np.float64)[::2] + i,
                "text": f"s{i}",
            }

    for b, batch in enumerate(conveyor.DataLoader(Mixed(), batch_size=4, num_workers=2)):
        assert (batch["big_endian"][:, 0] == np.arange(4 * b, 4 * b + 4)).all()
        assert batch["strided"].shape == (4, 20000) and batch["strided"][1, 1] == 2 + 4 * b + 1
        assert batch["text"] == [f"s{i}" for i in range(4 * b, 4 * b + 4)]


# ------------------------------------------------------------------ no leaks


def shmem_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    raise AssertionError("no Shmem line")


def settled_shmem_kb():
    """Shmem once it stops moving (an earlier test's processes may still be
    giving theirs back)."""
    last = shmem_kb()
    for _ in range(50):
        time.sleep(0.1)
        now = shmem_kb()
        if abs(now - last) < 2_000:
            return now
        last = now
    return last


_LEAK_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys, time
    import numpy as np
    import conveyor

    class Big:
        def __len__(self):
            return 64 * 40

        def __getitem__(self, i):
            if MODE == "kill-worker" and i == 64 * 20:
                os.kill(os.getpid(), signal.SIGKILL)
            return np.full((3, 224, 224), i % 251, np.uint8)

    MODE = sys.argv[1]

    if __name__ == "__main__":
        loader = conveyor.DataLoader(Big(), batch_size=64, num_workers=2)
        held = []
        try:
            for b, batch in enumerate(loader):
                held.append(batch)  # keep ~60 MB of slots alive
                if b == 7:
                    print("running", flush=True)
                    if MODE == "break":
                        break
                    if MODE == "raise":
                        raise ValueError("training loop failed")
                    if MODE == "kill-main":
                        time.sleep(60)
        except (ValueError, RuntimeError) as exc:
            print(type(exc).__name__, flush=True)
        print("done", flush=True)
    """
)


# (the machine's Shmem measured: another test's workers allocating or giving theirs back beside would count)
@pytest.mark.serial
@pytest.mark.parametrize("mode", ["normal", "break", "raise", "kill-worker", "kill-main"])
def test_no_shared_memory_left_behind(tmp_path, mode):
    script = tmp_path / "leak.py"
    script.write_text(_LEAK_SCRIPT)
    files_before = procutil.shm_files()
    baseline = settled_shmem_kb()
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "running"
    during = shmem_kb()
    if mode == "kill-main":
        proc.kill()
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while shmem_kb() > baseline + 20_000 and time.monotonic() < deadline:
        time.sleep(0.1)
    after = shmem_kb()
    assert during > after + 40_000, f"the held batches lived in shared memory ({during} kB, then {after} kB)"
    assert after <= baseline + 20_000, f"Shmem stayed up: {baseline} kB before, {after} kB after"
    left = procutil.new_shm_files(files_before)
    assert not left, f"files left in /dev/shm: {sorted(left)}"


_SMALL_SHM_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import conveyor

    class Big:
        def __len__(self):
            return 64 * 30

        def __getitem__(self, i):
            return np.full((3, 224, 224), i % 251, np.uint8)

    if __name__ == "__main__":
        total = 0
        held = []
        for b, batch in enumerate(conveyor.DataLoader(Big(), batch_size=64, num_workers=2)):
            assert (batch[:, 0, 0, 0] == np.arange(64 * b, 64 * b + 64) % 251).all()
            total += batch.nbytes
            held.append(batch)
        print("moved", total // 2**20, "MB")
    """
)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small /dev/shm needs root")
def test_small_dev_shm_is_no_problem(tmp_path):
    """With /dev/shm a 64 MB tmpfs (a default container), 270 MB of batches
    held at once still load: conveyor's memory is anonymous, not in /dev/shm."""
    from conveyor._engine import portable

    if not portable.LINUX_PATHS:
        pytest.skip("a memfd property; the portable fallback (CONVEYOR_PORTABLE=1) keeps slots in /dev/shm")
    script = tmp_path / "small_shm.py"
    script.write_text(_SMALL_SHM_SCRIPT)
    command = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} {script}"
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    out = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "moved 275 MB" in out.stdout
    assert "Bus error" not in out.stderr


class Varied:
    """Samples whose arrays change dtype or shape part-way through a batch."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {
            "image": np.full((4, 40, 40), i, np.uint8),
            "promoted": np.full(3000, i, np.float32 if i % 8 == 3 else np.float64),
            "pair": (np.full(2000, i, np.int16), i),
            "scalar": np.float32(i),
            "zero_d": np.array(i),
        }


def test_samples_placed_early_collate_exactly_as_in_process():
    """Workers copy each sample into its batch row as soon as it is made;
    the batches still equal default_collate's, promotions included."""
    expected = list(conveyor.DataLoader(Varied(), batch_size=8))
    got = list(conveyor.DataLoader(Varied(), batch_size=8, num_workers=2))
    for a, b in zip(expected, got, strict=True):
        for key in ("image", "promoted", "scalar", "zero_d"):
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
        assert np.array_equal(a["pair"][0], b["pair"][0]) and a["pair"][0].dtype == b["pair"][0].dtype
        assert np.array_equal(a["pair"][1], b["pair"][1])


def test_a_shape_change_part_way_gives_the_in_process_error():
    class Ragged(Varied):
        def __getitem__(self, i):
            return np.zeros((3, 32 if i != 5 else 30, 32), np.uint8)

    with pytest.raises(RuntimeError) as in_process:
        list(conveyor.DataLoader(Ragged(), batch_size=8))
    with pytest.raises(RuntimeError) as in_worker:
        list(conveyor.DataLoader(Ragged(), batch_size=8, num_workers=1))
    expected_head = str(in_process.value).splitlines()[0]
    assert expected_head.startswith("stack expects each tensor to be equal size")
    assert expected_head in str(in_worker.value)


def test_tensors_of_dtypes_numpy_lacks_travel_through_shared_memory():
    class Half(Images):
        def __getitem__(self, i):
            return torch.full((3, 64, 64), float(i), dtype=torch.bfloat16)

    loader = ct.DataLoader(Half(64 * 2), batch_size=64, num_workers=2)
    for b, batch in enumerate(loader):
        assert batch.dtype == torch.bfloat16 and batch.shape == (64, 3, 64, 64)
        assert torch.equal(batch[:, 0, 0, 0], torch.arange(64 * b, 64 * b + 64).to(torch.bfloat16))
        assert _shares_a_slot(batch), "the batch is a view on a shared-memory slot, not a pickled copy"


def _shares_a_slot(tensor):
    """Whether the tensor's memory lies in one of this process's memfd mappings."""
    start = tensor.untyped_storage().data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "conveyor-slot" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= start < hi:
                    return True
    return False
