"""Pinning batches in a background thread, as torch does with ``pin_memory=True``.

    executor.next_batch() ──▶ [pin thread: copy tensors to page-locked memory] ──▶ queue ──▶ __next__

The thread starts at the first ``next_batch``, once the caller's thread has
done ``first`` (the executor's ``send_first``: the first tasks out and the
workers forked, never from the pin thread). It is the executor's only
caller while it runs; the main thread only reads the queue, waking every
``_POLL_S`` to check the thread is alive, so it never waits forever on a
thread that died. Closing calls the thread's wait
off (``next_batch(until=stop)`` raises Interrupted) and waits for the thread
to leave before the executor is shut down (``close(then=...)``), so no two
threads are ever inside the executor.
"""

from __future__ import annotations

import enum
import queue
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..transport.tree import map_leaves
from .records import Interrupted

#: How often the main thread checks that the pin thread is alive while it waits.
_POLL_S = 0.1
#: How long closing waits for the pin thread to finish the batch in hand.
_JOIN_TIMEOUT_S = 5.0


class _Kind(enum.Enum):
    BATCH = "batch"  # value: the pinned batch (a Delivered record)
    END = "end"  # value: StopIteration's value
    ERROR = "error"  # value: the exception, raised in the main thread


@dataclass(frozen=True)
class _Item:
    kind: _Kind
    value: Any = None


def pin_tree(data: Any) -> Any:
    """Copy every torch tensor of a batch (and anything with ``pin_memory``)
    into pinned memory; keep the structure."""
    return map_leaves(data, _pin_leaf)


def _pin_leaf(value: Any) -> Any:
    pin = getattr(value, "pin_memory", None)
    return pin() if callable(pin) else value


class PinThread:
    """Runs ``next_batch`` and ``pin`` in a thread, ``capacity`` batches ahead."""

    def __init__(
        self,
        next_batch: Callable[[threading.Event], Any],
        capacity: int,
        pin: Callable[[Any], Any] = pin_tree,
        first: Optional[Callable[[], None]] = None,
    ):
        """``next_batch(until)``: the executor's, called off (Interrupted)
        once ``until`` is set. ``first``: what the caller's thread does at
        the first next_batch, before the thread starts (the executor's
        ``send_first``: the first tasks out and every worker forked from the
        caller's thread, never from this one)."""
        self._next_batch = next_batch
        self._first = first
        self._pin = pin
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, capacity))
        self._stop = threading.Event()
        #: Whether the thread is inside the executor's next_batch now, and
        #: what close() called from the thread itself left to do on leaving it.
        self._inside = False
        self._then: Optional[Callable[[], None]] = None
        self._thread = threading.Thread(target=self._run, name="conveyor-pin-memory", daemon=True)
        if first is None:
            self._thread.start()

    def _put(self, item: _Item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _next_from_executor(self) -> Any:
        self._inside = True
        try:
            return self._next_batch(self._stop)
        finally:
            self._inside = False
            then, self._then = self._then, None
            if then is not None:
                then()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                item = _Item(_Kind.BATCH, self._pin(self._next_from_executor()))
            except Interrupted:
                return
            except StopIteration as end:
                self._put(_Item(_Kind.END, end.value))
                return
            except BaseException as exc:  # carried to the main thread, raised there
                self._put(_Item(_Kind.ERROR, exc))
                if not isinstance(exc, Exception):
                    return
                continue
            if not self._put(item):
                return

    def next_batch(self) -> Any:
        """The next pinned batch; StopIteration at the end; the loader's errors
        re-raised here."""
        if self._first is not None:
            self._start()
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._thread.is_alive():
                    continue
                if self._stop.is_set():
                    raise _closed_error() from None
                raise RuntimeError("the pin-memory thread ended without a result (conveyor bug: please report)")
            if item.kind is _Kind.BATCH:
                return item.value
            if item.kind is _Kind.END:
                raise StopIteration(item.value)
            raise item.value

    def _start(self) -> None:
        """The first call: ``first`` in this thread, then the pin thread."""
        if self._stop.is_set():
            raise _closed_error()
        first, self._first = self._first, None
        assert first is not None  # (called while it is set)
        try:
            first()
        except BaseException:
            self._first = first  # (the next call tries again, as the executor's next_batch would)
            raise
        self._thread.start()

    def close(self, then: Optional[Callable[[], None]] = None) -> None:
        """Stop the thread (its wait called off, the batch in hand finished),
        wait for it, then call ``then`` (the executor's shutdown) with the
        thread out of the executor. Called from the thread itself (a
        finalizer run by a garbage collection there), ``then`` runs once the
        thread has left the executor's next_batch. Safe to call twice."""
        self._stop.set()
        if self._thread is threading.current_thread():
            if self._inside:
                self._then = then
            elif then is not None:
                then()
            return
        if self._thread.is_alive():  # (not started when no batch was asked for)
            self._thread.join(_JOIN_TIMEOUT_S)
        if then is not None:
            then()  # (after _JOIN_TIMEOUT_S with the thread still in pin(): stopping beats leaking)


def _closed_error() -> RuntimeError:
    return RuntimeError(
        "this DataLoader iterator has been shut down (with persistent_workers=True, a later iter(loader) takes "
        "the workers over); go on with the newest iterator"
    )


def pinning(pin_memory_device: str) -> bool:
    """Whether batches asked to be pinned will be (``pin_memory=True``; the
    warnings point at the caller of ``iter(loader)``, three frames up):
    warns, as torch does once per iterator, when ``pin_memory_device`` is
    given (deprecated: the current accelerator is used) or when there is no
    accelerator to pin for (then nothing is pinned)."""
    if pin_memory_device:
        warnings.warn(
            "pin_memory_device is deprecated, the current accelerator will be used as the device,"
            f"ignore pin_memory_device='{pin_memory_device}'.",
            stacklevel=4,
        )
    if not accelerator_available():
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found, then device pinned "
            "memory won't be used.",
            stacklevel=4,
        )
        return False
    return True


def accelerator_available() -> bool:
    """Whether torch (if loaded) sees an accelerator to pin memory for."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())
