"""The modules' names before conveyor's loader, state and dataset packages.

A pickle names a class by its module (``conveyor.persistent.PersistentWorkers``,
``conveyor.dataset_views.Subset``), so a loader or dataset pickled before the
move must still load. Each package registers its former names when it is
imported (its ``_FORMER_NAMES``); a former name imported before its package
(``pickle.loads`` of such a pickle in a fresh process, or ``import
conveyor.plan``) is found here: the package is imported, and the module it
registered under that name is the one returned.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["HOMES", "install"]

#: Former module name -> the package that registers it.
HOMES = {
    "conveyor.arguments": "conveyor.loader",
    "conveyor.plan": "conveyor.loader",
    "conveyor.loader_plan": "conveyor.loader",
    "conveyor.iteration": "conveyor.loader",
    "conveyor.persistent": "conveyor.loader",
    "conveyor.first_draw": "conveyor.loader",
    "conveyor.dataset_epoch": "conveyor.loader",
    "conveyor.epoch_progress": "conveyor.state",
    "conveyor.state_records": "conveyor.state",
    "conveyor.state_apply": "conveyor.state",
    "conveyor.state_checks": "conveyor.state",
    "conveyor.state_format": "conveyor.state",
    "conveyor.state_upgrade": "conveyor.state",
    "conveyor.stateful": "conveyor.state",
    "conveyor.dataset_protocol": "conveyor.dataset",
    "conveyor.dataset_views": "conveyor.dataset",
    "conveyor.splits": "conveyor.dataset",
    "conveyor.sharding": "conveyor.dataset",
    "conveyor.compact": "conveyor.dataset",
}


class _FormerNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a former name by importing its package (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in HOMES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        importlib.import_module(HOMES[spec.name])  # (it registers spec.name in sys.modules)
        return sys.modules[spec.name]

    def exec_module(self, module: ModuleType) -> None:
        """Nothing: the module is its package's, already run."""


_finder = _FormerNames()


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if _finder not in sys.meta_path:
        sys.meta_path.append(_finder)
