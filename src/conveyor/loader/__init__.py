"""The DataLoader: its arguments, checked once, become a frozen plan; each
``iter()`` is one pass over that plan; persistent workers outlive a pass.

::

    DataLoader(arguments) ──_arguments: checked──▶ the loader's attributes
        ├─ _plan ─▶ Plan: loading │ running │ sampling │ delivering   (each pass, each state)
        └─ iter() ─▶ the pass's batches (_first_draw) ─▶ LoaderIterator (_iteration)
                     over its own executor, or the workers the loader keeps (_persistent)

* ``_dataloader``  the DataLoader class: construction, validation, ``iter()``, ``set_epoch``, state
* ``_arguments``   the checks of its arguments, each error naming the argument and the fix
* ``_plan_parts``  the Plan's parts
* ``_plan``        how a loader's arguments become its Plan (the modes, decided once)
* ``_iteration``   one pass: tasks ─▶ executor ─▶ delivery to the loop
* ``_first_draw``  the pass's batches: replayed, or their first drawn ahead for a saved state
* ``_persistent``  the workers a loader keeps between passes
"""

from ..sampler.samplers import _InfiniteConstantSampler as _InfiniteConstantSampler  # (where torch's dataloader has it)
from ._dataloader import DataLoader

__all__ = ["DataLoader"]
