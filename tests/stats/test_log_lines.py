"""Log lines read well under the usual format, ``%(name)s: %(message)s``:
the logger's name (``conveyor``, or ``conveyor.<module>``) is the only
``conveyor:`` on the line."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import numpy as np
import pytest

import conveyor

SOURCE = Path(conveyor.__file__).resolve().parent
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


class TwoBad:
    """Samples 2 and 5 raise OSError (a truncated file)."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i in (2, 5):
            raise OSError(f"truncated file for sample {i}")
        return np.array([i])


@pytest.fixture
def formatted_lines():
    """The lines the ``conveyor`` logger writes under ``%(name)s: %(message)s``."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logger = logging.getLogger("conveyor")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_skipped_sample_is_logged_with_one_conveyor_prefix(formatted_lines, num_workers):
    loader = conveyor.DataLoader(TwoBad(), batch_size=4, num_workers=num_workers, skip_bad_samples=2)
    assert [batch.ravel().tolist() for batch in loader] == [[0, 1, 3], [4, 6, 7]]
    assert len(formatted_lines) == 2, formatted_lines
    for line, index in zip(formatted_lines, (2, 5)):
        assert line.startswith(f"conveyor: skipped sample {index} of batch "), line
        assert line.count("conveyor:") == 1, line
        assert line.endswith(f"OSError: truncated file for sample {index}"), line


def _log_calls_starting_with_conveyor(path: Path) -> list[str]:
    """``<file>:<line>`` of each logging call in ``path`` whose message is a
    literal starting with "conveyor:" (``log.warning("conveyor: ...")``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
            continue
        if node.func.attr not in LOG_METHODS:
            continue
        message = node.args[1] if node.func.attr == "log" and len(node.args) > 1 else node.args[0]
        if isinstance(message, ast.JoinedStr) and message.values:
            message = message.values[0]
        if isinstance(message, ast.Constant) and isinstance(message.value, str):
            if message.value.lstrip().lower().startswith("conveyor:"):
                found.append(f"{path.relative_to(SOURCE)}:{node.lineno}")
    return found


def test_no_module_repeats_the_logger_name_in_its_messages():
    found = [hit for path in sorted(SOURCE.rglob("*.py")) for hit in _log_calls_starting_with_conveyor(path)]
    assert not found, f"messages on a conveyor logger need no 'conveyor:' of their own: {found}"
