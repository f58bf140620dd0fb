"""A local Ray instance for the tests of Ray actor workers, started once per
module and shut down after it, with nothing of Ray's left running.

Its CPUs are declared, not this machine's: three workers of one CPU each
fit on a two-core machine (they wait on the cores as processes would).
"""

from __future__ import annotations

import os
import time

import pytest

import procutil

#: Ray's own processes (its servers and its idle workers): none may outlive a module.
RAY_PROCESS_NAMES = ("raylet", "gcs_server", "ray::", "default_worker.py", "dashboard", "log_monitor", "monitor.py")
#: Declared CPUs of the local instance.
CPUS = 4


def ray_processes() -> dict[int, str]:
    """This process's descendants that are Ray's, with their command lines."""
    found = {}
    for pid in procutil.descendants():
        line = procutil.cmdline(pid)
        if any(name in line for name in RAY_PROCESS_NAMES):
            found[pid] = line
    return found


@pytest.fixture(scope="module")
def local_ray():
    """``ray`` connected to a fresh local instance; shut down afterwards,
    and every Ray process gone within 30 s (asserted)."""
    ray = pytest.importorskip("ray")
    auth_mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # (a local instance for tests: no tokens)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        _warm_up(ray)
        yield ray
    finally:
        ray.shutdown()
        if auth_mode is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_mode
        deadline = time.monotonic() + 30.0
        left = ray_processes()
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = ray_processes()
        assert not left, f"Ray processes outlived ray.shutdown(): {left}"


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
