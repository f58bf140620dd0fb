"""Messages between the main process and the workers.

Every message is a named dataclass; nothing is told apart by a tuple's
length or position. A batch crosses three records: what to load
(:class:`Task`), what came back (:class:`Batch`, :class:`TaskFailed` or
:class:`Exhausted`), and what is delivered (``executor.records.Delivered``).

    main ──Task / Stop──────────────────────────▶ worker
    main ◀──Ready / Batch / TaskFailed / Exhausted / Fatal── worker

Inline and thread workers hand these objects over as they are; only a
worker process's pipe pickles them, and what crosses a pipe is packed
there: a Task leaves its main-process fields at home, a Batch's
:class:`LoadTimes` travel as 56 bytes (``Batch.__reduce__``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from ..loading.copies import CopyState


@dataclass(frozen=True)
class Task:
    """Load one batch: what to load, from the loader's plan to a worker.

    The pass's plan makes it (``iteration._plan``: epoch, index, seed,
    indices, the sampler's time, the dataset's epoch); the executor books it
    when it hands it to a worker, as a new Task with ``slot``, ``restore`` and
    ``fill_threads`` (``dataclasses.replace``: executor/dispatch.py), and keeps
    that one until its answer arrives. Frozen: nothing changes a Task; what
    differs on the way (the slot's file as it is sent, a worker's fill threads
    once an epoch's first batch is done) is a new one made for that step.

    ``epoch_id`` counts iterations of the loader so that results of an
    abandoned epoch are recognised and dropped; ``seed`` is the batch's seed
    (see :func:`conveyor.rng.derive_seed`); ``indices`` are the sampler's
    output for this batch (a list of indices, one index, or ``None`` for an
    iterable dataset).
    """

    epoch_id: int
    batch_index: int
    #: The batch's seed (an iterable's: the epoch's base seed); None: the generators are left alone.
    seed: Optional[int]
    indices: Any
    #: Which shared-memory slot of the pool to write the batch into;
    #: None: send it inline (no slot free, or shared memory is off).
    slot: Optional[int] = None
    #: A resumed epoch's first task to a worker: where its copy of an
    #: iterable dataset stood (see ``IterableFetcher.begin_epoch``).
    restore: Optional[CopyState] = None
    #: Threads that fill the batch's self-filling leaves (rows.RowPlacer):
    #: more than 1 for the first batch of an epoch, which the loop waits for;
    #: 0: one thread at a lower CPU priority (another worker's first batch
    #: while that one loads).
    fill_threads: int = 1
    #: The epoch of the main process's copy of an iterable dataset that has
    #: ``set_epoch`` when the pass began (loader/_dataset_epoch.py): a worker's copy is
    #: given it before the pass's ``iter()`` if it had another. None: none.
    dataset_epoch: Optional[int] = None
    #: Seconds the sampler took to draw the indices (the batch's timings);
    #: stays in the main process.
    sampler_s: float = 0.0
    #: Once the slot's first file was retired (kept leaves live on in it):
    #: the generation and /proc path of its file now, for the worker to open
    #: (``slots.SlotWriters``); given by the process pool to the Task it sends.
    slot_file: Optional[tuple[int, str]] = None

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """What crosses to a worker process: the fields a worker reads, in
        order (smaller and quicker to read back than field by name)."""
        return (
            Task,
            (
                self.epoch_id,
                self.batch_index,
                self.seed,
                self.indices,
                self.slot,
                self.restore,
                self.fill_threads,
                self.dataset_epoch,
                0.0,
                self.slot_file,  # (sampler_s stays in the main process)
            ),
        )


@dataclass(frozen=True)
class Stop:
    """Finish: leave the loop and exit cleanly."""


@dataclass(frozen=True)
class Ready:
    """Set-up (seeding, ``worker_init_fn``) succeeded. No batch is delivered
    before every worker is ready, so a failing ``worker_init_fn`` is always
    the first thing the user hears of."""

    worker_id: int


class LoadTimes(NamedTuple):
    """How long a worker took over one batch, in seconds (see
    ``executor.records.Timings``, which the main process builds from it).
    Inline and thread workers hand it over as it is; across a process's pipe
    it travels packed (:meth:`Batch.__reduce__`): 56 bytes that pickle for
    free, where a named tuple would cost several microseconds a batch each way."""

    samples: int
    started_at: float
    fetch_s: float
    collate_s: float
    encode_s: float
    #: The loading thread's CPU seconds, and seconds runnable but waiting
    #: for a core, within this batch's loading (cpu.ThreadClock); NaN when
    #: the batch was not measured (batches shorter than a millisecond are
    #: sampled) or the system does not report the figure.
    cpu_s: float
    cpu_wait_s: float


#: ``pack_load_times(*fields)`` -> bytes, and back to a plain tuple of the
#: fields in order (the layout the stats read many of at once: Timings.loading).
_PACKED_LOAD_TIMES = struct.Struct("<q6d")
pack_load_times = _PACKED_LOAD_TIMES.pack
unpack_load_times = _PACKED_LOAD_TIMES.unpack


@dataclass(frozen=True)
class Batch:
    """A loaded batch."""

    epoch_id: int
    batch_index: int
    worker_id: int
    data: Any
    #: Bytes of the slot the arrays lie in (0: everything is inline in ``data``).
    used: int = 0
    #: The slot's size now (the main process maps at least this much).
    slot_size: int = 0
    #: A one-time remark for the user (shared memory exhausted, say).
    note: Optional[str] = None
    #: Where the worker's iterable dataset stands after this batch, when it
    #: has state_dict (for DataLoader.state_dict).
    worker_state: Optional[CopyState] = None
    #: How long loading took; None when stats are off.
    times: Optional[LoadTimes] = None
    #: Samples left out (skip_bad_samples): (index, "Type: message", traceback).
    skipped: tuple = ()
    #: Every sample was left out: no data, no batch for the user.
    empty: bool = False

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """What crosses a worker process's pipe: the fields in order, the
        LoadTimes packed."""
        times = None if self.times is None else pack_load_times(*self.times)
        return (
            _batch_from_pipe,
            (
                self.epoch_id,
                self.batch_index,
                self.worker_id,
                self.data,
                self.used,
                self.slot_size,
                self.note,
                self.worker_state,
                times,
                self.skipped,
                self.empty,
            ),
        )


def _batch_from_pipe(
    epoch_id: int,
    batch_index: int,
    worker_id: int,
    data: Any,
    used: int,
    slot_size: int,
    note: Optional[str],
    worker_state: Optional[CopyState],
    times: Optional[bytes],
    skipped: tuple,
    empty: bool,
) -> Batch:
    """A Batch as it arrives through a pipe (Batch.__reduce__), its LoadTimes unpacked."""
    load_times = None if times is None else LoadTimes._make(unpack_load_times(times))
    return Batch(
        epoch_id, batch_index, worker_id, data, used, slot_size, note, worker_state, load_times, skipped, empty
    )


@dataclass(frozen=True)
class Exhausted:
    """An iterable dataset's copy in this worker has no more data this epoch."""

    epoch_id: int
    batch_index: int
    worker_id: int
    worker_state: Optional[CopyState] = None


@dataclass(frozen=True)
class Failure:
    """An exception raised by user code, carried with its context.

    Everything here is plain text or bytes, so the message itself always
    arrives: the exception and its class travel pickled inside it and are
    unpickled by the main process only if they can be (``None`` when they
    could not even be pickled). The type's name and the formatted traceback
    always travel.
    """

    worker_id: Optional[int]
    pid: int
    where: str
    exc_type_name: str
    traceback_text: str
    #: The pickled exception, when it survived a round trip in the worker.
    exception_bytes: Optional[bytes] = None
    #: The pickled class, when the instance could not travel but its class
    #: can (by reference), so the user still catches the right type.
    type_bytes: Optional[bytes] = None


@dataclass(frozen=True)
class TaskFailed:
    """Loading a batch raised; the worker carries on with its next task."""

    epoch_id: int
    batch_index: int
    worker_id: int
    indices: Any
    failure: Failure
    #: An inline worker's failure: the user's exception itself, raised as
    #: it is (as torch raises it with num_workers=0); None from a process or
    #: a thread, whose failure is told by ``failure``.
    exception: Optional[BaseException] = None


@dataclass(frozen=True)
class Fatal:
    """User code ended the worker: an exception during set-up (unpickling the
    config, seeding, ``worker_init_fn``), or ``SystemExit`` or
    ``KeyboardInterrupt`` while loading a batch. The worker exits with
    ``exit_code`` right after sending this, so the main process can say what
    happened instead of "exited unexpectedly"."""

    worker_id: int
    failure: Failure
    exit_code: int
    #: "start" (set-up), "read" (a task message did not unpickle) or "task".
    stage: str
    #: The batch in hand, if any.
    epoch_id: Optional[int] = None
    batch_index: Optional[int] = None
    indices: Any = None
