"""The index sampler's batches for one pass, whose first batch a saved state
may need drawn ahead of time (resume mechanism 3, docs/architecture.md).

    iter(index_sampler) ──▶ [replay: a resumed sampler that cannot jump] ──▶ FirstDrawAhead ──▶ the pass's plan
                                                   ▲
    state_dict() before the first delivery ── draw_first()

A state saved before the epoch's first batch is delivered must name the
epoch's draw: a shuffle not yet drawn from the global generator would be
drawn anew, differently, after a resume. ``draw_first`` draws it then.

It may be called from a signal handler, which the main thread runs between
any two bytecodes: while the main thread is itself drawing that first batch,
or inside another handler's save that is waiting for it. So no caller ever
draws, and the main thread never holds the lock: the first draw runs in a
short-lived thread of its own, which takes the lock, and every caller (the
pass's ``next()``, a save, a handler's save nested in either) starts that
thread if none has started and waits for the draw's event. A handler waits
at most for the draw itself, never on a lock the code it interrupted holds.
Later draws take no lock: by then nothing else draws.
"""

from __future__ import annotations

import contextvars
import threading
from functools import partial
from typing import Any, Callable, Iterator, Optional

from ..sampler.replay import replay


class FirstDrawAhead:
    """The index sampler's batches; the first can be drawn ahead
    (``draw_first``: resume mechanism 3), from any thread or a signal handler. ``on_first(batch)``
    sees the first batch drawn (the pass's progress keeps its fingerprint)."""

    def __init__(self, batches: Iterator, on_first: Callable[[Any], None]):
        self._batches = batches
        self._on_first = on_first
        self._ahead: list = []
        self._error: Optional[BaseException] = None
        #: Held by the drawing thread only (a second one, started by a handler in the window
        #: below, finds the batch drawn).
        self._lock = threading.Lock()
        #: Set once the first batch is drawn (or the sampler raised), with on_first done.
        self._drawn = threading.Event()
        self._drawers: list[threading.Thread] = []

    def draw_first(self) -> None:
        """Draw the first batch now, if it was not drawn yet (in a thread of
        its own); if it is being drawn, wait for that draw."""
        if self._drawn.is_set():
            return
        if not self._drawers:
            context = contextvars.copy_context()  # (the sampler sees the caller's context variables)
            drawer = threading.Thread(target=context.run, args=(self._draw,), name="conveyor-first-draw", daemon=True)
            # Started before it is listed: a handler that runs in between starts a second, which
            # finds the batch drawn; listed first, the handler would wait for a thread not started.
            drawer.start()
            self._drawers.append(drawer)
        self._drawn.wait()

    def _draw(self) -> None:
        """The first draw, in a drawing thread; a failure is kept for the pass's next()."""
        with self._lock:
            if self._drawn.is_set():
                return
            try:
                for batch in self._batches:
                    self._ahead.append(batch)
                    self._on_first(batch)
                    break
            except BaseException as exc:  # (the sampler's own error: the pass's next() raises it)
                self._error = exc
            finally:
                self._drawn.set()

    def __iter__(self) -> "FirstDrawAhead":
        return self

    def __next__(self) -> Any:
        if self._drawers or not self._drawn.is_set():
            self.draw_first()
            for drawer in self._drawers:  # (they are leaving: nothing of the pass's draw outlives them)
                drawer.join()
            self._drawers.clear()
        error, self._error = self._error, None
        if error is not None:
            raise error
        if self._ahead:
            return self._ahead.pop()
        return next(self._batches)


class PassBatches:
    """Wires a pass's batches as the tracker begins it (``ResumeTracker.begin``'s
    ``prepare``): called with the pass's ``state.Start``, it makes
    ``batches``: a resumed sampler that cannot jump first replays the batches
    delivered before (resume mechanism 2); the first is drawn ahead when a
    state saved before the first delivery asks (``start.progress.draw_first``)."""

    def __init__(self, index_sampler: Any, sampler_text: str):
        self._sampler, self._text = index_sampler, sampler_text
        self.batches: Optional[FirstDrawAhead] = None

    def __call__(self, start: Any) -> None:
        progress, resume = start.progress, start.resume
        batches: Iterator = iter(self._sampler)
        if resume is not None and resume.sampler_skip:  # (resume mechanism 2: docs/architecture.md)
            batches = replay(batches, resume.sampler_skip, progress.first_batch, self._text)
        first = progress.position == 0  # (a resumed pass's progress stands where its state stood)
        self.batches = FirstDrawAhead(batches, partial(progress.note_first_draw, self._sampler, first=first))
        progress.draw_first = self.batches.draw_first
