"""Looking at processes through /proc, for tests that must prove nothing leaked.

No psutil: a scan of ``/proc/<pid>/stat`` gives each process's state and
parent. (``/proc/<pid>/task/*/children`` would be quicker but needs
CONFIG_PROC_CHILDREN, which some kernels lack.)

    state(pid)            'R', 'S', 'Z', ... or None once the pid is gone
    is_running(pid)       exists and is not a zombie
    children(pid)         {child pid: state} of every direct child
    wait_until_gone(pids) poll until none of them runs (zombies count as gone:
                          an orphan's zombie is its new parent's to reap)
    leaked(before)        descendants that appeared since ``before``, zombies
                          included, multiprocessing's own servers excluded
    new_descendants(pids) the same, cheaper: looks at pids new since ``pids()``
    describe(pid)         state and command line, for failure messages
    new_shm_files(before) names that appeared in /dev/shm, less those another
                          process on the machine has mapped
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Optional

#: How often to look again while waiting for processes to go.
POLL_S = 0.02


def _stat_fields(pid: int) -> Optional[list[str]]:
    """Fields of /proc/<pid>/stat after the command name (which may hold
    spaces and parentheses): [state, ppid, ...]; None if the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    _, _, rest = raw.rpartition(")")
    return rest.split()


def state(pid: int) -> Optional[str]:
    """The process state letter ('R', 'S', 'D', 'Z', ...) or None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def parent(pid: int) -> Optional[int]:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def is_running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (or dead)."""
    return state(pid) not in (None, "Z", "X", "x")


def children(pid: Optional[int] = None) -> dict[int, str]:
    """Every direct child of ``pid`` (default: this process), with its state."""
    pid = os.getpid() if pid is None else pid
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields and int(fields[1]) == pid:
            found[int(name)] = fields[0]
    return found


def descendants(pid: Optional[int] = None) -> dict[int, str]:
    """Children, grandchildren, ... of ``pid`` with their states."""
    pid = os.getpid() if pid is None else pid
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat_fields(int(name))
            if fields:
                table[int(name)] = (int(fields[1]), fields[0])
    found, frontier = {}, [pid]
    while frontier:
        current = frontier.pop()
        for child, (ppid, st) in table.items():
            if ppid == current and child not in found:
                found[child] = st
                frontier.append(child)
    return found


def pids() -> set[int]:
    """Every pid on the machine now (one listing of /proc: cheap)."""
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def new_descendants(before: set[int]) -> dict[int, str]:
    """``leaked`` for a per-test check, at a fraction of its cost:
    descendants of this process (zombies included, multiprocessing's own
    servers excluded) among the pids not in ``before``, a ``pids()`` taken
    earlier. Only new pids are read (and the ancestors they lead to): a
    process that existed before cannot have become a descendant since, as
    orphans go to init, not to us."""
    new = {}
    for pid in pids() - before:
        fields = _stat_fields(pid)
        if fields:
            new[pid] = (int(fields[1]), fields[0])
    verdict = {os.getpid(): True, 1: False, 0: False}

    def is_ours(pid: int) -> bool:
        chain = []
        while pid not in verdict:
            chain.append(pid)
            pid = new[pid][0] if pid in new else (parent(pid) or 0)
        for link in chain:
            verdict[link] = verdict[pid]
        return verdict[pid]

    return {pid: letter for pid, (_, letter) in new.items() if is_ours(pid) and not is_mp_server(pid)}


def running(pids: Iterable[int]) -> list[int]:
    """Those of ``pids`` that still run."""
    return [p for p in pids if is_running(p)]


def wait_until_gone(pids: Iterable[int], timeout_s: float = 5.0) -> list[int]:
    """Poll until none of ``pids`` runs; return those still running at the
    deadline (empty on success)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout_s
    left = running(pids)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = running(left)
    return left


#: multiprocessing starts these helpers once per process and keeps them; they
#: are not a loader's workers. (Workers forked by the forkserver share its
#: command line but are its children, not ours.)
_MP_SERVERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


def describe(pid: int, letter: Optional[str] = None) -> str:
    """``pid``'s state and command line, for a failure message (a zombie has
    no command line left: its name from /proc/<pid>/stat then)."""
    letter = letter or state(pid) or "gone"
    line = cmdline(pid).strip()
    if not line:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read().decode("ascii", "replace")
            line = "[" + raw[raw.index("(") + 1 : raw.rindex(")")] + "]"
        except (OSError, ValueError):
            line = "?"
    return f"state {letter}: {line}"


def is_mp_server(pid: int, owner: Optional[int] = None) -> bool:
    """True for multiprocessing's forkserver or resource tracker of ``owner``."""
    owner = os.getpid() if owner is None else owner
    return parent(pid) == owner and any(name in cmdline(pid) for name in _MP_SERVERS)


def leaked(before: dict[int, str], timeout_s: float = 0.0) -> dict[int, str]:
    """Descendants of this process that were not in ``before`` (zombies
    included: an unreaped worker is a leak), leaving out multiprocessing's
    forkserver and resource tracker. With ``timeout_s``, look again until
    none is left or the time is up."""
    deadline = time.monotonic() + timeout_s
    while True:
        extra = {p: s for p, s in descendants().items() if p not in before and not is_mp_server(p)}
        if not extra or time.monotonic() >= deadline:
            return extra
        time.sleep(POLL_S)


# ------------------------------------------------------------------ /dev/shm
SHM_DIR = "/dev/shm"

#: /dev/shm names seen mapped by a process outside this process's family.
#: Names are random and never come back, so once is enough.
_FOREIGN_SHM: set[str] = set()


def shm_files() -> set[str]:
    """The names in /dev/shm (empty where there is none)."""
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _mapped_by_others(names: set[str]) -> set[str]:
    """Those of ``names`` that a process other than this one and its
    descendants has mapped (a named semaphore or shared memory in use)."""
    family = {os.getpid(), *descendants()}
    paths = {os.path.join(SHM_DIR, name): name for name in names}
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in family:
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        found.update(name for path, name in paths.items() if path in maps)
    return found


def new_shm_files(before: set[str]) -> set[str]:
    """Names in /dev/shm that were not in ``before``, less those that some
    other process on the machine has mapped: /dev/shm is shared by every
    process on the machine, and another program's multiprocessing
    semaphores (``sem.mp-*``) are not this test's leak. A file that nobody
    maps any more (its creator died or forgot to unlink it) counts."""
    new = shm_files() - before - _FOREIGN_SHM
    if new:
        foreign = _mapped_by_others(new)
        _FOREIGN_SHM.update(foreign)
        new -= foreign
    return new
