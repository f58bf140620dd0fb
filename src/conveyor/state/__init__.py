"""The loader's resumable state: one owner, one typed record, one encoding, its checks.

::

    DataLoader ──its Plan────▶ ResumeTracker ──save──▶ LoaderState ──to_dict()──▶ {version, kind, ..., checksum}
                                             ◀─load── LoaderState.from_dict (upgraded, then checked) ◀── dict

* ``_tracker``   ``ResumeTracker``: the epoch count, the latest iteration's progress, a loaded resume point
* ``_progress``  one pass's records: ``EpochProgress`` (what it delivered), ``ResumePoint``, ``Start``
* ``_records``   ``LoaderState`` and ``ReplayPoint``: the state, one typed field per key; the one decoding
* ``_encoding``  the layout: version, keys, checksum, and the upgrade of earlier layouts
* ``_checks``    every check a state passes before anything of it is loaded (header, settings, fields)
* ``_apply``     loading a checked state into the sampler, the generator and the dataset, undone on failure
* ``_settings``  what the state reads of a loader's plan: the settings a state records, its generator
* ``_stateful``  the ``Stateful`` protocol (``state_dict`` / ``load_state_dict``)

Public: ``Stateful`` (also ``conveyor.Stateful``). The rest is the loader's
machinery, named here for the loader and the tests.
"""

import sys as _sys

from . import _apply, _checks, _encoding, _progress, _records, _stateful

# The names marked F401 are not in __all__: the module conveyor/state.py that
# this package replaced exposed them, and they keep working from here.
from ._apply import apply_parts, generator_state, undone_on_failure, warn_fast_forward  # noqa: F401
from ._encoding import STATE_VERSION, upgrade  # noqa: F401
from ._progress import EpochProgress, ResumePoint, Start, positioned  # noqa: F401
from ._records import Copies, LoaderState, ReplayPoint  # noqa: F401
from ._settings import settings  # noqa: F401
from ._stateful import Stateful, is_stateful  # noqa: F401
from ._tracker import ResumeTracker

#: The modules' names before this package: a pickle names a class by its module
#: (``conveyor.epoch_progress.EpochProgress``), so a loader pickled then loads through these aliases.
_FORMER_NAMES = {
    "conveyor.epoch_progress": _progress,
    "conveyor.state_records": _records,
    "conveyor.state_apply": _apply,
    "conveyor.state_checks": _checks,
    "conveyor.state_format": _encoding,
    "conveyor.state_upgrade": _encoding,
    "conveyor.stateful": _stateful,
}
for _name, _module in _FORMER_NAMES.items():
    _sys.modules.setdefault(_name, _module)

__all__ = ["Stateful", "STATE_VERSION", "ResumeTracker", "EpochProgress", "ResumePoint", "Start"]
