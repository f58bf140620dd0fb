"""Every test must leave nothing behind: no child process (zombies included),
no open file descriptor, no thread, no file in /dev/shm.

``leave_nothing_behind`` (autouse) takes a snapshot before each test and
compares after it. Workers, pipes and threads end asynchronously, so a
difference is looked at again, after ``gc.collect()``, until it is gone or
``SETTLE_S`` has passed. A clean test costs two snapshots (about 0.2 ms
each: only pids new since the first are read); the garbage collector runs
only when something is still there, first its young generations (which
free most loaders a test dropped inside a reference cycle), then a full
collection (over 100 ms with torch loaded) if that was not enough.
/dev/shm is shared by the whole machine (and often by other containers):
only a file this process tree made counts, one that the test process or a
descendant holds or that carries conveyor's name (procutil.new_shm_files);
another program's files are never this test's leak.

When a test leaks, its teardown fails with a list of exactly what leaked,
and the leaked processes are killed so that the next tests start clean. A
test that failed already is not blamed again (its traceback keeps its
loaders alive), but its processes are killed too. A test whose leak is a
known engine bug carries ``@pytest.mark.leaks_known("why")``: checked and
cleaned up, never failed.

Datasets shared by several test files live in ``toy_datasets.py``, a plain
module that spawn workers can import (see there).

The tests of Ray actor workers share one local Ray instance (``local_ray``,
see ray_helpers.py): they run one after another first, in one xdist group
("ray") when the run is parallel (its longest part, started at once), and
the instance is up only while they run.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import threading
import time
import warnings
from multiprocessing import forkserver, resource_tracker

import pytest

import procutil
import ray_helpers
from conveyor._engine.workers import starter

#: How long leftovers get to go away after a test (workers exiting, pipes
#: closing, threads joining). Never reached by a clean test.
SETTLE_S = 5.0


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "leaks_known(reason): the test leaves something behind because of a known engine bug "
        "(say which); leave_nothing_behind reports it without failing the test",
    )
    config.addinivalue_line(
        "markers", "local_ray: the test uses the shared local Ray instance (ray_helpers.py) without naming its fixture"
    )
    config.addinivalue_line(
        "markers", "serial: the test needs the machine to itself; make test runs it alone, after the parallel pass"
    )
    if config.getoption("dist", "no") == "loadgroup" and not xdist_can_group():
        raise pytest.UsageError(
            f"--dist loadgroup: pytest {pytest.__version__} keeps a test's id where this pytest-xdist cannot add "
            "its xdist_group, so every group (one Ray instance, one cluster) would be spread over the workers; "
            "install the pytest the dev extra pins (pip install -e '.[dev]')"
        )


def xdist_can_group() -> bool:
    """Whether pytest-xdist's loadgroup can give a test its group: it
    appends the group to ``item._nodeid``, which a test's id is read from up
    to pytest 9.1 (9.2 reads another attribute, and the groups are lost)."""
    from _pytest.nodes import Node

    return "_nodeid" in Node.nodeid.fget.__code__.co_names


@pytest.hookimpl(tryfirst=True)  # (before xdist reads the groups)
def pytest_collection_modifyitems(config, items):
    """The tests of the shared Ray instance first, in their order, and in one
    xdist group: one instance for all of them."""
    uses_ray = [item for item in items if ray_helpers.needs_local_ray(item)]
    for item in uses_ray:
        item.add_marker(pytest.mark.xdist_group("ray"))
    if uses_ray:
        items[:] = uses_ray + [item for item in items if not ray_helpers.needs_local_ray(item)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test's own teardown: the shared Ray instance stopped when the
    next test does not use it (none runs beside a test that does not)."""
    try:
        return (yield)
    finally:
        if nextitem is None or not ray_helpers.needs_local_ray(nextitem):
            ray_helpers.SHARED.stop()


def pytest_terminal_summary(terminalreporter):
    if ray_helpers.SHARED.starts:
        terminalreporter.write_line(f"local Ray instances started: {ray_helpers.SHARED.starts}")


class KnownLeakWarning(UserWarning):
    """What a test marked ``leaks_known`` left behind."""


# ----------------------------------------------------------------- snapshot
@dataclasses.dataclass(frozen=True)
class Snapshot:
    pids: set  # every pid on the machine (procutil.pids())
    fds: dict  # fd -> link target ("pipe:[123]", "/memfd:conveyor-slot (deleted)", ...)
    threads: frozenset  # threading.Thread objects
    shm: frozenset  # names in /dev/shm (the whole machine's; new_shm_files picks ours)


def _fds() -> dict[int, str]:
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed by now
            pass
    return found


def snapshot() -> Snapshot:
    return Snapshot(procutil.pids(), _fds(), frozenset(threading.enumerate()), frozenset(procutil.shm_files()))


def leftovers(before: Snapshot) -> dict[str, list[str]]:
    """What exists now and did not before: {kind: [one line per thing]};
    empty when nothing was left behind."""
    found = {}
    processes = procutil.new_descendants(before.pids)
    if processes:
        found["processes"] = [
            f"pid {pid} ({procutil.describe(pid, letter)})" for pid, letter in sorted(processes.items())
        ]
    fds = {fd: target for fd, target in _fds().items() if before.fds.get(fd) != target}
    if fds:
        found["file descriptors"] = [f"fd {fd} -> {target}" for fd, target in sorted(fds.items())]
    threads = [t for t in threading.enumerate() if t not in before.threads]
    if threads:
        found["threads"] = [f"{t.name!r} (daemon={t.daemon}, ident={t.ident})" for t in threads]
    shm = procutil.new_shm_files(before.shm)
    if shm:
        found["/dev/shm files"] = [os.path.join(procutil.SHM_DIR, name) for name in sorted(shm)]
    return found


def settled_leftovers(before: Snapshot, timeout_s: float = SETTLE_S) -> dict[str, list[str]]:
    """``leftovers``, once more after ``gc.collect()`` (which runs the
    finalizers of loaders and iterators that the test dropped inside
    reference cycles, e.g. through a caught exception's traceback), then
    every ``procutil.POLL_S`` until nothing is left or ``timeout_s`` has
    passed."""
    found = leftovers(before)
    if not found:
        return found
    gc.collect(1)  # young objects only: usually enough, and far cheaper than a full collection
    found = leftovers(before)
    if not found:
        return found
    gc.collect()
    deadline = time.monotonic() + timeout_s
    found = leftovers(before)
    while found and time.monotonic() < deadline:
        time.sleep(procutil.POLL_S)
        found = leftovers(before)
    return found


def kill_leftover_processes(before: Snapshot) -> None:
    """SIGKILL whatever descendants the test added, and reap our zombies, so
    that one leaky or failing test does not slow down or poison the next."""
    extra = procutil.new_descendants(before.pids)
    for pid in extra:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    procutil.wait_until_gone(extra, 2.0)
    for pid in procutil.children():
        if pid in extra:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours to reap (multiprocessing's or Popen's bookkeeping)
                pass


def describe_leftovers(found: dict[str, list[str]]) -> str:
    lines = []
    for kind, items in found.items():
        lines.append(f"{kind}:")
        lines.extend(f"    {item}" for item in items)
    return "\n".join(lines)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def server():
    """One S3-compatible server on 127.0.0.1 (moto behind tests/object_store.py's
    fault-injecting proxy) for every store test; each test file resets the
    faults it sets."""
    import fsspec.asyn

    from object_store import ObjectStore

    fsspec.asyn.get_loop()  # (its IO thread, before any test looks at what it left)
    store = ObjectStore.start()
    yield store
    store.stop()


@pytest.fixture(scope="session")
def multiprocessing_servers():
    """Start multiprocessing's forkserver and resource tracker, and
    conveyor's process starter, before the first snapshot: they live for
    the whole session (the descriptors the main process keeps to them and
    the starter's thread are not a test's leak)."""
    forkserver.ensure_running()  # starts the resource tracker first
    resource_tracker.ensure_running()
    starter.process_starter()


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt in this process during the test, as
    in a terminal, whatever the run inherited; the handler there before is
    put back after. A shell that starts a job in the background (``nohup
    make test &``, many CI runners) makes it ignore SIGINT, and then Python
    installs no handler of its own: a test that sends itself Ctrl-C would
    see nothing happen. A child process a test starts must do the same
    itself (``signal.signal(signal.SIGINT, signal.default_int_handler)``)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture
def local_ray():
    """``ray`` connected to the shared local instance (ray_helpers.SHARED),
    which ``leave_nothing_behind`` has started before its snapshot."""
    return ray_helpers.SHARED.start()


@pytest.fixture(autouse=True)
def leave_nothing_behind(request, multiprocessing_servers):
    if ray_helpers.needs_local_ray(request.node):
        pytest.importorskip("ray")
        ray_helpers.SHARED.start()  # (Ray's own servers are no test's leftovers)
    before, failed_before = snapshot(), request.session.testsfailed
    yield
    if request.session.testsfailed != failed_before:
        # Already reported, and its traceback holds its loaders: no blame, no wait.
        kill_leftover_processes(before)
        return
    found = settled_leftovers(before)
    if not found:
        return
    kill_leftover_processes(before)
    what = describe_leftovers(found)
    marker = request.node.get_closest_marker("leaks_known")
    if marker is not None:
        reason = marker.args[0] if marker.args else marker.kwargs.get("reason", "?")
        warnings.warn(KnownLeakWarning(f"known leak ({reason}):\n{what}"), stacklevel=1)
        return
    pytest.fail(f"the test left things behind ({SETTLE_S:g} s after it ended):\n{what}", pytrace=False)
