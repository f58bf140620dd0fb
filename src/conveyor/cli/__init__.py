"""Command line: ``conveyor demo`` (and, later, bench, doctor, tune)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``conveyor`` command."""
    parser = argparse.ArgumentParser(prog="conveyor", description="conveyor: a data loader for training loops")
    commands = parser.add_subparsers(dest="command", required=True)
    from . import demo

    demo.add_arguments(commands.add_parser("demo", help=demo.__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo.run(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
