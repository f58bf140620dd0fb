"""Noticing torch when a dataset imports it late, inside a worker.

A numpy-only worker does not import torch. A dataset that imports it in
``__getitem__`` still needs what a torch worker gets: torch's generator seeded
for the batch in hand, and ``torch.utils.data.get_worker_info()`` answered.
This finder runs a callback once torch has finished importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from typing import Any, Callable


class _AfterTorchImport(importlib.abc.MetaPathFinder):
    """Wraps the loader of the top-level ``torch`` package; calls ``callback``
    right after its module has executed, then steps out of the way."""

    def __init__(self, callback: Callable[[Any], None]):
        self._callback = callback

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module
        callback = self._callback

        def exec_module(module: Any) -> None:
            run_module(module)
            callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # (wrapped on this one loader, for this one module)
        return spec


def when_torch_loads(callback: Callable[[Any], None]) -> None:
    """Call ``callback(torch)`` now if torch is loaded, else once it is."""
    torch = sys.modules.get("torch")
    if torch is not None:
        callback(torch)
        return
    sys.meta_path.insert(0, _AfterTorchImport(callback))
