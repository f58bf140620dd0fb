"""The stats as a person reads them: a text table (``summary()``, ``str(stats)``)
and the same as HTML (a notebook's view of ``loader.stats()``).

    LoaderFigures ──text_table()──▶ the stage table, then one line per split whole, per node and per worker
                  ──html_table()──▶ <table> of the stages, the same lines, the verdict

Each line below the table shows one whole and the shares it splits into,
so the shares on a line add up to 100% (up to rounding to whole percents).
With more than one worker or node, a line per node follows, and a line per
worker when there are at most ``MAX_WORKER_LINES`` of them.
"""

from __future__ import annotations

import html
from typing import Optional

from .figures import LOADING_STAGES, NOT_MEASURED, STAGES, LoaderFigures
from .verdict import judge

#: Workers listed one per line at most (more: the nodes' lines only, and ``stats.workers``).
MAX_WORKER_LINES = 8


def _share_column(stats: LoaderFigures, name: str) -> str:
    """The stage's share: of the loading time, or (wait, compute) of wall time."""
    if name in LOADING_STAGES:
        return f"{stats.stage_share(name):.1%}"
    if name in ("wait", "compute") and stats.wall_s > 0:
        return f"{min(1.0, stats.stages[name].total_s / stats.wall_s):.1%}"
    return ""


def _parts(*parts: tuple[str, Optional[float]]) -> str:
    return " · ".join(f"{name} {share:.0%}" for name, share in parts if share is not None)


def share_lines(stats: LoaderFigures) -> list[str]:
    """One line per whole the stats split: wall time, loading time, the cores."""
    lines = [f"wall time: {_parts(('data wait', stats.data_wait_fraction), ('compute', _compute_share(stats)))}"]
    if stats.workers_busy_fraction is not None:
        who = f"the {stats.num_workers} workers' time" if stats.num_workers else "wall time, in the main process"
        lines[-1] += f"; {who}: loading {stats.workers_busy_fraction:.0%}"
    cpu = stats.loading_cpu_fraction
    measured = stats.cpu_measured_batches
    head = f"loading time of {measured:,} measured batch{'es' if measured != 1 else ''}"
    if cpu is None:
        lines.append(f"loading time on a CPU: {NOT_MEASURED}")
    elif stats.loading_cpu_wait_fraction is None:
        lines.append(f"{head}: on a CPU {cpu:.0%}; waiting for a free core: {NOT_MEASURED}")
    else:
        lines.append(
            f"{head}: "
            + _parts(
                ("on a CPU", cpu),
                ("waiting for a free core", stats.loading_cpu_wait_fraction),
                ("waiting on something else", stats.loading_off_cpu_fraction),
            )
        )
    if stats.cores_job_fraction is None:
        lines.append(f"who used the cores: {NOT_MEASURED}")
    else:
        cores = f"the {stats.cores} usable core{'s' if stats.cores != 1 else ''}"
        lines.append(
            f"{cores} while passes ran: "
            + _parts(
                ("this job", stats.cores_job_fraction),
                ("other processes", stats.cores_others_fraction),
                ("idle", stats.cores_idle_fraction),
            )
        )
    return lines


def worker_lines(stats: LoaderFigures) -> list[str]:
    """A line per node and (up to ``MAX_WORKER_LINES``) per worker; none with one worker on one node."""
    if len(stats.workers) <= 1 and len(stats.nodes) <= 1:
        return []
    lines = [
        f"node {node.node}: {len(node.worker_ids)} worker{'s' if len(node.worker_ids) != 1 else ''}, "
        f"{node.batches:,} batches, busy {node.busy_fraction:.0%} (their mean)"
        for node in stats.nodes
    ]
    if len(stats.workers) <= MAX_WORKER_LINES:
        for worker in stats.workers:
            where = f"pid {worker.pid}, {worker.node}" if worker.pid is not None else worker.node
            lines.append(
                f"  worker {worker.worker_id} ({where}): {worker.batches:,} batches, busy {worker.busy_fraction:.0%}"
            )
    return lines


def _compute_share(stats: LoaderFigures) -> Optional[float]:
    if stats.wall_s <= 0:
        return None
    return max(0.0, 1.0 - stats.data_wait_fraction)


def _headline(stats: LoaderFigures) -> str:
    first = f"{stats.first_batch_s:.2f} s" if stats.first_batch_s is not None else "-"
    return (
        f"conveyor: {stats.batches:,} batches, {stats.samples:,} samples in {stats.wall_s:.2f} s "
        f"({stats.samples_per_s:,.0f} samples/s, {stats.batches_per_s:,.1f} batches/s); first batch {first}; "
        f"{stats.num_workers} worker{'s' if stats.num_workers != 1 else ''}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:8.2f}"


def text_table(stats: LoaderFigures) -> str:
    """The headline, the stage table, and the lines of shares."""
    lines = [_headline(stats), f"  {'stage':<10}{'total s':>10}{'share':>8}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}"]
    for name in STAGES:
        stage = stats.stages[name]
        lines.append(
            f"  {name:<10}{stage.total_s:10.3f} {_share_column(stats, name):>7}"
            f"{_ms(stage.p50_s)} {_ms(stage.p90_s)} {_ms(stage.p99_s)}"
        )
    lines += [f"  {line}" for line in share_lines(stats) + worker_lines(stats)]
    lines.append("  (stage shares: loading stages of the loading time; wait and compute of wall time)")
    if stats.mix is not None:
        title = f"mix sources over the latest pass's {stats.mix.position} samples delivered:"
        lines += [f"  {line}" for line in stats.mix.table(title).splitlines()]
    return "\n".join(lines)


def html_table(stats: LoaderFigures) -> str:
    """The same as :func:`text_table` and the verdict, as an HTML fragment."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{name}</td><td>{stage.total_s:.3f}</td><td>{_share_column(stats, name)}</td>"
        f"<td>{stage.p50_s * 1e3:.2f}</td><td>{stage.p90_s * 1e3:.2f}</td><td>{stage.p99_s * 1e3:.2f}</td></tr>"
        for name, stage in ((name, stats.stages[name]) for name in STAGES)
    )
    head = "".join(f"<th>{name}</th>" for name in ("stage", "total s", "share", "p50 ms", "p90 ms", "p99 ms"))
    shares = "".join(f"<li>{e(line.strip())}</li>" for line in share_lines(stats) + worker_lines(stats))
    verdict = "".join(f"<p>{e(line)}</p>" for line in str(judge(stats)).splitlines())
    return (
        f'<div class="conveyor-stats"><p><b>{e(_headline(stats))}</b></p>'
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
        f"<ul>{shares}</ul>{verdict}</div>"
    )
