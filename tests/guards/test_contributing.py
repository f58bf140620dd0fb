"""CONTRIBUTING.md and CHANGELOG.md say only what is true of this repository.

This file checks:

- every repository path in CONTRIBUTING.md's code (in backticks or in a
  block) exists, and so does every package in its layout;
- every `make` target that it names is a target of the Makefile;
- every link in either file leads to a file that exists, and to a heading
  in it when the link has an anchor;
- CHANGELOG.md's table of state format versions has a row for the versions
  that conveyor writes today;
- neither file quotes a measurement: figures belong in the docs, between
  markers (tests/guards/test_docs_figures.py).

The test reads files and saves two states. It runs no benchmark and no
worker.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import conveyor

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
CHANGELOG = ROOT / "CHANGELOG.md"

#: The first part of a path that names something in this repository.
ROOTS = ("src/", "tests/", "docs/", "bench/", "examples/")
#: Files at the top of the repository that the pages may name.
TOP_FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "Makefile", "pyproject.toml")


_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
_INLINE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return _FENCE.sub("", text)


def inline_code(text: str) -> list[str]:
    """The contents of each inline code span outside fenced blocks."""
    return _INLINE.findall(prose(text))


def repository_paths(text: str) -> list[str]:
    """Each word of a code span or block that names a path in this
    repository: under one of ``ROOTS``, or a top-level file (a glob such as
    ``docs/*.md`` must match one). A suffix such as ``::name`` or
    ``#anchor`` is dropped."""
    found = []
    for span in inline_code(text) + _FENCE.findall(text):
        for word in span.split():
            word = re.split(r"::|#", word)[0].rstrip(".,:;)\\")
            if word.startswith(ROOTS) or word in TOP_FILES:
                found.append(word)
    return found


def make_targets() -> set[str]:
    """The targets the Makefile defines."""
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.MULTILINE))


def named_targets(text: str) -> set[str]:
    """The make targets that the page's code names (``make X``), in fenced
    blocks and in inline spans."""
    code = "\n".join(_FENCE.findall(text) + inline_code(text))
    return set(re.findall(r"\bmake\s+([a-z][\w-]*)", code))


def layout_packages(text: str) -> list[str]:
    """The packages (``name/``) of the layout block that starts with
    ``src/conveyor/``, as paths under the library, e.g. ``_engine/executor/``."""
    (block,) = [b for b in _FENCE.findall(text) if b.startswith("src/conveyor/\n")]
    packages, parent = [], ""
    for line in block.splitlines()[1:]:
        match = re.match(r"^( +)([\w.]+/)", line)
        if match is None:
            if not line.startswith(" "):
                break  # the library's block ends where tests/, bench/, ... begin
            continue
        depth = len(match[1])
        if depth == 2:
            parent = match[2]
            packages.append(parent)
        else:
            packages.append(parent + match[2])
    return packages


def slug(heading: str) -> str:
    """The anchor that GitHub gives a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def link_problems(page: Path) -> list[str]:
    """One line for each relative link of ``page`` whose file or heading is
    missing."""
    problems = []
    for target in _LINK.findall(prose(page.read_text())):
        if "://" in target or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path) if path else page
        if not file.exists():
            problems.append(f"{page.name}: link to {target}: no {path}")
        elif anchor:
            headings = re.findall(r"^#+ (.+)$", prose(file.read_text()), re.MULTILINE)
            if anchor not in {slug(h) for h in headings}:
                problems.append(f"{page.name}: link to {target}: {path or page.name} has no heading #{anchor}")
    return problems


def test_every_repository_path_that_contributing_names_exists():
    paths = repository_paths(CONTRIBUTING.read_text())
    assert len(paths) > 30, paths  # the parsing found the page's paths
    missing = sorted({p for p in paths if not (any(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())})
    assert not missing, f"CONTRIBUTING.md names paths that do not exist: {missing}"


def test_contributing_names_modules_by_their_path_from_the_root():
    partial = [
        word
        for span in inline_code(CONTRIBUTING.read_text())
        for word in span.split()
        if re.fullmatch(r"[\w.-]+(/[\w.-]+)+\.(py|md)", word) and not word.startswith(ROOTS)
    ]
    assert not partial, f"name these from the repository root (src/conveyor/...), so that they are checked: {partial}"


def test_every_package_of_the_layout_exists_or_is_being_formed():
    packages = layout_packages(CONTRIBUTING.read_text())
    assert "_engine/workers/" in packages and "sampler/" in packages, packages
    missing = [p for p in packages if not (ROOT / "src" / "conveyor" / p).is_dir()]
    assert not missing, f"CONTRIBUTING.md's layout names packages that are not in src/conveyor: {missing}"


def test_every_make_target_named_is_in_the_makefile():
    named = named_targets(CONTRIBUTING.read_text())
    assert {"demo", "test", "coverage", "bench"} <= named, named
    unknown = sorted(named - make_targets())
    assert not unknown, f"CONTRIBUTING.md names make targets the Makefile lacks: {unknown}"


def test_every_link_leads_to_a_file_and_heading_that_exist():
    problems = link_problems(CONTRIBUTING) + link_problems(CHANGELOG)
    assert not problems, "\n".join(problems)


def test_the_changelog_lists_the_state_versions_written_today():
    loader_version = conveyor.DataLoader(range(4)).state_dict()["version"]
    sampler_version = conveyor.RandomSampler(range(4), seed=0).state_dict()["version"]
    rows = [line for line in CHANGELOG.read_text().splitlines() if line.startswith("| ")]
    assert any(line.startswith(f"| DataLoader | {loader_version} |") for line in rows), (
        f"CHANGELOG.md's state format table has no row for DataLoader state version {loader_version}"
    )
    assert any(line.startswith(f"| samplers | {sampler_version} |") for line in rows), (
        f"CHANGELOG.md's state format table has no row for sampler state version {sampler_version}"
    )
    assert "docs/resume.md" in CHANGELOG.read_text()


def test_neither_page_quotes_a_measurement():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "bench" / "docs_figures.py")
    docs_figures = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(docs_figures)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    found = docs_figures.unmarked_figures(CONTRIBUTING) + docs_figures.unmarked_figures(CHANGELOG)
    assert not found, "measurements belong in the docs, generated from a results file:\n" + "\n".join(found)


def test_the_checks_find_what_is_wrong(tmp_path):
    page = tmp_path / "CONTRIBUTING.md"
    page.write_text(
        "Run `make tset` and read `src/conveyor/nothing_here.py::f`, `docs/architecture.md`.\n"
        "```\nsrc/conveyor/\n  sampler/   samplers\n  nowhere/   none\n  _engine/   engine\n"
        "    workers/ kinds\ntests/     tests\n```\n"
        "See [the map](architecture.md#no-such-heading) and [gone](gone.md).\n"
    )
    (tmp_path / "architecture.md").write_text("# How conveyor is built: a contributor's map\n")
    text = page.read_text()
    assert repository_paths(text) == ["src/conveyor/nothing_here.py", "docs/architecture.md", "src/conveyor/", "tests/"]
    assert named_targets(text) == {"tset"}
    assert layout_packages(text) == ["sampler/", "nowhere/", "_engine/", "_engine/workers/"]
    assert slug("How conveyor is built: a contributor's map") == "how-conveyor-is-built-a-contributors-map"
    assert slug("What `state_dict()` describes") == "what-state_dict-describes"
    problems = link_problems(page)
    assert len(problems) == 2 and "#no-such-heading" in problems[0] and "no gone.md" in problems[1], problems
