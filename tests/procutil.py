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
    new_shm_files(before) names that appeared in /dev/shm and that this process
                          or a descendant made (held, or named so)
    script_env(**more)    the environment for a test's own script: this
                          checkout's conveyor and the tests' modules importable
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable, Optional

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


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every ``POLL_S`` until it holds; AssertionError
    naming ``what`` if it still does not after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(POLL_S)


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

#: conveyor's own names in /dev/shm (the portable fallback's, unlinked the
#: moment they are made): one that stays is a leak.
CONVEYOR_SHM_PREFIX = "conveyor-"

#: torch names its shared-memory files after the process that made them.
_TORCH_SHM_PREFIX = "torch_"


def shm_files() -> set[str]:
    """The names in /dev/shm (empty where there is none)."""
    try:
        return set(os.listdir(SHM_DIR))
    except OSError:
        return set()


def _shm_names_held(pid: int) -> set[str]:
    """The /dev/shm names that process ``pid`` has open or mapped (empty
    once it is gone or when /proc hides it)."""
    prefix = SHM_DIR + "/"
    paths = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                paths.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:  # closed meanwhile
                pass
        with open(f"/proc/{pid}/maps") as f:
            paths.extend(line.split(None, 5)[-1].rstrip("\n") for line in f if prefix in line)
    except OSError:
        pass
    return {path[len(prefix) :] for path in paths if path.startswith(prefix) and not path.endswith(" (deleted)")}


def _held_by(pids: Iterable[int]) -> set[str]:
    held: set[str] = set()
    for pid in pids:
        held |= _shm_names_held(pid)
    return held


def _named_after(name: str, family: set[int]) -> bool:
    """True for a name that says one of ``family`` made it: torch's
    ``torch_<pid>_<n>``."""
    if not name.startswith(_TORCH_SHM_PREFIX):
        return False
    pid = name[len(_TORCH_SHM_PREFIX) :].split("_", 1)[0]
    return pid.isdigit() and int(pid) in family


def new_shm_files(before: set[str]) -> set[str]:
    """Names that appeared in /dev/shm since ``before`` and that this
    process tree (this process and its descendants) made.

    /dev/shm is shared by every process on the machine, including those of
    other containers, which /proc may not show, and a file there does not
    say who made it. So a new name counts only on evidence that it is ours:

    * this process or one of its descendants has it open or mapped (a
      multiprocessing semaphore or ``SharedMemory`` a test kept);
    * its name is conveyor's (``conveyor-...``: unlinked the moment it is
      made, so one that stays is a leak), unless a process outside this
      tree holds it (another conveyor run on the machine);
    * its name carries the pid of one of this tree's processes (torch's
      ``torch_<pid>_<n>``).

    Another program's files (``psm_*``, ``sem.mp-*``, ``torch_*``) never
    count, whether it keeps them open, closes them or exits. The price: a
    file this tree made under another name, closed and never unlinked,
    goes unnoticed once no process of the tree holds it."""
    new = shm_files() - before
    if not new:
        return new
    family = {os.getpid(), *descendants()}
    ours = (new & _held_by(family)) | {name for name in new if _named_after(name, family)}
    conveyor_named = {name for name in new - ours if name.startswith(CONVEYOR_SHM_PREFIX)}
    if conveyor_named:
        others = (int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) not in family)
        ours |= conveyor_named - _held_by(others)
    return ours


def script_env(**more: str) -> dict[str, str]:
    """This process's environment, with ``more``, for a script a test runs in
    a child ``python``: this checkout's conveyor and the tests' own modules
    first on its path."""
    import conveyor

    src = os.path.dirname(os.path.dirname(os.path.abspath(conveyor.__file__)))
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, **more}
    env["PYTHONPATH"] = os.pathsep.join([src, tests] + [p for p in [env.get("PYTHONPATH")] if p])
    return env
