"""A loader reading shards while one of them is changed under it, run as its
own process by tests/data/test_shard_changes.py (a SIGBUS kills only this one).

    python shard_changes_job.py FOLDER CHANGE KIND ──▶ one JSON line: what the loader raised,
        whether every sample it delivered was whole and the original's, and whether the next
        epoch, once the shard is restored, reads every sample right
"""

from __future__ import annotations

import gc
import json
import os
import sys

import conveyor
from conveyor.shards import ShardDataset
from conveyor.shards.records import open_shard_writer, write_sample

SHARDS, SAMPLES, SIZE = 2, 40, 16_384
KINDS = {
    "0": dict(num_workers=0),
    "threads": dict(num_workers=2, worker_method="thread"),
    "fork": dict(num_workers=2, multiprocessing_context="fork"),
}


def payload(shard: int, n: int, fill: int) -> bytes:
    return bytes([(shard * SAMPLES + n + fill) % 251]) * SIZE


def write(path: str, shard: int, fill: int) -> None:
    with open_shard_writer(path) as tar:
        for n in range(SAMPLES):
            write_sample(tar, f"s{shard}-{n:04d}", [("bin", payload(shard, n, fill))])


def original(key: str) -> bytes:
    shard, n = key[1:].split("-")
    return payload(int(shard), int(n), 0)


def whole(key: str, data: bytes) -> bool:
    """The sample as it was, or as the rewrite made it (a file opened anew, after the write): never a mix."""
    shard, n = key[1:].split("-")
    return data in (payload(int(shard), int(n), 0), payload(int(shard), int(n), 7))


def change(path: str, how: str) -> None:
    if how == "truncate":
        os.truncate(path, 8192)
    elif how == "rewrite":  # (other bytes, the same size, in place: `cp other shard`)
        write(path + ".other", 0, 7)
        with open(path + ".other", "rb") as f, open(path, "r+b") as g:
            g.write(f.read())
        os.remove(path + ".other")


def restore(path: str) -> None:
    write(path + ".new", 0, 0)
    os.replace(path + ".new", path)  # (as a re-download that renames its finished copy does)


def main(folder: str, how: str, kind: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for shard in range(SHARDS):
        write(os.path.join(folder, f"shard-{shard:06d}.tar"), shard, 0)
    target = os.path.join(folder, "shard-000000.tar")
    dataset = ShardDataset(folder, transform=lambda s: (s["__key__"], s["bin"]))
    loader = conveyor.DataLoader(dataset, batch_size=4, collate_fn=list, **KINDS[kind])
    result: dict = {"error": None, "whole": True}
    delivered = 0
    try:
        for number, batch in enumerate(loader):
            if number == 0:
                change(target, how)
            for key, data in batch:
                result["whole"] &= whole(key, data)
                delivered += 1
    except Exception as exc:  # (what the user sees)
        result["error"], result["message"] = type(exc).__name__, str(exc)
    result["delivered"] = delivered
    restore(target)
    gc.collect()  # (the failed pass's iterator is let go of now, not inside the next pass's start)
    again = [sample for batch in loader for sample in batch]
    result["next_epoch"] = len(again) == SHARDS * SAMPLES and all(data == original(key) for key, data in again)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
