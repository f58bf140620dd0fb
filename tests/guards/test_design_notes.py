"""The resume design note (docs/architecture.md, "Resume mechanisms") and the
code agree: every site the note names for mechanism N exists, and its
docstring or a comment on its lines names "resume mechanism N", so a reader
of either finds the other, and renaming a site without the note fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "conveyor"
NOTE = ROOT / "docs" / "architecture.md"


def mechanisms() -> dict[int, list[str]]:
    """Mechanism number -> the sites its "Code:" line names (path::qualified.name)."""
    text = NOTE.read_text()
    section = text.split("### Resume mechanisms", 1)[1].split("\n## ", 1)[0]
    found: dict[int, list[str]] = {}
    for match in re.finditer(r"^(\d+)\. \*\*(.+?)(?=^\d+\. \*\*|\Z)", section, re.M | re.S):
        number, body = int(match.group(1)), match.group(2)
        code = re.search(r"Code: (.+?)\.\n", body, re.S)
        assert code, f"mechanism {number} names no code site"
        found[number] = re.findall(r"`([\w/.]+\.py::[\w.]+)`", code.group(1))
    return found


def definition(path: Path, qualname: str) -> tuple[ast.AST, str]:
    """The class or function ``qualname`` in ``path`` and the file's text."""
    text = path.read_text()
    node: ast.AST = ast.parse(text)
    for part in qualname.split("."):
        node = next(
            child
            for child in ast.iter_child_nodes(node)
            if isinstance(child, (ast.ClassDef, ast.FunctionDef)) and child.name == part
        )
    return node, text


def test_the_note_names_four_mechanisms_each_with_its_code():
    found = mechanisms()
    assert sorted(found) == [1, 2, 3, 4]
    assert all(found.values()), found


def test_every_site_the_note_names_exists_and_names_its_mechanism():
    for number, sites in mechanisms().items():
        for site in sites:
            relative, qualname = site.split("::")
            path = SRC / relative
            assert path.is_file(), f"mechanism {number}: {relative} does not exist"
            node, text = definition(path, qualname)
            lines = text.splitlines()[node.lineno - 1 : node.end_lineno]
            words = " ".join(" ".join(lines).replace("#", " ").split()).lower()
            named = f"resume mechanism {number}" in words
            assert named, f"{site} does not say it is resume mechanism {number}"


def test_a_site_that_names_a_mechanism_is_in_the_note():
    """The other way round: code that says "resume mechanism N" is where the note says N lives."""
    named_in_note = {number: {site.split("::")[0] for site in sites} for number, sites in mechanisms().items()}
    for path in SRC.rglob("*.py"):
        words = " ".join(path.read_text().replace("#", " ").split())
        for number in map(int, re.findall(r"resume mechanism (\d)", words, re.I)):
            relative = path.relative_to(SRC).as_posix()
            assert number in named_in_note, f"{relative} names resume mechanism {number}, which the note has not"
            assert relative in named_in_note[number] or any(
                f"`{relative}" in line for line in NOTE.read_text().splitlines()
            ), f"{relative} names resume mechanism {number}, but the note does not name that file"
