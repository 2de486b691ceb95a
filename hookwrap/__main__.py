"""``python -m hookwrap demo``: run the example training loop."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hookwrap", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run a small training loop extended with callbacks")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
