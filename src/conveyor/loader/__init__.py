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

from ..sampler.samplers import _InfiniteConstantSampler as _InfiniteConstantSampler  # (where torch's dataloader has it)
from ._dataloader import DataLoader

__all__ = ["DataLoader"]
