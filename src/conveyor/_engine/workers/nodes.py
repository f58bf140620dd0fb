"""Which node a batch was loaded on, told by the timing pid in its record.

    ray_actors ──remote_timing_pid(node id, address, worker id)──▶ a negative pid, its node named
    stats ─────node_of(timing pid)──▶ LOCAL, or "address (node 1a2b3c4d)"

A worker on this machine (a process, a thread, the main process, a Ray
actor on the training process's node) has this machine's pid, or 0 for the
main process: its node is ``LOCAL``. A Ray actor on another node has no pid
here, so it gets a negative one of its own per (node, worker id), for this
process's life, and the node it stands for is named once, when the actor
says where it runs. The names are the first 8 hex digits of Ray's node id
after the node's address: nodes on one machine share an address.
"""

from __future__ import annotations

import itertools

#: The node of every worker on this machine, the training process's.
LOCAL = "local"
#: The node of a worker on another node whose name is not known (not expected: Ray names each).
UNKNOWN_NODE = "another node"

_PIDS: dict[tuple[str, int], int] = {}
_NAMES: dict[int, str] = {}
_COUNT = itertools.count(1)


def remote_timing_pid(node_id: str, address: str, worker_id: int) -> int:
    """The timing pid of worker ``worker_id`` on the node ``node_id`` (at
    ``address``), another than this one: the same one each time it is asked."""
    pid = _PIDS.setdefault((node_id, worker_id), -next(_COUNT))
    _NAMES[pid] = f"{address} (node {node_id[:8]})"
    return pid


def node_of(timing_pid: int) -> str:
    """The node a batch with this timing pid was loaded on."""
    return LOCAL if timing_pid >= 0 else _NAMES.get(timing_pid, UNKNOWN_NODE)
