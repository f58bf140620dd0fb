"""What the executor makes of a worker's answer as it arrives: the record
it will deliver, holding the batch as the user gets it, or its error, and
its timings so far.

    Batch ──batch_arrived──▶ views on its slot (Workers.decode) ──▶ torch tensors if asked ──▶ Delivered
    TaskFailed ──task_error──▶ the user's exception (inline), or one rebuilt from its text

The Delivered waits in the reorder buffer for its turn; the executor then
adds where the copies stand and completes its timings (Timings.on_delivery).
"""

from __future__ import annotations

from time import perf_counter

from ...collate import to_torch
from ..errors import WorkerNames, add_note, batch_error, describe_indices
from ..interrupts import raised_by_handler
from ..transport.messages import Batch, Task, TaskFailed
from ..workers.protocol import Workers, WorkerView
from .records import Delivered, Timings, skipped_records


def batch_arrived(pool: Workers, worker: WorkerView, sent: Task, message: Batch, tensors: bool) -> Delivered:
    """The batch ``sent`` to ``worker`` as it will be delivered: its data
    (views on its slot; tensors if asked) or, when the conversion to
    tensors fails, that batch's error. What cannot be read (a slot that
    does not map) raises Broken (from ``pool``), which breaks the pool."""
    arrived_at = perf_counter()
    data, error = None, None
    if message.empty:  # (every sample skipped: nothing in its slot)
        pool.give_back(sent.slot)
    else:
        data = pool.decode(worker, sent, message)
        if tensors:
            try:
                data = to_torch(data)
            except Exception as failed:
                if raised_by_handler(failed):
                    raise
                add_note(
                    failed,
                    f"(conveyor: while turning batch {message.batch_index} ({describe_indices(sent.indices)}) "
                    f"from {worker.describe()} into torch tensors)",
                )
                data, error = None, failed
    timings = None
    if message.times is not None:
        decode_s = perf_counter() - arrived_at if pool.transports else 0.0
        timings = Timings.on_arrival(message.times, sent.sampler_s, decode_s, arrived_at, worker.timing_ids)
    skipped = skipped_records(message.skipped, message.batch_index, worker.describe())
    return Delivered(message.batch_index, data, error, None, timings, skipped, message.empty)


def task_error(worker: WorkerView, message: TaskFailed, task: Task, names: WorkerNames) -> BaseException:
    """A failed batch's error: an inline worker's is the user's exception
    itself; a process's or thread's is rebuilt from what it told, naming it
    as its place names it (``names``)."""
    if message.exception is not None:
        return message.exception
    who = names.in_batch.format(id=worker.id, pid=message.failure.pid)
    return batch_error(message.failure, who, message.batch_index, task.indices)
