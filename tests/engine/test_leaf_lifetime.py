"""A leaf owns its lifetime: what the user keeps of a batch keeps only its own
bytes alive, never the batch's shared-memory slot.

Counted, not guessed from RSS: where each kept leaf's memory lies (inside a
slot mapping of this process or not, /proc/self/maps), how many slot mappings
are left, and how many bytes the slots' files hold (their allocated blocks).
A large leaf stays a zero-copy view and is never overwritten while kept,
however often the other slots are reused; once let go, its slot serves the
next batches right.
"""

import gc
import os
import sys

import numpy as np
import pytest
import torch

import conveyor
import conveyor.torch as ct
from leaf_datasets import ImagesMasksLabels, fill

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps and /proc/self/fd"),
]

METHODS = ["fork", "spawn"]
PAGE = os.sysconf("SC_PAGE_SIZE")


def slot_mappings() -> list[tuple[int, int]]:
    """(start, end) of this process's mappings of shared-memory slots."""
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "conveyor-slot" in line:
                low, high = (int(x, 16) for x in line.split()[0].split("-"))
                spans.append((low, high))
    return spans


def address(leaf) -> int:
    if isinstance(leaf, torch.Tensor):
        return leaf.untyped_storage().data_ptr()
    return leaf.__array_interface__["data"][0]


def in_a_slot(leaf) -> bool:
    start = address(leaf)
    return any(low <= start < high for low, high in slot_mappings())


def files_holding(leaves) -> int:
    """Bytes held by the files that the leaves' memory lies in (each counted once)."""
    inodes = set()
    with open("/proc/self/maps") as maps:
        spans = [line.split() for line in maps if "conveyor-slot" in line]
    for leaf in leaves:
        start = address(leaf)
        for fields in spans:
            low, high = (int(x, 16) for x in fields[0].split("-"))
            if low <= start < high:
                inodes.add(int(fields[4]))
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            info = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if info.st_ino in inodes:
            inodes.discard(info.st_ino)
            total += info.st_blocks * 512
    assert not inodes, "every file a leaf lies in is open (its mapping's descriptor)"
    return total


def expected(first: int, count: int) -> torch.Tensor:
    return torch.tensor([fill(i) for i in range(first, first + count)])


@pytest.mark.parametrize("method", METHODS)
def test_kept_labels_their_slices_and_numpy_views_hold_no_slot(method):
    """The eval idiom ``targets.append(y)``: 30 batches of 3 MB images, the
    label tensor of each kept (and a slice of one, and a ``.numpy()`` of
    another): none of them lies in a slot, and once the loader is done no
    slot is mapped any more (today each label held its batch's slot)."""
    loader = ct.DataLoader(
        ImagesMasksLabels(64 * 30, side=4), batch_size=64, num_workers=2, multiprocessing_context=method
    )
    labels, slices, arrays = [], [], []
    in_slots = 0
    for b, batch in enumerate(loader):
        in_slots += in_a_slot(batch["image"])
        labels.append(batch["label"])
        slices.append(batch["label"][10:20])
        arrays.append(batch["mask"].numpy())
        assert not any(in_a_slot(kept) for kept in (labels[-1], slices[-1], arrays[-1])), (
            f"batch {b}'s small leaves lie in its slot"
        )
    assert in_slots >= 10, "the images came through the slots, zero-copy"
    del batch
    gc.collect()
    assert slot_mappings() == [], "nothing the user kept holds a slot"
    for b in range(30):
        assert torch.equal(labels[b], torch.arange(64 * b, 64 * b + 64))
        assert torch.equal(slices[b], torch.arange(64 * b + 10, 64 * b + 20))
        assert (arrays[b][:, 0, 0] == expected(64 * b, 64).numpy()).all()


@pytest.mark.parametrize("method", METHODS)
def test_kept_large_leaves_keep_only_their_pages_and_are_never_overwritten(method):
    """Masks of 144 KiB (a large leaf: a zero-copy view) kept from the first
    30 of 40 batches of 3 MB images, 2 persistent workers: every kept mask
    stays a view on its slot (kept slots are retired, the pool never runs
    dry); the files they lie in hold their own pages and not the images let
    go beside them (today: each kept mask's whole slot, and the pool runs
    dry after 7); they are never overwritten, however the slots are reused;
    let go, the slots serve the next epoch right, and a view of a slice kept
    across both epochs' slot reuses is right at the end."""
    loader = ct.DataLoader(
        ImagesMasksLabels(64 * 40),
        batch_size=64,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=True,
    )
    masks, copies = [], []
    for b, batch in enumerate(loader):
        assert torch.equal(batch["image"].amin((1, 2, 3)), expected(64 * b, 64).float()), f"wrong bytes in batch {b}"
        if b == 0:
            kept = batch["mask"].numpy()[3:9]
            kept_copy = kept.copy()
        if b < 30:
            masks.append(batch["mask"])
            copies.append(batch["mask"].clone())
    del batch
    in_slots = [mask for mask in masks if in_a_slot(mask)]
    mask_bytes = masks[0].numel()
    held = files_holding(in_slots)
    assert held <= len(in_slots) * (mask_bytes + 2 * PAGE), (
        f"the files of {len(in_slots)} kept masks of {mask_bytes} bytes hold {held} bytes"
    )
    assert len(in_slots) == 30, "every kept mask stays a zero-copy view on its slot"
    del in_slots
    for b, (mask, copy) in enumerate(zip(masks, copies)):
        assert torch.equal(mask, copy), f"the kept mask of batch {b} was overwritten"
    del masks, copies, mask, copy
    gc.collect()

    for b, batch in enumerate(loader):  # the slots given back, emptied or retired, and grown again
        assert torch.equal(batch["image"].amin((1, 2, 3)), expected(64 * b, 64).float()), f"stale bytes in batch {b}"
        assert torch.equal(batch["image"].amax((1, 2, 3)), expected(64 * b, 64).float()), f"stale bytes in batch {b}"
        assert torch.equal(batch["mask"][:, 5, 5], expected(64 * b, 64).to(torch.uint8))
    del batch
    assert np.array_equal(kept, kept_copy) and kept[:, 0, 0].tolist() == [fill(i) for i in range(3, 9)]


def test_leaves_of_batches_sent_through_the_pipe_own_their_bytes():
    """Small batches travel pickled through the pipe: each leaf is an array of
    its own, not a view on the message that carried the whole batch."""
    loader = conveyor.DataLoader(
        ImagesMasksLabels(8 * 6, side=8),
        batch_size=8,
        num_workers=1,
        collate_fn=lambda samples: {
            "mask": np.stack([s["mask"] for s in samples]),
            "label": np.array([s["label"] for s in samples]),
        },
    )
    for batch in loader:
        for leaf in batch.values():
            base = leaf
            while isinstance(base, np.ndarray) and base.base is not None:
                base = base.base
            owner = base.obj if isinstance(base, memoryview) else base
            assert len(memoryview(owner).cast("B")) == leaf.nbytes


def test_a_kept_leaf_keeps_the_pages_it_shares_with_its_neighbours_and_no_others():
    """In one process, leaves at offsets that are no multiple of a page: the
    slot kept in part gives back every page but the kept leaf's (those it
    shares with the leaves let go included), the slot is retired and lent
    again with a fresh file, and the kept leaf's bytes stay as they were;
    a leaf of 64 KiB is copied out, one byte more is a view."""
    from conveyor._engine.transport.encoding import encode
    from conveyor._engine.transport.slot_pool import SlotPool
    from conveyor._engine.transport.slots import SlotWriter

    pool = SlotPool(2)
    slot = pool.lend()
    writer = SlotWriter(pool.fds[slot])
    writer.begin()
    batch = {
        "before": np.full(300_001, 1, np.uint8),
        "kept": np.full(100_003, 2, np.uint8),
        "after": np.full(500_000, 3, np.uint8),
        "small": np.full(64 << 10, 4, np.uint8),
        "large": np.full((64 << 10) + 1, 5, np.uint8),
    }
    encoded, used = encode(batch, writer)
    writer.end()
    decoded = pool.decode(encoded, slot, writer.size, used)
    assert not in_a_slot(decoded["small"]) and in_a_slot(decoded["large"])
    kept = decoded["kept"]
    whole = files_holding([kept])
    del decoded
    gc.collect()
    assert pool.lend() is not None  # the other slot (a first look: the slot is partly kept)
    assert pool.lend() == slot  # none free: the partly kept slot is punched, retired and lent again
    assert pool.files[slot] is not None and os.fstat(pool.fds[slot]).st_size == 0, "the slot has a fresh file"
    held = files_holding([kept])
    assert kept.nbytes <= held <= kept.nbytes + 2 * PAGE < whole
    assert (kept == 2).all()
    del kept
    writer.close()
    gc.collect()
    assert slot_mappings() == [], "the retired file went with its last leaf"
    pool.close()


def test_kept_leaves_let_go_from_another_thread_free_their_slots_once():
    """Masks kept a while and let go by another thread, as the loop goes on
    (finalizers then run there, against the loop's thread lending and
    retiring slots): every batch is right, and at the end every slot is
    free again, none given back twice."""
    import queue
    import threading

    handed: queue.Queue = queue.Queue()

    def let_go():
        held = []
        while (item := handed.get()) is not None:
            held.append(item)
            if len(held) > 3:
                del held[: len(held) // 2]

    thread = threading.Thread(target=let_go)
    thread.start()
    loader = ct.DataLoader(ImagesMasksLabels(64 * 48), batch_size=64, num_workers=2, persistent_workers=True)
    try:
        for epoch in range(2):
            for b, batch in enumerate(loader):
                assert torch.equal(batch["image"].amin((1, 2, 3)), expected(64 * b, 64).float()), (
                    f"wrong bytes in batch {b}"
                )
                assert torch.equal(batch["mask"][:, 1, 1], expected(64 * b, 64).to(torch.uint8))
                handed.put(batch["mask"])
            del batch
    finally:
        handed.put(None)
        thread.join(30)
    gc.collect()
    from conveyor._engine.transport.slot_pool import SlotPool

    (pool,) = [o for o in gc.get_objects() if type(o) is SlotPool and not o.closed]  # (the persistent workers')
    assert pool.in_use == 0 and sorted(pool._free) == list(range(len(pool.fds))), "each slot free once"
    del loader
