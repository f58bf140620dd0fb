"""``conveyor demo``: both loaders run the same pipeline on the same folder,
and the report holds what a user reads off it (samples/s side by side,
conveyor's stats and verdict, a PNG over time), as JSON or as text.

A tiny synthetic folder keeps each run to a few batches; the tests check
what is reported, never how fast anything was.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from conveyor.cli import main
from conveyor.cli.demo import RunResult, Span, make_synthetic_images, write_plot

pytestmark = pytest.mark.timeout(180)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: 2 classes × 12 images of 48 px, cropped to 32 px, in batches of 8: 3 batches an epoch.
SMALL = ["--epochs", "1", "--batch-size", "8", "--crop", "32", "--workers", "2"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_synthetic_images(tmp_path_factory.mktemp("demo") / "images", classes=2, per_class=12, size=48)


@pytest.fixture(scope="module", autouse=True)
def matplotlib_fonts_open(tmp_path_factory):
    """matplotlib keeps the font files it has drawn with open for the life of
    the process, on purpose (matplotlib/matplotlib#22017); drawing a plot
    once before the tests makes those files part of what was there before."""
    if importlib.util.find_spec("matplotlib") is not None:
        run = RunResult("warm-up", 0.1, Span(0.0, 1.0, 8, 0.5), (Span(0.0, 1.0, 8, 0.5),))
        write_plot([run], tmp_path_factory.mktemp("fonts") / "warm-up.png", "warm-up")


@pytest.fixture
def no_tqdm_monitor(monkeypatch):
    """tqdm's monitor thread would outlive the test (conftest counts threads)."""
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)


def _demo_json(capsys, *argv: str) -> dict:
    assert main(["demo", "--json", *SMALL, *argv]) == 0
    out, err = capsys.readouterr()
    assert "samples/s" not in err  # no bars in JSON mode
    return json.loads(out)


def test_json_reports_both_loaders_stats_verdict_and_a_png(folder, tmp_path, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    plot = tmp_path / "p.png"
    report = _demo_json(capsys, "--data", str(folder), "--plot", str(plot))

    for side, loader in (("conveyor", "conveyor.torch"), ("torch", "torch.utils.data")):
        run = report[side]
        assert run["loader"] == loader
        assert run["samples"] == 24 and run["samples_per_s"] > 0
        assert run["windows"] and sum(w["samples"] for w in run["windows"]) == 24
    assert report["speedup"] > 0
    stats = report["stats"]
    assert stats["samples"] == 24 and stats["stages"]["fetch"]["total_s"] > 0
    assert report["verdict"].startswith("verdict:")
    assert report["plot"] == str(plot)
    assert plot.read_bytes().startswith(PNG_MAGIC)


def test_no_plot_writes_no_png(folder, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = _demo_json(capsys, "--data", str(folder), "--no-plot")
    assert report["plot"] is None
    assert list(tmp_path.iterdir()) == []


def test_text_shows_bars_summary_verdict_and_the_comparison(folder, tmp_path, capsys, no_tqdm_monitor):
    pytest.importorskip("torch")
    plot = tmp_path / "p.png"
    assert main(["demo", *SMALL, "--data", str(folder), "--plot", str(plot)]) == 0
    out, err = capsys.readouterr()
    assert "conveyor: 100%" in err and "torch: 100%" in err  # one bar per loader and epoch
    assert "loader.stats().summary()" in out and "fetch" in out
    assert "verdict:" in out and "advice:" in out
    assert "samples/s" in out
    assert "conveyor.torch" in out and "torch.utils.data" in out
    assert f"plot: {plot}" in out


def test_without_torch_conveyor_runs_alone(folder, capsys, monkeypatch):
    for name in ("torch", "conveyor.torch"):
        monkeypatch.setitem(sys.modules, name, None)  # `import torch` now raises ImportError
    report = _demo_json(capsys, "--data", str(folder), "--no-plot")
    assert report["conveyor"]["loader"] == "conveyor" and report["conveyor"]["samples_per_s"] > 0
    assert report["torch"] is None and report["speedup"] is None
