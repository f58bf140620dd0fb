"""``MODULE:FACTORY`` on the command line (``conveyor tune``, ``conveyor pack``):
the function a user names, imported as ``python -m`` would import it."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


class FactoryError(Exception):
    """A FACTORY that cannot be found or used: printed without traceback, exit status 2."""


def load_factory(spec: str, returns: str = "a dataset or a DataLoader") -> Callable[[], Any]:
    """``module:name`` or ``path/to/file.py:name`` -> the callable; FactoryError when it cannot be found."""
    where, colon, name = spec.rpartition(":")  # rpartition: a Windows path has a colon of its own
    if not colon or not where or not name:
        raise FactoryError(
            f"expected MODULE:FACTORY (e.g. mypkg.data:make_dataset or path/to/file.py:make), got {spec!r}"
        )
    if where.endswith(".py") or "/" in where or os.sep in where:
        module = _import_file(Path(where))
    else:
        if os.getcwd() not in sys.path:  # as with `python -m`: modules in the current folder import
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            if exc.name is None or not (where == exc.name or where.startswith(exc.name + ".")):
                raise  # the module imports something missing: its own traceback says what
            raise FactoryError(
                f"cannot import {where!r}: no module named {exc.name!r} in this folder or on sys.path "
                f"(run from the folder that holds it, or pass path/to/file.py:{name})"
            ) from None
    factory = getattr(module, name, None)
    if factory is None:
        raise FactoryError(f"module {where!r} has no attribute {name!r}")
    if not callable(factory):
        raise FactoryError(f"{spec} is a {type(factory).__name__}, not a function returning {returns}")
    return factory


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise FactoryError(f"no such file: {path}")
    path = path.resolve()
    # Its folder on sys.path and its stem as its name, so that spawn and
    # forkserver workers (given this sys.path) import it by reference.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name, existing = path.stem, sys.modules.get(path.stem)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        return existing
    if existing is not None:  # the stem names another module: leave that one alone
        name = f"_conveyor_factory_{name}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FactoryError(f"cannot import {path}: Python imports files named *.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
