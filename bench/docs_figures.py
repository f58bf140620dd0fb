"""The figures the docs quote, from one source: bench/results-latest.json.

    python bench/docs_figures.py            # rewrite them in README.md and docs/*.md
    python bench/docs_figures.py --check    # list those that disagree; exit 1 if any

A figure in a doc sits between two HTML comments that name it; rendered
Markdown shows only the figure:

    stats cost <!-- bench:h.cost -->6.1%<!-- /bench --> of the batches/s

A generated table is the same, its comments on lines of their own:

    <!-- bench:table.loaders -->

    | workload | conveyor | ... |

    <!-- /bench -->

``bench:`` figures come from the results file; each other benchmark's from
its own results file (``SOURCES``: ``images:`` from bench/results-images.json,
written by bench/images.py, ``ray:``, ``order:``, ``locality:``, ``mix:``);
``repo:`` ones from other
files of this repository (the development extras in pyproject.toml, an
example's defaults), so that the docs cannot drift from those either. An
inline figure must not begin a line: Markdown would take the comment for
the start of an HTML block. tests/guards/test_docs_figures.py runs the check.
After a benchmark run, copy its JSON to bench/results-latest.json and run
this script; `git diff` then shows every figure that moved.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))

from figures import BENCH, REPO, Results  # noqa: E402  (bench/figures.py: what each figure is)
from image_figures import IMAGES  # noqa: E402  (bench/image_figures.py: bench/images.py's figures)
from locality_figures import LOCALITY  # noqa: E402  (bench/locality_figures.py: bench/locality.py's figures)
from mix_figures import MIX  # noqa: E402  (bench/mix_figures.py: bench/mix.py's figures)
from order_figures import ORDER  # noqa: E402  (bench/order_figures.py: bench/scale_order.py's figures)
from ray_figures import RAY  # noqa: E402  (bench/ray_figures.py: bench/ray_workers.py's figures)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results-latest.json"


class Source(NamedTuple):
    """A benchmark's figures: what each is (name -> function of its results), its results file, its script."""

    figures: dict[str, Callable[[Any], str]]
    results: Path
    script: str


#: The benchmarks other than bench/run.py whose figures the docs quote, by marker name.
SOURCES = {
    "images": Source(IMAGES, ROOT / "bench" / "results-images.json", "bench/images.py"),
    "ray": Source(RAY, ROOT / "bench" / "results-ray-workers.json", "bench/ray_workers.py"),
    "order": Source(ORDER, ROOT / "bench" / "results-scale-order.json", "bench/scale_order.py"),
    "locality": Source(LOCALITY, ROOT / "bench" / "results-locality.json", "bench/locality.py"),
    "mix": Source(MIX, ROOT / "bench" / "results-mix.json", "bench/mix.py"),
}

#: A figure: <!-- bench:NAME -->text<!-- /bench --> (or repo:, or a name of SOURCES), on one line or a block of lines.
MARKER = re.compile(rf"<!-- (bench|repo|{'|'.join(SOURCES)}):([\w.-]+) -->(.*?)<!-- /\1 -->", re.DOTALL)


def doc_paths(root: Path = ROOT) -> list[Path]:
    """The docs that may quote figures: README.md and docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


# ------------------------------------------------------------- rewriting and checking
class Figures:
    """What each marker should hold, from the results and the repository."""

    def __init__(self, results: dict, root: Path = ROOT):
        self.results, self.root = Results(results), root
        self.other = {
            name: load_results(source.results) if source.results.exists() else None for name, source in SOURCES.items()
        }

    def value(self, source: str, name: str) -> str:
        table = {"bench": BENCH, "repo": REPO, **{k: s.figures for k, s in SOURCES.items()}}[source]
        if name not in table:
            raise KeyError(f"no {source} figure named {name!r} (bench/docs_figures.py knows {sorted(table)})")
        if source in SOURCES:
            results = self.other[source]
            if results is None:
                where = SOURCES[source]
                raise KeyError(f"no {where.results.name} to take {source}:{name} from (run {where.script})")
            return table[name](results)
        return table[name](self.results if source == "bench" else self.root)

    def render(self, source: str, name: str, old: str) -> str:
        """The marker's new content: a block (a marker whose content starts
        on a line of its own) between blank lines, which every Markdown
        renderer reads as a table apart from the comments; an inline figure
        stays inline."""
        value = self.value(source, name)
        return f"\n\n{value}\n\n" if old.startswith("\n") else value


def rewrite(text: str, figures: Figures) -> str:
    """``text`` with every marker's content generated anew."""
    return MARKER.sub(lambda m: f"<!-- {m[1]}:{m[2]} -->{figures.render(m[1], m[2], m[3])}<!-- /{m[1]} -->", text)


def problems(path: Path, figures: Figures) -> list[str]:
    """One line per marker in ``path`` that is unknown, out of date or
    placed where Markdown would not render it inline."""
    text, found = path.read_text(), []
    for m in MARKER.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"{path.relative_to(figures.root)}:{line}: {m[1]}:{m[2]}"
        block = m[3].startswith("\n")
        if not block and text[text.rfind("\n", 0, m.start()) + 1 : m.start()].strip() == "":
            found.append(f"{where}: an inline figure must not begin a line (Markdown would read an HTML block)")
        try:
            expected = figures.render(m[1], m[2], m[3])
        except (KeyError, LookupError) as error:
            found.append(f"{where}: {error}")
            continue
        if m[3] != expected:
            found.append(f"{where}: {_difference(m[3], expected)}")
    return found


def _difference(said: str, expected: str) -> str:
    """What differs, briefly: the figure, or a block's first differing line."""
    if said.strip() == expected.strip():
        return "only the blank lines around the block differ"
    if "\n" not in expected.strip():
        return f"the doc says {said!r}, the source says {expected!r}"
    pairs = zip(said.strip().splitlines() + [""] * 99, expected.strip().splitlines())
    doc_line, source_line = next((a, b) for a, b in pairs if a != b)
    return f"the doc has {doc_line!r} where the source has {source_line!r}"


#: Numbers that read as measurements: a ratio (4.6×) or a rate or time per batch.
#: (A × between two numbers is a size, 375 × 500 or 64×3×224, not a ratio.)
LOOKS_MEASURED = re.compile(r"(?<![\d×]\s)(?<![\d×])\d[\d,.]*\s?(?:×(?!\s?\d)|(?:samples|batches)/s\b|µs\b|[GM]B/s\b)")
_CODE_BLOCK = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)

#: Phrases whose numbers look measured but are not, each with what it is.
NOT_MEASURED = {"p99 is 10× p50": "the verdict's rule for slow samples (docs/stats.md): a threshold"}


def unmarked_figures(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line: text`` for each number in ``path`` that reads as a
    measurement but is not a generated figure (outside code blocks, which
    show a program's output)."""
    text = path.read_text()
    blanked = MARKER.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), text)
    blanked = _CODE_BLOCK.sub(lambda m: re.sub(r"[^\n]", " ", m[0]), blanked)
    for phrase in NOT_MEASURED:
        blanked = blanked.replace(phrase, " " * len(phrase))
    return [
        f"{path.relative_to(root)}:{blanked.count(chr(10), 0, m.start()) + 1}: {m[0]}"
        for m in LOOKS_MEASURED.finditer(blanked)
    ]


def load_results(path: Path = RESULTS) -> dict:
    with open(path) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; list the figures that disagree, exit 1 if any"
    )
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help="the results file (default bench/results-latest.json)"
    )
    args = parser.parse_args(argv)
    figures = Figures(load_results(args.results))
    if args.check:
        found = [line for path in doc_paths() for line in problems(path, figures) + unmarked_figures(path)]
        print("\n".join(found) if found else "every figure agrees with its source")
        return 1 if found else 0
    for path in doc_paths():
        text = path.read_text()
        new = rewrite(text, figures)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
