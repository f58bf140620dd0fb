"""Weighted mixing of named sources, with a stateless order.

::

    Mix(sources, weights=, seed=, num_samples=, stop=)   a map-style dataset: position -> (source, index)
      └─ MixOrder  (_order)     position -> (source, its count before), per block of constant weights
           ├─ Blocks (_schedule) the weights over the positions: constant, steps, a function per block
           ├─ Shares (_shares)   weights checked, as exact fractions of a period
           └─ Period (_period)   one period scheduled so every prefix is within one sample per source
    MixReport (_report)          served against target, and the epoch, per source
    MixTally (_tally)            a loader pass's delivered samples per source (loader.stats().mix)
    IterableMix (_iterable)      streams mixed by the same map; its iterator saves where each stream stands

Public: ``Mix``, ``IterableMix``, ``MixReport``, ``SourceReport`` (``conveyor.Mix``,
``conveyor.IterableMix`` too).
"""

from ._dataset import STOPS, Mix
from ._iterable import IterableMix
from ._report import MixReport, SourceReport
from ._shares import MAX_PERIOD
from ._tally import MixTally

__all__ = ["Mix", "IterableMix", "MixReport", "MixTally", "SourceReport", "STOPS", "MAX_PERIOD"]
