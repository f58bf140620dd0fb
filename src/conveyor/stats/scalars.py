"""Loader stats as scalars for a metrics writer: TensorBoard's
``SummaryWriter`` and anything else with ``add_scalar(tag, value, step)``.

    loader.on_stats(SummaryWriter("runs/x"), every_s=10)
      └─ stats_callback(writer) ──▶ ScalarWriter(writer) ──▶ writer.add_scalar("conveyor/...", value, batches)

Imports no writer package: the writer is the user's object.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Union

from .report import LoaderStats

__all__ = ["SCALARS", "ScalarWriter", "stats_callback"]

#: The LoaderStats fields written, each as ``<prefix>/<field>`` (see LoaderStats for units).
SCALARS = (
    "samples_per_s",
    "batches_per_s",
    "data_wait_fraction",
    "steady_wait_fraction",
    "workers_busy_fraction",
    "loading_cpu_fraction",
    "loading_cpu_wait_fraction",
    "loading_off_cpu_fraction",
    "cores_job_fraction",
    "cores_others_fraction",
    "cores_idle_fraction",
    "slots_in_use",
)


class MetricsWriter(Protocol):
    """What :class:`ScalarWriter` writes to: TensorBoard's ``SummaryWriter``,
    or any object with ``add_scalar(tag, value, step)``."""

    def add_scalar(self, tag: str, value: float, step: int, /) -> Any: ...


class ScalarWriter:
    """A stats callback that writes scalars to ``writer`` (anything with
    ``add_scalar(tag, value, global_step)``), stepped by the batches the
    loader has delivered so far.

    Each call writes the fields in :data:`SCALARS` and each stage's
    seconds (``<prefix>/stage_s/<stage>``), over the interval since the
    previous call (``LoaderStats.interval``; the totals on the first call).
    A figure that was not measured (None) is left out. ``writer.flush()``
    is called after each call when the writer has it.

    Example::

        from torch.utils.tensorboard import SummaryWriter
        loader.on_stats(SummaryWriter("runs/exp1"), every_s=10)   # on_stats wraps it in a ScalarWriter
    """

    def __init__(self, writer: MetricsWriter, prefix: str = "conveyor"):
        if not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(
                f"ScalarWriter needs a writer with add_scalar(tag, value, step), got {type(writer).__name__}"
            )
        self.writer = writer
        self.prefix = prefix

    def __call__(self, stats: LoaderStats) -> None:
        step = stats.batches
        for tag, value in self.scalars(stats.interval if stats.interval is not None else stats):
            self.writer.add_scalar(f"{self.prefix}/{tag}", value, step)
        flush = getattr(self.writer, "flush", None)
        if callable(flush):
            flush()

    @staticmethod
    def scalars(stats: LoaderStats) -> Iterator[tuple[str, float]]:
        """(tag, value) for each figure of ``stats`` that was measured."""
        for name in SCALARS:
            value = getattr(stats, name)
            if value is not None:
                yield name, float(value)
        for name, stage in stats.stages.items():
            yield f"stage_s/{name}", float(stage.total_s)


def stats_callback(target: Union[Callable[[LoaderStats], Any], MetricsWriter]) -> Callable[[LoaderStats], Any]:
    """What ``on_stats`` calls for ``target``: ``target`` itself when it is
    callable, a :class:`ScalarWriter` around it when it has ``add_scalar``."""
    if callable(target):
        return target
    if callable(getattr(target, "add_scalar", None)):
        return ScalarWriter(target)
    raise TypeError(
        f"on_stats needs a callable (called with LoaderStats) or a writer with add_scalar(tag, value, step) such as "
        f"TensorBoard's SummaryWriter, got {type(target).__name__}"
    )
