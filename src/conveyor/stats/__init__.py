"""Where a loader's time goes: per-stage stats, a verdict, live views, a trace.

    loader.stats()                 LoaderStats: totals, percentiles, rates (report.py)
    loader.stats().summary()       a table and a Verdict (verdict.py)
    DataLoader(progress=True)      a live tqdm bar (live.py)
    loader.on_stats(fn, every_s)   fn(LoaderStats) every few seconds, e.g. JsonLinesWriter
    with loader.trace(path): ...   a Chrome-trace timeline of every batch (trace.py)

Each batch's record (``Delivered.timings``, made by the executors) feeds one
:class:`StatsRecorder` per loader (recorder.py).
"""

from .live import JsonLinesWriter, ProgressBar
from .recorder import StatsRecorder
from .report import LOADING_STAGES, STAGE_MEANINGS, STAGES, LoaderStats, StageStats
from .trace import ChromeTrace
from .verdict import Verdict

__all__ = [
    "ChromeTrace",
    "JsonLinesWriter",
    "LOADING_STAGES",
    "LoaderStats",
    "ProgressBar",
    "STAGES",
    "STAGE_MEANINGS",
    "StageStats",
    "StatsRecorder",
    "Verdict",
]
