"""What the executor (executor/core.py) asks of a set of workers, whether
inline (inline.py), processes (pool.py), threads (threads.py) or Ray actors
(ray_actors.py); choice.py picks one, once, from the worker method.

    executor ──send(worker, tasks)──▶ Workers ──▶ worker 0..N-1
             ◀──wait(timeout): (worker, message) … (worker, EXITED)──
             ──decode(worker, task, Batch)──▶ the batch's data

The executor keeps the books (who has which task, in which order to
deliver); a ``Workers`` only knows how to reach its workers, how to read
what they send, and how to end them. What cannot cross (a task that does
not pickle, a result that does not unpickle, a slot that does not map) is
raised as :class:`Broken`, which the executor turns into its one failure.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Protocol

from ..loading.copies import CopyState
from ..transport.messages import Batch, Task


class _Exited:
    def __repr__(self) -> str:
        return "EXITED"


#: In what ``Workers.wait`` returns: this worker has ended (after the
#: messages it sent before, which come first).
EXITED = _Exited()


class Broken(Exception):
    """A message could not cross between the main process and a worker:
    ``doing`` ("could not send the task of") batch ``batch_index`` (None:
    the one the worker has in hand) for ``worker``."""

    def __init__(self, worker: Any, batch_index: Optional[int], doing: str, cause: BaseException):
        super().__init__(doing)
        self.worker = worker
        self.batch_index = batch_index
        self.doing = doing
        self.cause = cause


def task_of_epoch(outstanding: Iterable[Task], epoch_id: int) -> Optional[Task]:
    """The first of a worker's ``outstanding`` tasks that belongs to epoch
    ``epoch_id`` (the one it works on: a worker serves them in order), if any."""
    for task in outstanding:
        if task.epoch_id == epoch_id:
            return task
    return None


class AllAtOnce:
    """The start of Workers that start every worker in ``start`` (inline,
    threads, Ray actors): none is left for ``start_rest``."""

    def start_rest(self) -> bool:
        return False


class NoSlots:
    """The slots of Workers whose batches need none (inline, threads, Ray
    actors: a batch is handed over as its own arrays): none to lend."""

    def lend_slot(self) -> Optional[int]:
        return None

    def give_back(self, slot: Optional[int]) -> None:
        pass

    def slots_in_use(self) -> int:
        return 0


class WorkerView(Protocol):
    """The executor's view of one worker (fleet.WorkerHandle, threads.ThreadHandle, inline.InlineHandle)."""

    id: int
    #: Tasks sent and not yet answered, oldest first (a worker serves them in order).
    outstanding: Any  # (a deque of Task)
    #: False once its copy of an iterable dataset ran out this epoch.
    active: bool
    exited: bool
    #: When it began the task in hand (time.monotonic()).
    busy_since: float
    #: Whether it is ready before it says so (an inline worker is).
    ready: bool

    @property
    def pid(self) -> int: ...

    @property
    def timing_ids(self) -> tuple[int, int]:
        """(worker id, pid) in a batch's timings; (-1, 0) for the main process."""

    def current(self, epoch_id: int) -> Optional[Task]:
        """The task of this epoch it is working on, if any."""

    def describe(self) -> str:
        """ "worker 0 (pid 123)", for messages."""

    def stack_text(self) -> str:
        """Its Python stack now ("" when it cannot be had)."""


class Workers(Protocol):
    """A set of workers the executor drives."""

    workers: list
    #: Whether the workers belong to the process that started them (a
    #: forked child of it must neither use nor stop them).
    process_bound: bool
    #: Whether a batch crosses from its worker (False inline: the batch is
    #: made as the user gets it, tensors included, and nothing is decoded).
    transports: bool

    def start(self, make_config: Callable[..., Any], num_workers: int, num_slots: int) -> None:
        """Start ``num_workers`` workers (``make_config(worker_id, fds,
        close_fds)`` gives each its WorkerConfig) and ``num_slots`` slots
        for their batches; on a failure, stop what started and raise."""

    def start_rest(self) -> bool:
        """Start the workers that ``start`` left to start once the first
        tasks are sent (a staggered start: pool.py); whether any started
        (none is left after the first call). On a failure, stop every
        worker and raise."""

    def begin_epoch(self, epoch_id: int, restore: dict[int, CopyState]) -> Optional[dict[int, CopyState]]:
        """Epoch ``epoch_id`` begins, its iterable copies continuing from
        ``restore`` (worker id -> state). Workers that start their copies
        now (inline) return where each then stands; others None (they start
        at the epoch's first task, which carries its restore)."""

    @property
    def watched(self) -> bool:
        """Whether any worker is left to wait on."""

    @property
    def small_batches(self) -> bool:
        """Whether recent batches were small enough that keeping more of
        them in flight costs nothing worth counting."""

    def send(self, worker: Any, tasks: list[Task]) -> None:
        """Hand ``tasks`` to ``worker``, in order, without waiting."""

    def wait(self, timeout_s: Optional[float]) -> list[tuple[Any, Any]]:
        """(worker, message) for what arrived, and (worker, EXITED) for a
        worker that ended, after its messages; [] at the timeout."""

    def decode(self, worker: Any, task: Task, message: Batch) -> Any:
        """The batch's data as the user gets it (numpy leaves), from the
        answer to ``task`` (its slot)."""

    def exit_error(self, worker: Any, what: Optional[str], starting: bool = False) -> BaseException:
        """The error for ``worker`` having ended while the loader ran;
        ``what`` names the batch it had in hand ("batch 3 (sample indices
        [6, 7])"), None when it had none; ``starting``: it ended before it
        was ready (what it printed then belongs in the error)."""

    def lend_slot(self) -> Optional[int]: ...

    def give_back(self, slot: Optional[int]) -> None: ...

    def slots_in_use(self) -> int: ...

    def stop(self) -> None:
        """Stop every worker and free what they share; safe to call twice."""

    def let_go(self) -> None:
        """In a forked child: let go of this process's copies, touching
        nothing the parent's workers see."""
