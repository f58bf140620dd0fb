"""``summary()`` shows the stats once: in a script, in a REPL (the returned
value adds nothing) and in a notebook (which shows ``loader.stats()`` as
HTML through the IPython display protocol)."""

from __future__ import annotations

import code
import contextlib
import html
import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import conveyor
from conveyor.stats import STAGES

TESTS = Path(__file__).parent

SETUP = textwrap.dedent(
    """\
    import conveyor
    loader = conveyor.DataLoader(list(range(40)), batch_size=4)
    for batch in loader:
        pass
    stats = loader.stats()
    """
)


def _stats():
    loader = conveyor.DataLoader(list(range(40)), batch_size=4)
    for _ in loader:
        pass
    return loader.stats()


def test_summary_prints_the_table_and_verdict_and_returns_nothing():
    stats = _stats()
    out = io.StringIO()
    assert stats.summary(file=out) is None
    assert out.getvalue() == f"{stats}\n" == f"{stats.table()}\n{stats.verdict()}\n"
    assert out.getvalue().count("verdict:") == 1 and out.getvalue().count("advice:") == 1


def test_a_repl_shows_the_summary_once():
    interpreter = code.InteractiveInterpreter()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        interpreter.runcode(compile(SETUP, "<setup>", "exec"))
        assert interpreter.runsource("stats.summary()", "<console>", "single") is False
    text = out.getvalue()
    assert text.count("verdict:") == 1 and text.count("advice:") == 1 and text.count("conveyor:") == 1
    advice = interpreter.locals["stats"].verdict().advice
    assert text.count(advice) == 1 and "Verdict(" not in text


@pytest.mark.timeout(60)
def test_python_i_shows_the_summary_once():
    # A real interactive interpreter: each line is compiled in "single"
    # mode and any value but None is echoed by sys.displayhook.
    session = SETUP.replace("    pass\n", "    pass\n\n") + "stats.summary()\nstats.batches * 1001\n"
    done = subprocess.run(
        [sys.executable, "-i", "-q"], input=session, capture_output=True, text=True, timeout=50, cwd=TESTS
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("verdict:") == 1 and done.stdout.count("advice:") == 1
    assert "Verdict(" not in done.stdout
    assert done.stdout.endswith("\n10010\n")  # (the echo works: this value was shown)


def test_a_notebook_shows_the_stats_as_html_with_the_verdict_once():
    stats = _stats()
    # IPython asks an object for _repr_html_ (Jupyter shows it) and falls
    # back to repr; summary() returns None, for which it shows nothing.
    page = stats._repr_html_()
    assert page.startswith("<div") and page.endswith("</div>")
    assert page.count("<table>") == 1 and all(f"<td>{name}</td>" for name in STAGES)
    assert all(f"<td>{name}</td>" in page for name in STAGES)
    assert page.count("verdict: ") == 1 and page.count("advice: ") == 1
    assert html.escape(stats.table().splitlines()[0]) in page


def test_print_of_the_stats_is_the_summary_text():
    stats = _stats()
    out = io.StringIO()
    print(stats, file=out)
    summary = io.StringIO()
    stats.summary(file=summary)
    assert out.getvalue() == summary.getvalue()
