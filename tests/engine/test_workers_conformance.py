"""One conformance suite for every implementation of ``Workers``.

The pool executor drives its workers only through the ``Workers`` protocol
(``_engine/workers/protocol.py``): start, send, wait, decode, exit_error, slots, stop.
Each implementation (processes under fork and spawn, threads, the inline
worker of ``num_workers=0``, Ray actors on a local Ray instance started
once for the module) runs the same tests here, driven directly,
without a DataLoader: a new kind of worker is done when it passes them.

    start ──▶ one Ready per worker (the inline worker is ready from the start)
    send(tasks) ──▶ one answer per task, in order: Batch (decoded to the
                    collated samples) or TaskFailed (the user's exception)
    user code ends a worker ──▶ Fatal, then EXITED after its messages
                                (inline: the SystemExit itself, as torch raises it)
    wait(timeout) with nothing sent ──▶ []
    stop ──▶ nothing left running; safe twice
"""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

import conveyor
import procutil
from conveyor._engine.executor.kinds import MAP
from conveyor._engine.loading.fetch import FetchSpec, collate_route
from conveyor._engine.loading.places import INLINE, PROCESS, THREAD, Place
from conveyor._engine.loading.serving import WorkerConfig
from conveyor._engine.transport.messages import Batch, Fatal, Ready, Task, TaskFailed
from conveyor._engine.workers.inline import InlineWorkers
from conveyor._engine.workers.pool import WorkerPool
from conveyor._engine.workers.protocol import EXITED
from conveyor._engine.workers.ray_actors import RayActorWorkers
from conveyor._engine.workers.threads import ThreadWorkers
from conveyor.ray_options import RayWorkers

pytestmark = pytest.mark.timeout(120)

#: Long enough for a spawned interpreter to start on a loaded machine; never asserted.
PATIENCE_S = 60.0


class Samples(conveyor.Dataset):
    """Sample ``i`` is a small array of ``i``; sample 13 raises; sample 66 ends its worker."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> np.ndarray:
        if i == 13:
            raise KeyError(f"no sample {i} here")
        if i == 66:
            raise SystemExit(5)
        return np.full(3, i, dtype=np.int64)


#: name: (make it, how many workers, where they run)
IMPLEMENTATIONS = {
    "processes (fork)": (lambda: WorkerPool("fork"), 2, PROCESS),
    "processes (spawn)": (lambda: WorkerPool("spawn"), 2, PROCESS),
    "threads": (ThreadWorkers, 2, THREAD),
    "inline": (InlineWorkers, 1, INLINE),
    "ray actors": (lambda: RayActorWorkers(RayWorkers(num_cpus=1, start_timeout=PATIENCE_S)), 2, PROCESS),
}

try:
    import ray  # noqa: F401
except ImportError:  # (pip install conveyor[ray]: without it, Ray's turn is skipped)
    del IMPLEMENTATIONS["ray actors"]


def config_maker(num_workers: int, place: Place):
    collate_into, to_torch = collate_route(conveyor.default_collate)
    spec = FetchSpec(
        dataset=Samples(),
        kind=MAP,
        auto_collation=True,
        batch_size=2,
        drop_last=False,
        collate_fn=conveyor.default_collate,
        collate_into=collate_into,
        to_torch=to_torch,
    )

    def make(worker_id, fds, close_fds):
        return WorkerConfig(
            worker_id=worker_id,
            num_workers=num_workers,
            seed=1234 + worker_id,
            fetch=spec,
            worker_init_fn=None,
            parent_pid=os.getpid() if place is PROCESS else None,
            close_fds=close_fds,
            fds=fds,
            place=place,
        )

    return make


# Ray's turn uses the shared local instance (ray_helpers.py: up before the
# test takes its snapshot of what runs, so Ray's own servers are no test's leftovers).
@pytest.fixture(
    params=[
        pytest.param(name, marks=pytest.mark.local_ray) if name == "ray actors" else name for name in IMPLEMENTATIONS
    ]
)
def workers(request):
    """A started ``Workers`` (2 workers; 1 inline), each Ready; stopped afterwards."""
    before = procutil.pids()
    make, count, place = IMPLEMENTATIONS[request.param]
    pool = make()
    pool.start(config_maker(count, place), count, 6)
    assert len(pool.workers) == count
    ready = {worker.id for worker in pool.workers if worker.ready}
    unready = count - len(ready)
    for worker, message in collect(pool, lambda got: len(got) >= unready):
        assert isinstance(message, Ready), message
        ready.add(message.worker_id)
    assert ready == set(range(count))
    pool.place = place  # (for the tests' expectations)
    yield pool
    pool.stop()
    pool.stop()  # (safe twice)
    assert not pool.watched
    assert not procutil.new_descendants(before), "the workers outlived stop()"


def collect(pool, enough, patience_s: float = PATIENCE_S):
    """Wait until ``enough(arrived)``; what arrived, in order."""
    arrived = []
    deadline = time.monotonic() + patience_s
    while not enough(arrived):
        assert time.monotonic() < deadline, f"only {arrived} arrived"
        arrived.extend(pool.wait(0.5))
    return arrived


def send(pool, worker, batches, epoch_id=1, first=0):
    """Book and send ``batches`` (lists of indices) to ``worker``, as the executor does."""
    tasks = []
    for k, indices in enumerate(batches):
        task = Task(epoch_id, first + k, 99 + k, indices, pool.lend_slot())
        worker.outstanding.append(task)
        tasks.append(task)
    pool.send(worker, tasks)


def answer(pool, worker, message):
    """What the executor does with an answer: a batch's data (its slot is
    the batch's now, free once its views are gone), or the message (its
    slot given back)."""
    task = worker.outstanding.popleft()
    if isinstance(message, Batch):
        return np.array(pool.decode(worker, task, message))  # (a copy: the views go at once)
    pool.give_back(task.slot)
    return message


def test_every_task_is_answered_in_order_with_its_batch(workers):
    first, last = workers.workers[0], workers.workers[-1]
    send(workers, first, [[0, 1], [2, 3], [4, 5]])
    send(workers, last, [[6, 7], [8, 9]], first=3)
    arrived = collect(workers, lambda got: len(got) >= 5)
    by_worker = {first.id: [], last.id: []}
    for worker, message in arrived:
        assert isinstance(message, Batch), message
        by_worker[worker.id].append((message.batch_index, answer(workers, worker, message)))
    assert [index for index, _ in by_worker[first.id]] == [0, 1, 2] + ([3, 4] if first is last else [])
    assert [index for index, _ in by_worker[last.id]][-2:] == [3, 4]
    for index, data in by_worker[first.id] + by_worker[last.id]:
        assert data.tolist() == [[2 * index] * 3, [2 * index + 1] * 3]
    gc.collect()
    assert workers.slots_in_use() == 0


def test_a_failing_sample_fails_its_task_and_the_worker_goes_on(workers):
    worker = workers.workers[0]
    send(workers, worker, [[12, 13], [14, 15]])
    (_, failed), (_, after) = collect(workers, lambda got: len(got) >= 2)
    assert isinstance(failed, TaskFailed) and failed.batch_index == 0
    assert failed.failure.exc_type_name == "KeyError" and "no sample 13 here" in failed.failure.traceback_text
    assert isinstance(after, Batch) and after.batch_index == 1
    answer(workers, worker, failed)
    assert answer(workers, worker, after).tolist() == [[14] * 3, [15] * 3]


def test_user_code_that_ends_its_worker_is_fatal_then_exited(workers):
    worker = workers.workers[-1]
    send(workers, worker, [[64, 65], [66, 67]])
    if workers.place is INLINE:  # (the loop's own thread: raised as it is, after the batch before)
        ((_, first),) = workers.wait(0)
        assert isinstance(first, Batch) and first.batch_index == 0
        with pytest.raises(SystemExit) as ended:
            workers.wait(0)
        assert ended.value.code == 5
        return
    arrived = collect(workers, lambda got: any(message is EXITED for _, message in got))
    messages = [message for who, message in arrived if who is worker]
    assert isinstance(messages[0], Batch) and messages[0].batch_index == 0  # (what it sent before comes first)
    assert isinstance(messages[1], Fatal) and messages[1].exit_code == 5 and messages[1].batch_index == 1
    assert messages[-1] is EXITED
    assert isinstance(workers.exit_error(worker, None), BaseException)


def test_waiting_with_nothing_sent_returns_nothing(workers):
    assert workers.wait(0.05) == []
    assert workers.watched


def test_a_failure_carries_the_users_exception_inline_and_its_text_elsewhere(workers):
    worker = workers.workers[0]
    send(workers, worker, [[13]])
    ((_, failed),) = collect(workers, lambda got: len(got) >= 1)
    answer(workers, worker, failed)
    if workers.place is INLINE:
        assert isinstance(failed.exception, KeyError) and failed.exception.args == ("no sample 13 here",)
    else:
        assert failed.exception is None and failed.failure.exc_type_name == "KeyError"


def test_slots_lent_are_counted_until_given_back(workers):
    lent = [workers.lend_slot() for _ in range(3)]
    if lent[0] is None:  # (threads hand batches over as they are: no slots)
        assert workers.slots_in_use() == 0
        return
    assert len(set(lent)) == 3 and workers.slots_in_use() == 3
    for slot in lent:
        workers.give_back(slot)
    assert workers.slots_in_use() == 0
