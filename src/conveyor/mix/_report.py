"""What a mix has served by a position, per source: frozen records
(``Mix.report(position)``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["MixReport", "SourceReport"]


@dataclass(frozen=True)
class SourceReport:
    """One source over the mix's first ``position`` positions.

    ``served``: samples it gave (an int); ``target``: the samples its
    weights ask for there (float; the sum over blocks of share times
    positions); ``share`` and ``target_share``: those over ``position``
    (fractions in [0, 1]); ``epoch``: the epoch its next sample is in (0 is
    the first); ``in_epoch``: samples of that epoch served; ``length``: its
    samples per epoch."""

    name: str
    served: int
    target: float
    share: float
    target_share: float
    epoch: int
    in_epoch: int
    length: int


@dataclass(frozen=True)
class MixReport:
    """The mix's first ``position`` positions, one :class:`SourceReport`
    per source, in the mix's order of sources."""

    position: int
    sources: tuple[SourceReport, ...]

    def __getitem__(self, name: str) -> SourceReport:
        for source in self.sources:
            if source.name == name:
                return source
        raise KeyError(f"the mix has no source {name!r}; it has {[s.name for s in self.sources]}")

    def table(self, title: str = "") -> str:
        """One line per source: served, share against target, epoch; under
        ``title`` (default: ``mix after {position} positions:``)."""
        lines = [title or f"mix after {self.position} positions:"]
        for s in self.sources:
            lines.append(
                f"  {s.name:<16} {s.served:>12} served  share {100 * s.share:6.2f}% (target "
                f"{100 * s.target_share:6.2f}%)  epoch {s.epoch} ({s.in_epoch}/{s.length})"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """Plain values (``json.dumps`` takes it): ``position`` and one dict per source."""
        return {"position": self.position, "sources": [asdict(source) for source in self.sources]}
