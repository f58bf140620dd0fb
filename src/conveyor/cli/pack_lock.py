"""The lock that lets one ``conveyor pack`` at a time write a folder, on
one machine or across machines sharing it (NFS, Lustre: no ``flock``).

    run ──write its record to OUT/pack.lock.<run>.tmp──link() to OUT/pack.lock──▶ holds it
        │  (link is atomic on every shared file system, and fails when the lock is there)
        ├─ held:   a heartbeat thread touches the lock's mtime every HEARTBEAT_S and checks it is still
        │          its own; the run checks that before it removes or writes the manifest
        ├─ taken:  wait (one line on stderr), or with --no-wait refuse (PackBusy); a holder that is
        │          gone is taken over: on this machine its process has ended (pid and start time),
        │          elsewhere its heartbeat is older than STALE_S (by the folder's clock) or has not
        │          moved for STALE_S while this run watched
        └─ done:   the lock is renamed aside, found to be its own, removed

Taking over renames the lock aside first and removes it only if it is the
one judged gone (its run token); a lock that another run had just made is
linked back. A run whose lock was taken over (it stalled for STALE_S)
learns it at its next heartbeat and stops before it touches the manifest.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .pack_sources import PackFailed

LOCK = "pack.lock"
#: How often the holder touches its lock: often enough that STALE_S is many beats.
HEARTBEAT_S = 2.0
#: A lock from another machine whose heartbeat is this old is taken over: long enough for a holder that
#: is slowed down (a busy machine, a slow file system), short enough that a dead one costs little.
STALE_S = 30.0
#: How often a waiting run looks at the lock again.
POLL_S = 0.2


class PackBusy(PackFailed):
    """Another ``conveyor pack`` is writing the folder and this run was asked not to wait (``--no-wait``)."""


@dataclass(frozen=True)
class Holder:
    """What a lock file says of the run that holds it."""

    run: str
    host: str
    pid: int
    #: What tells this process from a later one with its pid: boot id, pid namespace, start time.
    machine: str
    started: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        return f"pid {self.pid} on {self.host}, since {when}"


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _machine() -> str:
    """This kernel and pid namespace (pids mean the same process only within them)."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{_read_text('/proc/sys/kernel/random/boot_id')} {namespace}".strip()


def _started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot), '' where /proc does not say."""
    stat = _read_text(f"/proc/{pid}/stat")
    return stat.rpartition(")")[2].split()[19] if ")" in stat else ""


def _alive(holder: Holder) -> bool:
    """Whether the holder's process runs (asked only on its own machine)."""
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return not holder.started or _started(holder.pid) == holder.started


@dataclass(frozen=True)
class _Seen:
    """A lock file as read: its holder (None: unreadable), mtime and identity."""

    holder: Optional[Holder]
    mtime_ns: int
    identity: tuple


_TYPES: dict[str, Any] = {"run": str, "host": str, "pid": int, "machine": str, "started": str, "since": (int, float)}


def _holder(text: bytes) -> Optional[Holder]:
    """The holder a lock file's bytes name; None when they are not a lock conveyor pack wrote."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(raw, dict) and set(raw) == set(_TYPES)):
        return None
    if not all(isinstance(raw[key], kind) and not isinstance(raw[key], bool) for key, kind in _TYPES.items()):
        return None
    return Holder(**raw)


def _look(path: str) -> Optional[_Seen]:
    """The lock at ``path``, opened afresh (on NFS an open revalidates what a stat may have cached); None: no lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st, text = os.fstat(fd), os.read(fd, 1 << 16)
    finally:
        os.close(fd)
    holder = _holder(text)
    return _Seen(holder, st.st_mtime_ns, (st.st_dev, st.st_ino, holder.run if holder else None))


class PackLock:
    """The lock of one folder for one run: ``with PackLock(out, wait):``.
    ``tell`` prints the one line a waiting run says (default: stderr)."""

    def __init__(self, out: str, wait: bool = True, tell: Optional[Callable[[str], None]] = None):
        self.out, self.path, self.wait = out, os.path.join(out, LOCK), wait
        self.tell = tell or (lambda line: print(line, file=sys.stderr, flush=True))
        #: This run's token: in its lock, and in the names of the files it writes before renaming them.
        self.run = secrets.token_hex(8)
        self._fd: Optional[int] = None
        self._lost: Optional[str] = None
        self._stop = threading.Event()
        self._beat: Optional[threading.Thread] = None

    # ------------------------------------------------------------ taking
    def __enter__(self) -> "PackLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock: at once, after waiting for the run that holds it, or after taking it over from a gone one."""
        me = Holder(self.run, socket.gethostname(), os.getpid(), _machine(), _started(os.getpid()), time.time())
        told = False
        watched: dict[tuple, tuple[int, float]] = {}  # identity -> (mtime_ns, when it was first seen so)
        while not self._try(me):
            seen = _look(self.path)
            if seen is None:
                continue
            gone = self._gone(seen, watched)
            if gone is not None:
                if self._set_aside(seen.identity, f"{self.path}.{self.run}.stale"):
                    self.tell(f"conveyor pack: took over the lock of {self.out} from {_who(seen)}: {gone}")
                watched.clear()
                continue
            who = _who(seen)
            if not self.wait:
                raise PackBusy(
                    f"another conveyor pack is at work on {self.out} ({who}); wait for it, or leave out "
                    f"--no-wait to wait until it is done"
                )
            if not told:
                self.tell(f"conveyor pack: waiting for another conveyor pack of {self.out} to finish ({who})")
                told = True
            time.sleep(POLL_S)
        self._beat = threading.Thread(target=self._heartbeat, name="conveyor-pack-heartbeat", daemon=True)
        self._beat.start()

    def _try(self, me: Holder) -> bool:
        """Make the lock, holding ``me``; False when another run holds it."""
        tmp = f"{self.path}.{self.run}.tmp"
        fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        made = False
        try:
            os.write(fd, json.dumps(me.__dict__).encode())
            os.fsync(fd)
            try:
                os.link(tmp, self.path)
                made = True
            except FileExistsError:
                pass
            except OSError:  # (NFS: the link may have been made and its reply lost; the count of links says)
                made = os.fstat(fd).st_nlink == 2
                if not made:
                    raise
        finally:
            _unlink(tmp)
            if not made:
                os.close(fd)
        if made:
            self._fd = fd
        return made

    def _gone(self, seen: _Seen, watched: dict) -> Optional[str]:
        """Why the holder of ``seen`` is gone (its lock may be taken over); None: it may be at work."""
        holder = seen.holder
        if (
            holder is not None
            and holder.machine
            and holder.machine == _machine()
            and holder.host == socket.gethostname()
        ):
            return None if _alive(holder) else f"its process {holder.pid} has ended"
        first = watched.setdefault(seen.identity, (seen.mtime_ns, time.monotonic()))
        if first[0] != seen.mtime_ns:
            watched[seen.identity] = (seen.mtime_ns, time.monotonic())
        elif time.monotonic() - first[1] > STALE_S:
            return f"its heartbeat has not moved for {STALE_S:.0f} s"
        if time.time() - seen.mtime_ns / 1e9 > STALE_S:  # (confirmed by the folder's own clock: machines' may differ)
            age_s = self._folder_now_ns() / 1e9 - seen.mtime_ns / 1e9
            if age_s > STALE_S:
                return f"its last heartbeat was {age_s:.0f} s ago"
        return None

    def _folder_now_ns(self) -> int:
        """The time by the clock the folder's file system stamps files with."""
        probe = f"{self.path}.{self.run}.clock"
        fd = os.open(probe, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
        try:
            return os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
            _unlink(probe)

    def _set_aside(self, identity: tuple, aside: str) -> bool:
        """Remove the lock if it is still the one of ``identity``: renamed to
        ``aside`` first, linked back when it turns out to be another; whether it was removed."""
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        moved = _look(aside)
        if moved is not None and moved.identity != identity:
            try:
                os.link(aside, self.path)  # (another run's fresh lock: put back; if a third made one, it is lost)
            except FileExistsError:
                pass
            _unlink(aside)
            return False
        _unlink(aside)
        return True

    # ----------------------------------------------------------- holding
    def _heartbeat(self) -> None:
        """Every HEARTBEAT_S: touch the lock, and check it is still this run's."""
        assert self._fd is not None
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self._fd) if os.utime in os.supports_fd else os.utime(self.path)
            except OSError:
                pass
            if not self._still_mine() and (self._stop.wait(POLL_S) or not self._still_mine()):
                self._lost = "its lock was taken over by another run after its heartbeat stalled"
                return

    def _still_mine(self) -> bool:
        assert self._fd is not None
        seen, mine = _look(self.path), os.fstat(self._fd)
        return seen is not None and seen.identity[:2] == (mine.st_dev, mine.st_ino)

    def confirm(self, doing: str) -> None:
        """Raise PackFailed, before ``doing``, when this run no longer holds the lock."""
        if self._lost is not None or not self._still_mine():
            raise PackFailed(
                f"stopped before it would {doing}: {self._lost or 'its lock is gone'} ({self.path}); the run that "
                f"holds it now finishes the folder, or run the same command again"
            )

    # ---------------------------------------------------------- releasing
    def release(self) -> None:
        """1. stop the heartbeat; 2. remove the lock if it is still this run's; 3. close it."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join(HEARTBEAT_S + 5.0)
        if self._fd is None:
            return
        mine = os.fstat(self._fd)
        seen = _look(self.path)
        if seen is not None and seen.identity[:2] == (mine.st_dev, mine.st_ino):
            self._set_aside(seen.identity, f"{self.path}.{self.run}.done")
        os.close(self._fd)
        self._fd = None


def _who(seen: _Seen) -> str:
    return seen.holder.describe() if seen.holder else "a run whose lock file cannot be read"


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["PackLock", "PackBusy", "Holder", "LOCK", "HEARTBEAT_S", "STALE_S"]
