"""The wheel users install holds every module and the PEP 561 marker
(``py.typed``), so their type checker reads conveyor's annotations."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_the_wheel_holds_every_module_and_the_type_marker(tmp_path):
    source = tmp_path / "source"  # (a copy: building writes build/ and egg-info beside the sources)
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            "-q",
        ],
        check=True,
        cwd=tmp_path,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("conveyor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "conveyor/py.typed" in names
    sources = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src" / "conveyor").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
