"""``python -m hookwrap demo`` runs the example training loop; ``python -m hookwrap
bench`` prints the dispatch overhead as ratios to a bare method call."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hookwrap", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="run a small training loop extended with callbacks")
    bench = commands.add_parser("bench", help="print hook overhead as ratios to a bare method call")
    bench.add_argument("--number", type=int, default=20000, help="calls per timing (default 20000)")
    bench.add_argument("--step", action="store_true",
                       help="also measure the share of a torch training step (needs the torch extra)")
    bench.add_argument("--current-only", action="store_true",
                       help="only the implementation in use, in this process")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        run()
        return 0
    from .bench import main as bench_main

    return bench_main(number=args.number, both=not args.current_only, step=args.step)


if __name__ == "__main__":
    sys.exit(main())
