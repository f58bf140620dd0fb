"""Pickling across the process boundary: what a worker receives, what it sends back.

    main ──dumps (cloudpickle: the script's classes by value)──▶ worker
    main ◀──pack_result (plain pickle; the script's classes by name)── worker

Under spawn and forkserver the dataset, ``collate_fn`` and ``worker_init_fn``
travel to workers cloudpickled. When that fails, the user needs the attribute
path of the culprit (``dataset.handle`` → ``_thread.lock``), not a bare
"cannot pickle '_thread.lock' object" from deep inside pickle.

Results come back with plain pickle, which sends each class by name. A class
of the user's script (``__main__``) then has no name in a spawn or forkserver
worker: the worker's copy was rebuilt by value, and the worker's ``__main__``
is not the script (spawn) or holds another copy (forkserver). Such a class
is sent as the name :func:`script_object` looks up in the main process's
``__main__``, so the user gets instances of the script's own class, as from
torch's workers (which run the script again).
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import sys
import types
from collections import ChainMap
from multiprocessing.reduction import ForkingPickler
from typing import Any, Iterator, Optional

import cloudpickle

from .wire import pack


class SpawnFds:
    """Stands for multiprocessing's spawn launcher while conveyor pickles
    what a spawn worker receives: multiprocessing's own objects (a Lock, a
    Value, an Event in a dataset) pickle only while a child is being
    started, and the descriptors they share are collected in ``fds``, to be
    passed to the child under the same numbers."""

    def __init__(self) -> None:
        self.fds: list[int] = []

    def duplicate_for_child(self, fd: int) -> int:
        self.fds.append(fd)
        return fd

    @property
    def DupFd(self) -> Any:  # noqa: N802  (multiprocessing's name)
        from multiprocessing.popen_spawn_posix import _DupFd

        return _DupFd


@contextlib.contextmanager
def starting_a_child(launcher: Any) -> Iterator[Any]:
    """Pickle as multiprocessing does while it starts a child with ``launcher``."""
    from multiprocessing import context

    previous = context.get_spawning_popen()
    context.set_spawning_popen(launcher)
    try:
        yield launcher
    finally:
        context.set_spawning_popen(previous)


#: How deep to look for the culprit; deep enough for datasets wrapping datasets.
_MAX_DEPTH = 8


class _WorkerPickler(cloudpickle.CloudPickler):
    """cloudpickle (by value for what is defined in ``__main__``, a notebook
    or a lambda) with the reducers multiprocessing registers for its own
    objects (the shared memory of a Value, connections, sockets)."""

    # (multiprocessing keeps its reducers in a private table: the one place they are)
    dispatch_table = ChainMap(ForkingPickler._extra_reducers, cloudpickle.CloudPickler.dispatch_table)  # type: ignore[attr-defined]


def dumps(obj: Any) -> bytes:
    """``obj`` pickled for a worker (see _WorkerPickler). Call it inside
    :func:`starting_a_child` when ``obj`` may hold multiprocessing objects."""
    buffer = io.BytesIO()
    _WorkerPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _dumps(obj: Any) -> None:
    with starting_a_child(SpawnFds()):  # (multiprocessing's objects pickle for a child only)
        dumps(obj)


def _children(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"{path}[{key!r}]", value
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for i, value in enumerate(obj):
            yield f"{path}[{i}]", value
        return
    if isinstance(obj, functools.partial):
        yield f"{path}.func", obj.func
        for i, value in enumerate(obj.args):
            yield f"{path}.args[{i}]", value
        for key, value in obj.keywords.items():
            yield f"{path}.keywords[{key!r}]", value
        return
    if hasattr(obj, "__self__") and not isinstance(obj, type):
        yield f"{path}.__self__", obj.__self__
    closure = getattr(obj, "__closure__", None)
    if closure:
        names = obj.__code__.co_freevars
        for name, cell in zip(names, closure):
            try:
                yield f"{path}.<closure {name}>", cell.cell_contents
            except ValueError:
                continue
    state = getattr(obj, "__dict__", None)
    if isinstance(state, dict) and not isinstance(obj, type):
        for key, value in state.items():
            yield f"{path}.{key}", value
    for slot in getattr(type(obj), "__slots__", ()):
        if isinstance(slot, str) and hasattr(obj, slot):
            yield f"{path}.{slot}", getattr(obj, slot)


def find_unpicklable(obj: Any, path: str, depth: int = 0) -> Optional[tuple[str, Any]]:
    """The deepest ``(path, object)`` under ``obj`` that fails to pickle,
    or ``None`` when ``obj`` pickles."""
    try:
        _dumps(obj)
        return None
    except Exception:
        pass
    if depth < _MAX_DEPTH:
        for child_path, child in _children(obj, path):
            found = find_unpicklable(child, child_path, depth + 1)
            if found is not None:
                return found
    return path, obj


def check_picklable(named: dict[str, Any], start_method: str) -> None:
    """Raise, naming the culprit's path and type, if anything in ``named``
    cannot be sent to a worker started with ``start_method``."""
    for name, obj in named.items():
        try:
            _dumps(obj)
            continue
        except Exception as exc:
            original = exc
        path, culprit = find_unpicklable(obj, name) or (name, obj)
        kind = f"{type(culprit).__module__}.{type(culprit).__qualname__}"
        message = (
            f"{original} (conveyor: cannot send {name} to worker processes started with "
            f"{start_method!r}: {path} is a {kind}, which cannot be pickled. Open such resources "
            f"lazily inside the worker (in __getitem__/__iter__ or worker_init_fn), leave them out "
            f"of the pickled state with __getstate__/__setstate__, or use "
            f"multiprocessing_context='fork'.)"
        )
        error_type = (
            type(original) if isinstance(original, (TypeError, pickle.PicklingError, AttributeError)) else TypeError
        )
        try:
            err = error_type(message)
        except Exception:
            err = TypeError(message)
        raise err from original


# ------------------------------------------------------------------ results
def _lookup(qualname: str) -> Any:
    """What this process's ``__main__`` holds under ``qualname`` (dotted for
    a nested class); raises AttributeError when nothing does."""
    found: Any = sys.modules["__main__"]
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def script_object(qualname: str) -> Any:
    """The class (or function) of the script named ``qualname``: what a
    worker's result names in place of its copy (see :func:`pack_result`),
    found in the main process's ``__main__``."""
    try:
        return _lookup(qualname)
    except AttributeError:
        raise AttributeError(
            f"conveyor: a worker's result holds {qualname!r}, defined in the script (__main__), and the "
            f"script has no {qualname!r} at its top level. Give the class the name it is assigned to "
            f"(collections.namedtuple({qualname.rpartition('.')[2]!r}, ...) assigned to "
            f"{qualname.rpartition('.')[2]}), define it at the top level of the script, or move it to a module."
        ) from None


class _ScriptClassPickler(pickle.Pickler):
    """Plain pickle, except that a class or function of ``__main__`` that
    this process's ``__main__`` does not hold under its name is sent as
    that name (:func:`script_object`); ``named`` says whether one was."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.named = False

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            qualname = getattr(obj, "__qualname__", "")
            if isinstance(qualname, str) and qualname and "<" not in qualname:  # (no lambda, no local class)
                try:
                    found = _lookup(qualname) is obj
                except Exception:  # (nothing under that name; or a module __getattr__ of the script's that raises)
                    found = False
                if not found:
                    self.named = True
                    return script_object, (qualname,)
        return NotImplemented


#: Whether this process has sent a class of the script by name: its later
#: results go straight to _ScriptClassPickler (the script's batches hold one).
_script_classes_sent = False


def pack_result(message: Any) -> bytes:
    """``message`` pickled for the main process (a worker's result), as
    :func:`wire.pack` does; classes of the user's script that this worker
    cannot send by reference travel by name. Raises what pickling raises
    (a leaf that cannot be pickled)."""
    global _script_classes_sent
    if not _script_classes_sent:
        try:
            return pack(message)  # (the hot path: every result of a worker that never met a script class)
        except Exception:
            pass  # (again below, where a script class can be the reason; else that raises the same error)
    buffer = io.BytesIO()
    pickler = _ScriptClassPickler(buffer)
    pickler.dump(message)
    if pickler.named:
        _script_classes_sent = True
    return buffer.getvalue()
