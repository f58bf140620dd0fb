"""Command line: ``conveyor demo | doctor | tune | pack``.

Each command is a module of this package with ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); its docstring is its ``--help`` (the
first line the summary in ``conveyor --help``), so it is written for users,
paragraphs kept as they are, reST markup left out when printed.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from typing import Optional, Sequence

#: Command name -> module of this package.
COMMANDS = {"demo": "demo", "doctor": "doctor", "tune": "tune", "pack": "pack"}


_MARKUP = re.compile(r"``(.+?)``|:\w+:`(.+?)`")


def _plain(text: str) -> str:
    """A docstring as help text: ``code`` and :role:`name` printed bare."""
    return _MARKUP.sub(lambda m: m.group(1) or m.group(2), text)


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``conveyor`` parser, and each command's parser by name (each
    command's module is imported here)."""
    parser = argparse.ArgumentParser(
        prog="conveyor",
        description="conveyor: a data loader for training loops, with the API of torch.utils.data.",
        epilog="Run 'conveyor COMMAND --help' for what a command does and its options.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parsers = {}
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        text = _plain(module.__doc__ or "")
        parsers[name] = commands.add_parser(
            name, help=text.splitlines()[0], description=text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(parsers[name])
    return parser, parsers


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``conveyor`` command."""
    parser, _ = build_parser()
    args = parser.parse_args(argv)
    return importlib.import_module(f"{__name__}.{COMMANDS[args.command]}").run(args)


if __name__ == "__main__":
    sys.exit(main())
