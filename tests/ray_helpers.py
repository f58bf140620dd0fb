"""One local Ray instance for the tests of Ray actor workers, shared by
every test that asks for it (the ``local_ray`` fixture in conftest.py, or
the ``local_ray`` marker), with nothing of Ray's left running once the last
of them in a row has ended.

It is started before the first such test takes its snapshot of what runs
(conftest.py's ``leave_nothing_behind``), and stopped after any test whose
next test does not need it: every other test runs with no Ray of this
process up (the cluster and lifetime tests check that none of Ray's
processes is theirs). conftest.py runs the tests that need it one after
another, first, so that a whole run starts it once.

Its CPUs are declared, not this machine's: three workers of one CPU each
fit on a two-core machine (they wait on the cores as processes would).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import procutil

#: Ray's own processes (its servers and its idle workers): none may outlive the shared instance.
RAY_PROCESS_NAMES = ("raylet", "gcs_server", "ray::", "default_worker.py", "dashboard", "log_monitor", "monitor.py")
#: Declared CPUs of the local instance.
CPUS = 4
#: How long Ray's processes get to end after ray.shutdown().
GONE_WITHIN_S = 30.0


def ray_processes() -> dict[int, str]:
    """This process's descendants that are Ray's, with their command lines."""
    found = {}
    for pid in procutil.descendants():
        line = procutil.cmdline(pid)
        if any(name in line for name in RAY_PROCESS_NAMES):
            found[pid] = line
    return found


def needs_local_ray(item: Any) -> bool:
    """Whether a collected test uses the shared instance (the fixture, or the marker)."""
    return "local_ray" in getattr(item, "fixturenames", ()) or item.get_closest_marker("local_ray") is not None


class SharedRay:
    """The one local instance: ``start`` (idempotent) and ``stop``; ``starts``
    counts the instances started, for the report at the end of a run."""

    def __init__(self) -> None:
        self.ray: Optional[Any] = None
        self.starts = 0
        self._auth_mode: Optional[str] = None

    def start(self) -> Any:
        """``ray`` connected to the instance, started and warmed up if it is not running."""
        if self.ray is not None:
            return self.ray
        import ray

        self._auth_mode = os.environ.get("RAY_AUTH_MODE")
        os.environ["RAY_AUTH_MODE"] = "disabled"  # (a local instance for tests: no tokens)
        if ray.is_initialized():
            ray.shutdown()
        # address="local": a new instance, even while a ray.cluster_utils.Cluster of another run on this
        # machine has written its address where a plain ray.init() would look (/tmp/ray/ray_current_cluster).
        ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
        self.ray, self.starts = ray, self.starts + 1
        _warm_up(ray)
        return ray

    def stop(self) -> None:
        """Shut the instance down (if running); every Ray process gone within ``GONE_WITHIN_S`` (asserted)."""
        if self.ray is None:
            return
        ray, self.ray = self.ray, None
        ray.shutdown()
        if self._auth_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = self._auth_mode
        deadline = time.monotonic() + GONE_WITHIN_S
        left = ray_processes()
        while left and time.monotonic() < deadline:
            time.sleep(procutil.POLL_S)
            left = ray_processes()
        assert not left, f"Ray processes outlived ray.shutdown(): {left}"


#: The session's instance.
SHARED = SharedRay()


def _warm_up(ray) -> None:
    """Start and end one actor, so that what the driver keeps open for
    good after its first actor (a connection) exists before any test looks."""

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    probe = Probe.remote()
    pid = ray.get(probe.pid.remote(), timeout=120)
    ray.kill(probe, no_restart=True)
    procutil.wait_until_gone([pid], 30.0)
