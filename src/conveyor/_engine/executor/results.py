"""What the executor makes of a worker's answer, between its arrival and
its delivery: the batch as the user gets it, or its error, and its timings.

    Batch ──decode──▶ views on its slot (Workers.decode) ──▶ torch tensors if asked
    TaskFailed ──task_error──▶ the user's exception (inline), or one rebuilt from its text
    Finished (waiting for its turn) ──timings──▶ Timings (the worker's part, the main process's part)
"""

from __future__ import annotations

import math
from time import perf_counter
from typing import Any, NamedTuple, Optional

from ...collate import to_torch
from ..errors import add_note, batch_error, describe_indices
from .records import PlannedBatch, Timings, pack_delivery_times
from ..transport.messages import Batch, TaskFailed
from ..workers.protocol import Sent, WorkerView


class Finished(NamedTuple):
    """A batch back from a worker, waiting for its turn (a named tuple: one
    is made per batch, and a tuple is the cheapest record Python builds)."""

    batch_index: int
    worker: WorkerView
    data: Any = None
    error: Optional[BaseException] = None
    worker_state: Any = None
    #: For Delivered.timings: the worker's times (a packed LoadTimes), the
    #: sampler's, the decoding's, and when it arrived.
    times: Optional[bytes] = None
    sampler_s: float = 0.0
    decode_s: float = 0.0
    arrived_at: float = 0.0
    skipped: tuple = ()
    empty: bool = False


def decode(pool: Any, worker: WorkerView, sent: Sent, planned: PlannedBatch, message: Batch, tensors: bool) -> tuple[Any, Any]:
    """(the batch as the user gets it, tensors if asked; None) or, when
    the conversion to tensors fails, (None, that batch's error). What
    cannot be read (a slot that does not map) raises Broken (from ``pool``:
    the executor's Workers), which breaks the pool."""
    data = pool.decode(worker, sent, message)
    if not tensors:
        return data, None
    try:
        return to_torch(data), None
    except Exception as error:
        add_note(
            error,
            f"(conveyor: while turning batch {message.batch_index} ({describe_indices(planned.indices)}) "
            f"from {worker.describe()} into torch tensors)",
        )
        return None, error


def task_error(worker: WorkerView, message: TaskFailed, planned: PlannedBatch, threads: bool) -> BaseException:
    """A failed batch's error: an inline worker's is the user's exception
    itself; a process's or thread's is rebuilt from what it told, naming it."""
    if message.exception is not None:
        return message.exception
    who = worker.describe() if threads else f"worker pid {message.failure.pid}"
    return batch_error(message.failure, who, message.batch_index, planned.indices)


def timings(finished: Finished, ready_s: Optional[float], slots_in_use: int) -> Timings:
    """The delivered batch's timings: the worker's, and the main process's
    (sampler, decode, its wait for its turn and the loop, ``ready_s`` on
    the first batch after the workers started)."""
    arrived_at = finished.arrived_at
    assert finished.times is not None  # (timed batches only)
    delivery = pack_delivery_times(
        finished.sampler_s, finished.decode_s, perf_counter() - arrived_at, 0.0, arrived_at,
        math.nan if ready_s is None else ready_s, *finished.worker.timing_ids, slots_in_use,
    )  # fmt: skip
    return Timings(finished.times, delivery)
