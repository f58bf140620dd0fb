"""No module of conveyor over about 400 lines: each module is one concept a
reader can hold at once, and a module that outgrows that is split where its
concepts part (DESIGN.md's layout; issue 22). The few modules allowed over
the limit are listed in ALLOWED, each with the most lines it may have and why.
"""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"

#: The most lines a module of src/conveyor may have.
MAX_LINES = 400

#: Modules allowed over MAX_LINES, by path under src/conveyor: (the most lines it may have, why).
#: An entry is removed once its module is back under the limit.
ALLOWED: dict[str, tuple[int, str]] = {}


def line_counts(root: Path = SRC) -> dict[str, int]:
    """Lines of every module under ``root``, by path relative to it."""
    return {
        path.relative_to(root).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }


def over_the_limit(counts: dict[str, int], allowed: dict[str, tuple[int, str]] = ALLOWED) -> list[str]:
    """One line per module over its limit: its path, its lines, its limit."""
    found = []
    for path, lines in sorted(counts.items()):
        limit, why = allowed.get(path, (MAX_LINES, ""))
        if lines > limit:
            found.append(f"  src/conveyor/{path}: {lines} lines (limit {limit}{'; allowed: ' + why if why else ''})")
    return found


def test_no_module_is_over_the_limit():
    found = over_the_limit(line_counts())
    assert not found, (
        f"{len(found)} module(s) over {MAX_LINES} lines; split each where its concepts part (re-export public "
        "names from where they were, and import no module in a circle):\n" + "\n".join(found)
    )


def test_every_allowed_module_exists_and_still_needs_its_place():
    counts = line_counts()
    for path, (limit, why) in ALLOWED.items():
        assert why, f"{path}: say why it may be over {MAX_LINES} lines"
        assert path in counts, f"{path} is allowed over {MAX_LINES} lines but no longer exists: remove it from ALLOWED"
        assert counts[path] > MAX_LINES, (
            f"{path} has {counts[path]} lines, within {MAX_LINES}: remove it from ALLOWED so that it stays there"
        )


def test_the_check_names_each_module_over_its_limit_with_its_lines(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "small.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pkg" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "allowed.py").write_text("x = 1\n" * (MAX_LINES + 5))
    counts = line_counts(tmp_path)
    assert counts == {"allowed.py": MAX_LINES + 5, "pkg/big.py": MAX_LINES + 1, "small.py": MAX_LINES}
    assert over_the_limit(counts, {"allowed.py": (MAX_LINES + 5, "being split")}) == [
        f"  src/conveyor/pkg/big.py: {MAX_LINES + 1} lines (limit {MAX_LINES})"
    ]
    assert over_the_limit(counts, {"allowed.py": (MAX_LINES + 4, "being split")}) == [
        f"  src/conveyor/allowed.py: {MAX_LINES + 5} lines (limit {MAX_LINES + 4}; allowed: being split)",
        f"  src/conveyor/pkg/big.py: {MAX_LINES + 1} lines (limit {MAX_LINES})",
    ]
