"""The docs quote the benchmarks from one source, bench/results-latest.json:
every figure in README.md and docs/*.md is what bench/docs_figures.py
generates from that file (or from pyproject.toml and the examples), and no
doc quotes a measurement outside such a figure. Reads files only: no
benchmark runs, no network."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_figures = _load("docs_figures")
DOCS = docs_figures.doc_paths()
DOC_IDS = [str(path.relative_to(ROOT)) for path in DOCS]


@pytest.fixture(scope="module")
def figures():
    return docs_figures.Figures(docs_figures.load_results())


def quoted(path: Path, name: str) -> list[str]:
    """The contents of every ``bench:`` marker named ``name`` in ``path``."""
    return [m[3] for m in docs_figures.MARKER.finditer(path.read_text()) if m[2] == name]


@pytest.mark.parametrize("path", DOCS, ids=DOC_IDS)
def test_every_figure_in_a_doc_is_what_its_source_gives(path, figures):
    problems = docs_figures.problems(path, figures)
    assert not problems, "run `python bench/docs_figures.py` (or fix the marker):\n" + "\n".join(problems)


@pytest.mark.parametrize("path", DOCS, ids=DOC_IDS)
def test_no_doc_quotes_a_measurement_outside_a_generated_figure(path):
    found = docs_figures.unmarked_figures(path)
    assert not found, (
        "quote these through a <!-- bench:NAME --> marker (bench/figures.py), or, if they are not "
        "measurements, add the phrase to NOT_MEASURED in bench/docs_figures.py:\n" + "\n".join(found)
    )


def test_the_cost_of_stats_is_one_figure_wherever_it_is_quoted(figures):
    cost = figures.value("bench", "h.cost")
    for name in ("README.md", "docs/stats.md", "docs/differences.md"):
        assert quoted(ROOT / name, "h.cost") == [cost], name


def test_bench_i_is_the_same_in_the_readme_table_and_docs_distributed(figures):
    ratio = figures.value("bench", "i.ratio")
    assert quoted(ROOT / "docs" / "distributed.md", "i.ratio") == [ratio]
    (table,) = quoted(ROOT / "README.md", "table.loaders")
    (row,) = [line for line in table.splitlines() if line.startswith("| (i) ")]
    assert row.endswith(f"| {ratio} |"), row


def test_the_readme_lists_every_development_extra_and_the_example_s_real_step():
    readme = ROOT / "README.md"
    assert quoted(readme, "dev-extras"), "the README's list of development extras is not generated"
    assert quoted(readme, "images.step-ms"), "the README does not quote examples/images.py's --step-ms default"
    text = readme.read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(ROOT / "pyproject.toml", "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]["dev"]
    assert all(f"`{requirement}`" in text for requirement in extras)


def test_a_doc_that_disagrees_with_the_results_is_reported_and_rewritten(tmp_path, figures):
    cost = figures.value("bench", "h.cost")
    doc = tmp_path / "README.md"
    doc.write_text(
        "Stats cost <!-- bench:h.cost -->0.4%<!-- /bench --> of the batches/s.\n"
        "<!-- bench:h.cost -->0.4%<!-- /bench --> at the start of a line.\n"
        "A figure nobody defined: <!-- bench:no.such -->1×<!-- /bench -->.\n"
        "<!-- bench:table.stats -->\n| stale |\n<!-- /bench -->\n"
    )
    local = docs_figures.Figures(docs_figures.load_results(), root=tmp_path)
    problems = docs_figures.problems(doc, local)
    assert any(f"the doc says '0.4%', the source says '{cost}'" in line for line in problems), problems
    assert any("README.md:2:" in line and "must not begin a line" in line for line in problems), problems
    assert any("no bench figure named 'no.such'" in line for line in problems), problems
    assert any("bench:table.stats" in line and "'| stale |'" in line for line in problems), problems
    fixed = docs_figures.rewrite(doc.read_text().replace("no.such", "h.cost"), local)
    assert fixed.count(f"-->{cost}<!--") == 3
    assert "| stale |" not in fixed and "| batches/s (median of each round's on/off" in fixed


def test_a_measurement_typed_into_a_doc_by_hand_is_found(tmp_path):
    doc = tmp_path / "notes.md"
    doc.write_text(
        "Throughput went up 2.2× to 1,210 batches/s, 58 µs a batch.\n"
        "Sizes are not ratios: 375 × 500 pixels, batches of 64×3×224×224.\n"
        "```\n4.6× inside a code block is a program's output\n```\n"
        "Generated: <!-- bench:i.ratio -->2.7×<!-- /bench -->.\n"
    )
    found = docs_figures.unmarked_figures(doc, root=tmp_path)
    assert found == ["notes.md:1: 2.2×", "notes.md:1: 1,210 batches/s", "notes.md:1: 58 µs"]
