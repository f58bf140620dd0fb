"""src/conveyor type-checks with no errors: mypy, at the strictness that
[tool.mypy] in pyproject.toml states (close to --strict; the reasons for
what it leaves out are there). Runs mypy as `make test` runs pytest, with
this environment's Python; its cache (.mypy_cache) makes a second run take
seconds, a first one a few minutes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]

#: Modules whose own errors pyproject.toml's overrides leave out of the
#: report (ignore_errors): none; a module added here must say why.
RESHAPING: list[str] = []


@pytest.mark.timeout(600)
def test_src_type_checks_without_errors():
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed: pip install -e '.[dev]' (the development extras pin it)")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "src/conveyor"], cwd=ROOT, capture_output=True, text=True, timeout=580
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert done.returncode == 0, (
        f"mypy found {len(errors)} error(s) in src/conveyor (fix the code or its annotations; an ignore only where "
        f"the code is right and mypy cannot see it, with its error code and why):\n{done.stdout}{done.stderr}"
    )


def test_only_the_modules_being_reshaped_have_their_errors_ignored():
    with open(ROOT / "pyproject.toml", "rb") as f:
        overrides = tomllib.load(f)["tool"]["mypy"].get("overrides", [])
    ignored = []
    for override in overrides:
        if override.get("ignore_errors"):
            modules = override["module"]
            ignored += [modules] if isinstance(modules, str) else modules
    assert sorted(ignored) == sorted(RESHAPING), (
        "pyproject.toml's [tool.mypy] overrides ignore the errors of other modules than RESHAPING in "
        f"tests/guards/test_types.py: {sorted(set(ignored) ^ set(RESHAPING))}"
    )
