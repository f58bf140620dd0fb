"""Where a sampler's random draws come from, and the record that draws them again.

A class attribute ``_flavor`` (``"numpy"`` in the core, ``"torch"`` in
``conveyor.torch``) decides which global generator is used when
``generator=None``; a ``torch.Generator`` passed in is drawn from exactly as
torch does, so orders match torch's item for item. The generators themselves
are wrapped by :mod:`conveyor.rng`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from conveyor.rng import TorchSource, draw_seed, source_for

from .resumable import _Resumable


class _Draws:
    """The random source for one iteration, and a JSON record to draw it again.

    * ``generator`` given (numpy or torch Generator, or an int seed): that
      generator, used in place; record = its state before the first draw.
    * ``generator=None``, policy ``"reseed"`` (torch's RandomSampler): a fresh
      generator seeded from the global one of the flavour; record = the seed.
    * ``generator=None``, policy ``"global"`` (torch's SubsetRandomSampler and
      WeightedRandomSampler): torch's default generator itself, record = its
      state, replayed on a private copy. numpy has no global ``Generator``, so
      the numpy flavour reseeds instead.
    """

    def __init__(self, flavor: str, policy: str):
        self.flavor = flavor
        self.policy = policy
        self._for: Any = None
        self._source: Any = None
        #: A seed drawn ahead for the next iteration (see pin).
        self._pinned: Any = None

    def own(self, generator: Any) -> Any:
        if self._source is None or self._for is not generator:
            self._source = source_for(generator, self.flavor)
            self._for = generator
        return self._source

    def kind(self, generator: Any) -> str:
        if generator is None:
            return "global"
        return "torch" if isinstance(self.own(generator), TorchSource) else "numpy"

    def _reseeds(self, generator: Any) -> bool:
        return generator is None and not (self.policy == "global" and self.flavor == "torch")

    def begin(self, generator: Any) -> tuple[Any, Any]:
        if generator is not None:
            source = self.own(generator)
            return source, {"state": source.get_state()}
        if not self._reseeds(generator):
            import torch

            source = TorchSource(torch.default_generator)
            return source, {"state": source.get_state()}
        record, self._pinned = self._pinned, None
        seed = draw_seed(self.flavor) if record is None else int(record["seed"])
        return source_for(seed, self.flavor), {"seed": seed}

    def pin(self, generator: Any) -> None:
        """Draw the next iteration's seed from the global generator now, so
        that a state saved between iterations holds it (no-op when the draws
        come from a generator, whose state is saved anyway)."""
        if self._reseeds(generator) and self._pinned is None:
            self._pinned = {"seed": draw_seed(self.flavor)}

    def replay(self, generator: Any, record: Mapping[str, Any]) -> Any:
        if generator is not None:
            source = self.own(generator)
            source.set_state(record["state"])
            return source
        if "seed" in record:
            return source_for(int(record["seed"]), self.flavor)
        source = TorchSource.from_seed(0)
        source.set_state(record["state"])
        return source

    def record_problem(self, generator: Any, record: Any, in_iteration: bool) -> Optional[str]:
        """Why ``record`` (a state's ``rng``) cannot replay a draw for
        ``generator`` (None: it can), found without loading it: a record of
        the generator's state, tried on a scratch generator, or a seed."""
        if record is None and not in_iteration:
            return None  # (between iterations: nothing drawn ahead)
        if not isinstance(record, Mapping):
            return f"is {record!r}, where a record of the draw (a dict) belongs"
        if generator is not None:
            source = self.own(generator)
        elif self._reseeds(generator):
            seed = record.get("seed")
            ok = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 1 << 64
            return (
                None if ok else f"has seed {seed!r}, where a seed drawn by the sampler (an int in [0, 2**64)) belongs"
            )
        else:
            source = TorchSource.from_seed(0)
        if "state" not in record:
            return "lacks the generator's 'state'"
        problem = source.state_problem(record["state"])
        return None if problem is None else f"holds a 'state' that does not fit: {problem}"

    def idle_record(self, generator: Any) -> Any:
        if generator is None:
            return self._pinned
        return {"state": self.own(generator).get_state()}

    def restore_idle(self, generator: Any, record: Any) -> None:
        if generator is None:
            self._pinned = record if self._reseeds(generator) and isinstance(record, Mapping) else None
        elif record is not None:
            self.own(generator).set_state(record["state"])


class _DrawsFromGenerator(_Resumable):
    """A resumable sampler whose draws come from ``self.generator`` (see :class:`_Draws`)."""

    _flavor = "numpy"
    _none_policy = "global"
    generator: Any

    def _draws(self) -> _Draws:
        # Made on first use: subclasses set self.generator in their own __init__.
        draws = getattr(self, "_draws_cache", None)
        if draws is None:
            draws = self._draws_cache = _Draws(self._flavor, self._none_policy)
        return draws

    def _generator_settings(self) -> dict[str, Any]:
        return {"flavor": self._flavor, "generator": self._draws().kind(self.generator)}

    def _open(self, epoch: int, record: Any) -> tuple[Any, Any]:
        if record is None:
            return self._draws().begin(self.generator)
        return self._draws().replay(self.generator, record), record

    def _idle_record(self) -> Any:
        return self._draws().idle_record(self.generator)

    def _restore_idle(self, record: Any) -> None:
        self._draws().restore_idle(self.generator, record)

    def _record_problem(self, record: Any, in_iteration: bool) -> Optional[str]:
        return self._draws().record_problem(self.generator, record, in_iteration)

    def pin_next_draw(self) -> None:
        """Draw what the next iteration draws from the global generator now
        (its seed), so that a state saved between epochs holds it."""
        if getattr(self, "seed", None) is None:
            self._draws().pin(self.generator)
