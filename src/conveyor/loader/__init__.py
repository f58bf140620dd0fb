"""The DataLoader: its arguments, checked once, become a frozen plan; each
``iter()`` is one pass over that plan; persistent workers outlive a pass.

::

    DataLoader(arguments) ──_arguments: checked──▶ the loader's attributes
        ├─ _plan() ─▶ Plan: loading │ running │ sampling │ delivering   (each pass, each state)
        ├─ iter() ─▶ the pass's batches (_first_draw) ─▶ LoaderIterator (_iteration)
        │            over its own executor, or the workers the loader keeps (PersistentWorkers)
        ├─ state_dict() / load_state_dict() ─▶ ResumeTracker (conveyor.state)
        └─ stats() / on_stats() / trace() ─▶ StatsRecorder (conveyor.stats)

* ``_dataloader``     the DataLoader class: construction, validation, ``iter()``, ``set_epoch``,
                      the workers it keeps between passes
* ``_arguments``      the checks of its arguments, each error naming the argument and the fix
* ``_plan``           the Plan: its parts, and how a loader's arguments become one (modes decided once)
* ``_iteration``      one pass: tasks ─▶ executor ─▶ delivery to the loop
* ``_first_draw``     the pass's batches: replayed, or their first drawn ahead for a saved state
* ``_state_methods``  ``state_dict`` and ``load_state_dict``, mixed into the DataLoader
* ``_stats_methods``  ``stats``, ``on_stats`` and ``trace``, mixed into the DataLoader
"""

import sys

from ..sampler.samplers import _InfiniteConstantSampler as _InfiniteConstantSampler  # (where torch's dataloader has it)
from . import _arguments, _dataloader, _dataset_epoch, _first_draw, _iteration, _plan
from ._dataloader import DataLoader

#: The modules' names before this package: a pickle names a class by its module
#: (``conveyor.persistent.PersistentWorkers``), so a loader pickled then loads through these aliases.
_FORMER_NAMES = {
    "conveyor.arguments": _arguments,
    "conveyor.plan": _plan,
    "conveyor.loader_plan": _plan,
    "conveyor.iteration": _iteration,
    "conveyor.persistent": _dataloader,
    "conveyor.first_draw": _first_draw,
    "conveyor.dataset_epoch": _dataset_epoch,
}
for _name, _module in _FORMER_NAMES.items():
    sys.modules.setdefault(_name, _module)

__all__ = ["DataLoader"]
