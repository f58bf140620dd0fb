"""Every example in the user docs that says it runs, runs: the ```python
blocks of each page below are executed in order in one namespace (a page
reads as one session), as a reader would paste them. A block whose fence
says more than ``python`` (```python not-run: needs JAX```) is shown, not
run, and must say why."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: Pages whose every plain ```python block must run.
PAGES = ["text.md", "numpy.md", "scale.md"]

_BLOCK = re.compile(r"^```python([^\n]*)\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks(page: str) -> list[tuple[int, str, str]]:
    """(line, what the fence says after "python", code) of each python block."""
    text = (DOCS / page).read_text()
    return [(text.count("\n", 0, m.start()) + 1, m[1].strip(), m[2]) for m in _BLOCK.finditer(text)]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("page", PAGES)
def test_every_python_example_on_the_page_runs(page, capsys):
    namespace: dict = {"__name__": f"docs_{page.replace('.', '_')}"}
    ran = 0
    for line, note, code in blocks(page):
        if note:
            assert note.startswith("not-run:") and len(note) > len("not-run:"), (
                f"docs/{page}:{line}: a block that is not run says why (```python not-run: <why>)"
            )
            continue
        try:
            exec(compile("\n" * line + code, f"docs/{page}", "exec"), namespace)  # line numbers as on the page
        except Exception as error:
            raise AssertionError(f"the example at docs/{page}:{line} fails: {error!r}") from error
        ran += 1
    assert ran >= 3, f"docs/{page} has only {ran} runnable examples"
    namespace.clear()  # drop the examples' loaders now, so their workers end within the test
