"""Command line: ``conveyor demo | doctor | tune | pack``.

Each command is a module of this package with ``add_arguments(parser)`` and
``run(args) -> int`` (the exit status); its docstring's first line is its help.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

#: Command name -> module of this package.
COMMANDS = {
    "demo": "demo",
    "doctor": "doctor",
    "tune": "tune",
    "pack": "pack",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``conveyor`` command."""
    parser = argparse.ArgumentParser(prog="conveyor", description="conveyor: a data loader for training loops")
    commands = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        module.add_arguments(commands.add_parser(name, help=module.__doc__.splitlines()[0], description=module.__doc__))
        modules[name] = module
    args = parser.parse_args(argv)
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
