"""Where a loader's time goes: per-stage stats, a verdict, live views, a trace.

    loader.stats()                 LoaderStats: totals, percentiles, rates (report.py, figures.py)
    loader.stats().summary()       prints a table (table.py) and a Verdict (verdict.py), once
    loader.stats().to_dict()       the shares and the raw totals they are made of (JSON)
    DataLoader(progress=True)      a live tqdm bar (live.py)
    loader.on_stats(fn, every_s)   fn(LoaderStats) every few seconds, e.g. JsonLinesWriter, or a
                                   TensorBoard SummaryWriter (ScalarWriter, scalars.py)
    with loader.trace(path): ...   a Chrome-trace timeline of every batch (trace.py)

Each batch's record (``Delivered.timings``, made by the executors) feeds one
:class:`StatsRecorder` per loader (recorder.py): the loading threads' own
figures are summed in loading.py, per worker and node in workers.py, who
used the cores in machine.py.
"""

from .figures import LOADING_STAGES, STAGE_MEANINGS, STAGES, StageStats
from .live import JsonLinesWriter, ProgressBar
from .recorder import StatsRecorder
from .report import LoaderStats
from .scalars import ScalarWriter
from .trace import ChromeTrace
from .verdict import Verdict
from .workers import NodeStats, WorkerStats

__all__ = [
    "ChromeTrace",
    "JsonLinesWriter",
    "LOADING_STAGES",
    "LoaderStats",
    "NodeStats",
    "ProgressBar",
    "ScalarWriter",
    "STAGES",
    "STAGE_MEANINGS",
    "StageStats",
    "StatsRecorder",
    "Verdict",
    "WorkerStats",
]
