"""Which ``Workers`` a pass uses, decided once from ``worker_method``: the
one place that names every kind.

    "inline" (num_workers=0)  ──▶ InlineWorkers     (inline.py: the calling thread)
    "thread"                  ──▶ ThreadWorkers     (threads.py: threads of this process)
    "ray"                     ──▶ RayActorWorkers   (ray_actors.py: Ray actors, anywhere on a cluster)
    a process start method    ──▶ WorkerPool        (pool.py: processes by fork, spawn or forkserver)
"""

from __future__ import annotations

from typing import Optional

from ...ray_options import RayWorkers
from .inline import InlineWorkers
from .pool import WorkerPool
from .protocol import Workers
from .ray_actors import RayActorWorkers
from .threads import ThreadWorkers


def workers_for(start_method: str, ray: Optional[RayWorkers] = None, stagger: bool = False) -> Workers:
    """The Workers that reach workers started this way: "inline" (num_workers=0),
    "thread", "ray" (actors asking for ``ray``'s resources), or a process start
    method (``stagger``: worker 0 first, the others once its first task is out)."""
    if start_method == "ray":
        return RayActorWorkers(ray)
    if start_method == "inline":
        return InlineWorkers()
    if start_method == "thread":
        return ThreadWorkers()
    return WorkerPool(start_method, stagger)


__all__ = ["workers_for"]
