"""``conveyor.RayWorkers``: where and how the loading workers run as Ray
actors (``DataLoader(..., worker_method=RayWorkers(...))``; the plain
``worker_method="ray"`` is ``RayWorkers()``).

Only the loading workers go to the cluster; the training process keeps the
sampler, the plan, the reorder and delivery, so the batches are those of
local worker processes for the same seed (docs/scale-out.md). Ray itself is
imported only when the workers start (``pip install conveyor[ray]``).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["RayWorkers"]

#: The scheduling strategies Ray names by a string.
_NAMED_STRATEGIES = ("DEFAULT", "SPREAD")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class RayWorkers:
    """Loading workers as Ray actors, one per worker (``num_workers`` of them).

    * ``num_cpus``: CPUs each actor reserves on its node (default 1; a
      fraction packs several on one CPU).
    * ``resources``: custom Ray resources each actor needs, e.g.
      ``{"cpu_node": 1}`` where only CPU nodes were started with
      ``--resources='{"cpu_node": 64}'``: the way to keep workers off the
      GPU node.
    * ``scheduling_strategy``: ``"DEFAULT"``, ``"SPREAD"`` (one actor per
      node in turn) or a strategy object from
      ``ray.util.scheduling_strategies`` (``NodeAffinitySchedulingStrategy``,
      ``NodeLabelSchedulingStrategy``, a placement group's).
    * ``restart_lost``: how many times in all a lost worker (its actor
      killed, its node gone) is started again on the cluster and given the
      batches it had in hand, which it loads again, the same as before
      (a batch is a function of the seed and its indices). 0 (default): a
      lost worker ends the pass with ``WorkerDiedError``, as a dead worker
      process does. Map-style datasets only: an iterable dataset's copy
      cannot be put back where the lost one stood.
    * ``writable``: True (default): the arrays Ray's object store hands out
      read-only are copied once in the training process, so a batch can be
      written as a local worker's can. False: the batch's arrays are the
      store's own, read without a copy on the same node, and read-only
      (torch warns when it makes tensors of them).
    * ``start_timeout``: seconds an actor may take to be placed and set up
      (a cluster without the CPUs or resources asked for never places it);
      past that the pass fails naming the worker and what it asked for.

    Example::

        >>> from conveyor import DataLoader, RayWorkers
        >>> options = RayWorkers(num_cpus=2, scheduling_strategy="SPREAD")
        >>> options.num_cpus
        2
    """

    num_cpus: float = 1
    resources: Mapping[str, float] = field(default_factory=dict)
    scheduling_strategy: Optional[Any] = None
    restart_lost: int = 0
    start_timeout: float = 300.0
    writable: bool = True

    def __post_init__(self) -> None:
        if not _is_number(self.num_cpus) or not self.num_cpus >= 0:
            raise ValueError(
                f"RayWorkers(num_cpus=) must be a number of CPUs per worker, 0 or more (e.g. 1 or 0.5), "
                f"got {self.num_cpus!r}"
            )
        if not isinstance(self.resources, Mapping):
            raise TypeError(
                f"RayWorkers(resources=) must be a dict of Ray resource names to amounts, e.g. "
                f"{{'cpu_node': 1}}, got {type(self.resources).__name__}"
            )
        for name, amount in self.resources.items():
            if not isinstance(name, str) or not _is_number(amount) or not amount >= 0:
                raise ValueError(
                    f"RayWorkers(resources=) maps resource names (str) to amounts (numbers, 0 or more); "
                    f"got {name!r}: {amount!r}"
                )
            if name in ("CPU", "GPU", "memory"):
                raise ValueError(
                    f"RayWorkers(resources=) holds custom resources only; {name!r} has its own option in Ray "
                    f"(use num_cpus= for CPUs; loading workers take no GPU)"
                )
        object.__setattr__(self, "resources", dict(self.resources))
        _check_strategy(self.scheduling_strategy)
        if (
            not isinstance(self.restart_lost, numbers.Integral)
            or isinstance(self.restart_lost, bool)
            or self.restart_lost < 0
        ):
            raise ValueError(
                f"RayWorkers(restart_lost=) is how many times in all a lost worker is started again: an int, "
                f"0 or more, got {self.restart_lost!r}"
            )
        if not isinstance(self.writable, bool):
            raise TypeError(f"RayWorkers(writable=) must be True or False, got {self.writable!r}")
        if not _is_number(self.start_timeout) or not self.start_timeout > 0:
            raise ValueError(
                f"RayWorkers(start_timeout=) is the seconds an actor may take to start: a number over 0, "
                f"got {self.start_timeout!r}"
            )

    def actor_options(self) -> dict:
        """The options each worker's actor is created with (``.options(**...)``)."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "max_restarts": 0, "max_task_retries": 0}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.scheduling_strategy is not None:
            options["scheduling_strategy"] = self.scheduling_strategy
        return options

    def describe(self) -> str:
        """What each actor asks for, for messages."""
        parts = [f"num_cpus={self.num_cpus}"]
        if self.resources:
            parts.append(f"resources={dict(self.resources)}")
        if self.scheduling_strategy is not None:
            parts.append(f"scheduling_strategy={self.scheduling_strategy!r}")
        return ", ".join(parts)


def _check_strategy(strategy: Any) -> None:
    if strategy is None:
        return
    if isinstance(strategy, str):
        if strategy not in _NAMED_STRATEGIES:
            raise ValueError(
                f"RayWorkers(scheduling_strategy=) must be one of {_NAMED_STRATEGIES!r} or a strategy object "
                f"from ray.util.scheduling_strategies, got {strategy!r}"
            )
        return
    if not type(strategy).__module__.startswith("ray.util.scheduling_strategies"):
        raise TypeError(
            f"RayWorkers(scheduling_strategy=) must be {' or '.join(map(repr, _NAMED_STRATEGIES))} or a strategy "
            f"object from ray.util.scheduling_strategies (e.g. NodeAffinitySchedulingStrategy(node_id, soft=False)), "
            f"got {type(strategy).__name__}"
        )


def ray_workers_of(worker_method: Any) -> Optional[RayWorkers]:
    """The Ray options a ``worker_method`` means (None: not Ray)."""
    if isinstance(worker_method, RayWorkers):
        return worker_method
    if isinstance(worker_method, str) and worker_method == "ray":
        return RayWorkers()
    return None
