"""The executor's view of one Ray actor worker (a workers.WorkerView):
the actor, what it was sent, where it runs, and how it was lost.
RayActorWorkers (ray_actors.py) keeps one per worker id."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional

from ..transport.messages import Task
from .protocol import task_of_epoch


@dataclass(eq=False)
class RayHandle:
    """The executor's view of one Ray actor worker (a workers.WorkerView)."""

    id: int
    actor: Any = None
    outstanding: deque = field(default_factory=deque)
    active: bool = True
    exited: bool = False
    busy_since: float = 0.0
    ready: bool = False
    #: (Task, ObjectRef) sent and not answered yet, in the order sent.
    calls: deque = field(default_factory=deque)
    #: The ref of its set-up until it answers, and by when it must.
    setting_up: Any = None
    start_by: float = 0.0
    process_id: int = 0
    node_id: str = ""
    node_address: str = ""
    #: On the training process's node: its pid and clock are this machine's.
    on_this_node: bool = True
    remote_pid: int = 0  # (its timing pid on another node)
    #: How it was lost, in Ray's words ("" while it runs).
    lost: str = ""
    #: Started again in place of a lost actor (its Ready is not news to the executor).
    restarted: bool = False

    @property
    def pid(self) -> int:
        return self.process_id

    @property
    def timing_ids(self) -> tuple[int, int]:
        """(worker id, pid); on another node no pid here, but a negative one of its own per node (nodes.py):
        the stats skip it when they read this machine's processes, and the trace gives it a lane of its own."""
        return self.id, self.process_id if self.on_this_node else self.remote_pid

    def current(self, epoch_id: int) -> Optional[Task]:
        return task_of_epoch(self.outstanding, epoch_id)

    def where(self) -> str:
        if not self.node_id:
            return "Ray actor, not placed yet"
        return f"Ray actor, pid {self.process_id} on node {self.node_address} (node id {self.node_id})"

    def describe(self) -> str:
        return f"worker {self.id} ({self.where()})"

    def stack_text(self) -> str:
        return ""
